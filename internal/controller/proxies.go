package controller

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
	"github.com/tsingress/tsingress/internal/tailnet"
)

// proxies runs the standalone proxy machinery shared by the Ingress and Service reconcilers:
// it applies a proxy's children, reads back its state and tears it down.
type proxies struct {
	client.Client
	api      client.Reader // uncached, to tell a new proxy from one the cache has not seen yet
	settings Settings
	tailnet  tailnet.Client

	// infoMu guards the cached tailnet settings, which change rarely and would otherwise cost
	// an API call per reconcile.
	infoMu     sync.Mutex
	info       tailnet.TailnetInfo
	infoExpiry time.Time
}

const tailnetInfoTTL = 5 * time.Minute

// tailnetInfo returns the tailnet's settings, cached. When the API cannot tell, it assumes
// certificates are available, so a flaky API raises no false alarm.
func (m *proxies) tailnetInfo(ctx context.Context) tailnet.TailnetInfo {
	m.infoMu.Lock()
	defer m.infoMu.Unlock()
	if time.Now().After(m.infoExpiry) {
		info, err := m.tailnet.TailnetInfo(ctx)
		if err != nil {
			return tailnet.TailnetInfo{HTTPSEnabled: true, MagicDNS: true, Domain: m.info.Domain}
		}
		m.info, m.infoExpiry = info, time.Now().Add(tailnetInfoTTL)
	}
	return m.info
}

// ensure applies every child of p, and reports whether it created the proxy's StatefulSet. It
// mints an auth key only while the proxy has no device yet and holds no unused key.
func (m *proxies) ensure(ctx context.Context, p *standaloneProxy) (created bool, err error) {
	ns := m.settings.Namespace
	authKey, err := m.authKeyFor(ctx, p)
	if err != nil {
		return false, err
	}
	secret, err := p.buildSecret(ns, authKey)
	if err != nil {
		return false, err
	}
	sts := p.buildStatefulSet(m.settings)
	if created, err = m.absent(ctx, sts); err != nil {
		return false, err
	}
	objs := []client.Object{p.buildServiceAccount(ns), p.buildRole(ns), p.buildRoleBinding(ns), secret}
	for _, c := range p.certSecrets {
		objs = append(objs, c)
	}
	for _, obj := range append(objs, sts) {
		if err := apply(ctx, m.Client, obj); err != nil {
			return false, err
		}
	}
	if err := applyMetricsObjects(ctx, m.Client, nil, p.name(), ns, p.parent.labels(), p.selector(), p.class); err != nil {
		return false, err
	}
	return created, pruneCertCopies(ctx, m.Client, ns, p.parent.labels(), p.certSecrets)
}

// absent reports whether obj does not exist yet. The cache answers when it has it; a miss is
// confirmed through the API, as the cache may not have seen a creation yet.
func (m *proxies) absent(ctx context.Context, obj client.Object) (bool, error) {
	existing := obj.DeepCopyObject().(client.Object)
	err := m.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	if apierrors.IsNotFound(err) {
		err = m.api.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	}
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
}

func (m *proxies) authKeyFor(ctx context.Context, p *standaloneProxy) (string, error) {
	return p.parent.replicas().authKey(ctx, m.Client, m.tailnet, m.settings.Namespace, 0, tailnet.AuthKeyRequest{
		Tags:        p.config.Tags,
		Description: fmt.Sprintf("tsingress %s %s/%s", p.parent.typ, p.parent.namespace, p.parent.name),
		Expiry:      authKeyExpiry,
	})
}

// state returns what the proxy of par reports, or nil while no running Pod has reported, and
// the Pod, nil while there is none. A state that cannot be read (edited by hand) is not
// reported either, and the finding says why: the object is still served as it asks.
func (m *proxies) state(ctx context.Context, par parent) (*contract.ProxyState, *corev1.Pod, *finding, error) {
	rs := par.replicas()
	r, err := rs.read(ctx, m.Client, m.settings.Namespace, 0)
	if err != nil || r.unreadable == nil {
		return r.state, r.pod, nil, err
	}
	f := warnf(ReasonProxyStateInvalid, "the proxy's state in Secret %s/%s cannot be read (%v); it is ignored until the proxy "+
		"writes it again, which a restart of Pod %s makes it do at once", m.settings.Namespace, rs.stateSecret(0), r.unreadable, rs.pod(0))
	return nil, r.pod, &f, nil
}

// podRefused says why the kubelet refused to run a proxy Pod (a Pod sysctl it does not allow:
// SysctlForbidden), or "" when it did not.
func podRefused(pod *corev1.Pod) string {
	if pod == nil || pod.Status.Phase != corev1.PodFailed || pod.Status.Reason == "" {
		return ""
	}
	return fmt.Sprintf("the node refused to run the proxy Pod %s: %s: %s", pod.Name, pod.Status.Reason, pod.Status.Message)
}

// cleanup tears a proxy down: the StatefulSet first (so the proxy cannot log in again), then
// its tailnet device, then the remaining children. It reports done=false while the
// StatefulSet is still going away; the StatefulSet watch calls again.
func (m *proxies) cleanup(ctx context.Context, par parent) (done bool, err error) {
	ns, name := m.settings.Namespace, par.proxyName()
	sts := &appsv1.StatefulSet{}
	switch err := m.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sts); {
	case err == nil:
		if sts.DeletionTimestamp == nil {
			if err := remove(ctx, m.Client, sts, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
				return false, err
			}
		}
		return false, nil
	case !apierrors.IsNotFound(err):
		return false, err
	}

	state := &corev1.Secret{}
	switch err := m.Get(ctx, client.ObjectKey{Namespace: ns, Name: par.replicas().stateSecret(0)}, state); {
	case err == nil:
		if err := deleteDevice(ctx, m.tailnet, state); err != nil {
			return false, err
		}
	case !apierrors.IsNotFound(err):
		return false, err
	}
	if err := pruneCertCopies(ctx, m.Client, ns, par.labels(), nil); err != nil {
		return false, err
	}
	if err := applyMetricsObjects(ctx, m.Client, nil, name, ns, nil, nil, nil); err != nil {
		return false, err
	}
	for _, obj := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: par.replicas().stateSecret(0)}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
	} {
		if err := remove(ctx, m.Client, obj); err != nil {
			return false, err
		}
	}
	return true, nil
}

// parseTags reads the tailscale.com/tags annotation: comma-separated tags replacing the
// operator's defaults.
func parseTags(obj client.Object, defaults []string) ([]string, *finding) {
	v, ok := obj.GetAnnotations()[AnnotationTags]
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
		f := blockf(ReasonInvalidAnnotation, "annotation %s=%q: every tag must look like tag:name (bad: %s)", AnnotationTags, v, strings.Join(bad, ", "))
		return nil, &f
	}
	return tags, nil
}
