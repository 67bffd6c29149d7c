// Package proxies owns what makes a proxy run: the StatefulSet, Secrets and RBAC of a standalone
// proxy or a ProxyGroup's replicas, their auth keys and tailnet devices, the ProxyClass an object
// asks for, and reading what a proxy reports in its state Secret. It decides nothing about
// Ingresses or Services; their reconcilers hand it the proxy they want.
package proxies

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// Proxies runs the standalone proxy machinery shared by the Ingress and Service reconcilers:
// it applies a proxy's children, reads back its state and tears it down.
type Proxies struct {
	client.Client
	API      client.Reader // uncached, to tell a new proxy from one the cache has not seen yet
	Settings kit.Settings
	Tailnet  tailnet.Client

	// reports parses what each standalone proxy reports.
	reports Reports

	// infoMu guards the cached tailnet settings, which change rarely and would otherwise cost
	// an API call per reconcile.
	infoMu     sync.Mutex
	info       tailnet.TailnetInfo
	infoExpiry time.Time
}

const tailnetInfoTTL = 5 * time.Minute

// TailnetInfo returns the tailnet's settings, cached. When the API cannot tell, it assumes
// certificates are available, so a flaky API raises no false alarm.
func (m *Proxies) TailnetInfo(ctx context.Context) tailnet.TailnetInfo {
	m.infoMu.Lock()
	defer m.infoMu.Unlock()
	if time.Now().After(m.infoExpiry) {
		info, err := m.Tailnet.TailnetInfo(ctx)
		if err != nil {
			return tailnet.TailnetInfo{HTTPSEnabled: true, MagicDNS: true, Domain: m.info.Domain}
		}
		m.info, m.infoExpiry = info, time.Now().Add(tailnetInfoTTL)
	}
	return m.info
}

// Ensure applies every child of p, and reports whether it created the proxy's StatefulSet. It
// mints an auth key only while the proxy has no device yet and holds no unused key.
func (m *Proxies) Ensure(ctx context.Context, p *StandaloneProxy) (created bool, err error) {
	w := WhereFor(m.Settings)
	ns := w.State
	grant, err := m.authKeyFor(ctx, p)
	if err != nil {
		return false, err
	}
	secret, err := p.buildSecret(ns, grant.Key)
	if err != nil {
		return false, err
	}
	grant.Annotate(secret)
	sts := p.BuildStatefulSet(m.Settings)
	if created, err = m.absent(ctx, sts, w.Pods); err != nil {
		return false, err
	}
	var objs []client.Object
	for _, podNS := range p.podNamespaces(w) {
		objs = append(objs, p.buildServiceAccount(podNS))
	}
	objs = append(objs, p.buildRole(ns), p.buildRoleBinding(w), secret)
	for _, c := range p.CertSecrets {
		objs = append(objs, c)
	}
	if cm, err := CABundleCopy(ctx, m.Client, m.Settings, sts.Namespace); err != nil {
		return false, err
	} else if cm != nil {
		objs = append(objs, cm)
	}
	for _, obj := range objs {
		if err := kit.Apply(ctx, m.Client, obj); err != nil {
			if obj == secret {
				return false, m.keys().Undelivered(ctx, grant, err)
			}
			return false, err
		}
	}
	if _, err := Place(ctx, m.Client, w, sts); err != nil {
		return false, err
	}
	if err := PlaceMetricsObjects(ctx, m.Client, nil, w, p.Name(), sts.Namespace, p.Parent.Labels(), p.Selector(), p.Class); err != nil {
		return false, err
	}
	return created, certs.PruneCertCopies(ctx, m.Client, ns, p.Parent.Labels(), p.CertSecrets)
}

// CABundleCopy is the copy, in ns, of the operator's CA bundle ConfigMap, which proxy Pods
// mount from their own namespace: nil where they run in the operator's or need none.
func CABundleCopy(ctx context.Context, c client.Reader, s kit.Settings, ns string) (*corev1.ConfigMap, error) {
	if s.ProxyCAConfigMap == "" || ns == s.Namespace {
		return nil, nil
	}
	src := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: s.ProxyCAConfigMap}, src); err != nil {
		return nil, fmt.Errorf("reading the proxies' CA bundle ConfigMap %s/%s to copy it to %s: %w", s.Namespace, s.ProxyCAConfigMap, ns, err)
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: s.ProxyCAConfigMap, Namespace: ns, Labels: map[string]string{kit.LabelManaged: "true"}},
		Data:       src.Data, BinaryData: src.BinaryData,
	}, nil
}

// absent reports whether obj exists in none of namespaces. The cache answers when it has it; a
// miss is confirmed through the API, as the cache may not have seen a creation yet.
func (m *Proxies) absent(ctx context.Context, obj client.Object, namespaces []string) (bool, error) {
	for _, ns := range namespaces {
		existing := obj.DeepCopyObject().(client.Object)
		key := client.ObjectKey{Namespace: ns, Name: obj.GetName()}
		err := m.Get(ctx, key, existing)
		if apierrors.IsNotFound(err) {
			err = m.API.Get(ctx, key, existing)
		}
		if err == nil {
			return false, nil
		}
		if !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("looking for the proxy StatefulSet %s/%s: %w", ns, obj.GetName(), err)
		}
	}
	return true, nil
}

func (m *Proxies) keys() Keys {
	return Keys{Client: m.Client, API: m.API, Tailnet: m.Tailnet, Namespace: m.Settings.Namespace}
}

func (m *Proxies) authKeyFor(ctx context.Context, p *StandaloneProxy) (KeyGrant, error) {
	ns := m.Settings.Namespace
	return m.keys().Grant(ctx, p.Parent.replicas(), 0, p.configSecret(ns), p.buildServiceAccount(ns), p.Config.Hostname, tailnet.AuthKeyRequest{
		Tags:        p.Config.Tags,
		Description: fmt.Sprintf("tsingress %s %s/%s", p.Parent.Typ, p.Parent.Namespace, p.Parent.Name),
		Expiry:      AuthKeyExpiry,
	})
}

// State returns what the proxy of par reports, or nil while no running Pod has reported, and
// the Pod, nil while there is none. A state that cannot be read (edited by hand) is not
// reported either, and the finding says why: the object is still served as it asks.
func (m *Proxies) State(ctx context.Context, par Parent) (*contract.ProxyState, *corev1.Pod, *kit.Finding, error) {
	rs := par.replicas()
	r, err := rs.Read(ctx, m.Client, &m.reports, WhereFor(m.Settings), 0)
	if err != nil || r.unreadable == nil {
		return r.State, r.pod, nil, err
	}
	f := kit.Warnf(kit.ReasonProxyStateInvalid, "the proxy's state in Secret %s/%s cannot be read (%v); it is ignored until the proxy "+
		"writes it again, which a restart of Pod %s makes it do at once", m.Settings.Namespace, rs.StateSecret(0), r.unreadable, rs.pod(0))
	return nil, r.pod, &f, nil
}

// LoginNeeded is the finding of a proxy (or replica) that reports it waits for an interactive
// login, or nil.
func LoginNeeded(name string, st *contract.ProxyState) *kit.Finding {
	if st == nil || st.Login != contract.LoginNeeded {
		return nil
	}
	f := kit.Warnf(kit.ReasonProxyNeedsLogin, "the proxy %s waits for an interactive login: the control server refused its auth key "+
		"(revoked, expired or spent) or it has none; its login URL is not printed, and it logs in once its config holds a usable key", name)
	return &f
}

// PodRefused says why the kubelet refused to run a proxy Pod (a Pod sysctl it does not allow:
// SysctlForbidden), or "" when it did not.
func PodRefused(pod *corev1.Pod) string {
	if pod == nil || pod.Status.Phase != corev1.PodFailed || pod.Status.Reason == "" {
		return ""
	}
	return fmt.Sprintf("the node refused to run the proxy Pod %s: %s: %s", pod.Name, pod.Status.Reason, pod.Status.Message)
}

// Teardown tears a proxy down: the StatefulSet first (so the proxy cannot log in again), then
// its tailnet device, then the remaining children. It reports done=false while the
// StatefulSet is still going away; the StatefulSet watch calls again. A device the tailnet API
// does not show to be the proxy's stays, and refused says so, for a Warning Event.
func (m *Proxies) Teardown(ctx context.Context, par Parent) (done bool, refused *kit.Finding, err error) {
	w := WhereFor(m.Settings)
	ns, name := w.State, par.ProxyName()
	for _, podNS := range w.Pods {
		sts := &appsv1.StatefulSet{}
		switch err := m.Get(ctx, client.ObjectKey{Namespace: podNS, Name: name}, sts); {
		case err == nil:
			if sts.DeletionTimestamp == nil {
				if err := kit.Remove(ctx, m.Client, sts, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
					return false, nil, fmt.Errorf("deleting the proxy StatefulSet %s/%s: %w", podNS, name, err)
				}
			}
			return false, nil, nil
		case !apierrors.IsNotFound(err):
			return false, nil, fmt.Errorf("reading the proxy StatefulSet %s/%s: %w", podNS, name, err)
		}
	}

	// From the API server, not the cache: a device the proxy recorded just before it stopped
	// must not be missed, nor a key minted just before.
	state, err := getSecret(ctx, m.API, ns, par.replicas().StateSecret(0))
	if err != nil {
		return false, nil, fmt.Errorf("reading the proxy state: %w", err)
	}
	if state != nil {
		why, err := m.keys().DeleteDevice(ctx, par.replicas(), 0, state)
		if err != nil {
			return false, nil, err
		}
		if why != "" {
			f := kit.Warnf(kit.ReasonDeviceNotMinted, "%s", why)
			refused = &f
		}
	}
	if err := m.keys().Release(ctx, state); err != nil { // a standalone proxy's config is its state Secret
		return false, nil, err
	}
	if err := certs.PruneCertCopies(ctx, m.Client, ns, par.Labels(), nil); err != nil {
		return false, nil, err
	}
	type child struct {
		kind string
		obj  client.Object
	}
	children := []child{
		{"state Secret", &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: par.replicas().StateSecret(0)}}},
		{"RoleBinding", &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}},
		{"Role", &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}},
	}
	for _, podNS := range w.Pods {
		if err := ApplyMetricsObjects(ctx, m.Client, nil, name, podNS, nil, nil, nil); err != nil {
			return false, nil, err
		}
		children = append(children, child{"ServiceAccount", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: name}}})
	}
	for _, child := range children {
		if err := kit.Remove(ctx, m.Client, child.obj); err != nil {
			return false, nil, fmt.Errorf("deleting the proxy's %s %s/%s: %w", child.kind, child.obj.GetNamespace(), child.obj.GetName(), err)
		}
	}
	return true, refused, nil
}

// ParseTags reads the tailscale.com/tags annotation: comma-separated tags replacing the
// operator's defaults.
func ParseTags(obj client.Object, defaults []string) ([]string, *kit.Finding) {
	v, ok := obj.GetAnnotations()[kit.AnnotationTags]
	if !ok {
		return defaults, nil
	}
	var tags, bad []string
	for _, t := range strings.Split(v, ",") {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		if !contract.ValidTag(t) {
			bad = append(bad, t)
		}
		tags = append(tags, t)
	}
	if len(bad) > 0 || len(tags) == 0 {
		f := kit.Blockf(kit.ReasonInvalidAnnotation, "annotation %s=%q: every tag must look like tag:name (bad: %s)", kit.AnnotationTags, v, strings.Join(bad, ", "))
		return nil, &f
	}
	return tags, nil
}
