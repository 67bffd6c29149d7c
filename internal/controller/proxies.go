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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// authKeyExpiry bounds how long a minted key that was never used stays valid.
const authKeyExpiry = 24 * time.Hour

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
	existing := &corev1.Secret{}
	err := m.Get(ctx, client.ObjectKey{Namespace: m.settings.Namespace, Name: p.secretName()}, existing)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return "", err
	default:
		if contract.LoggedIn(existing.Data) {
			return "", nil // logged in: the key is spent and leaves the config
		}
		if cfg, _, err := contract.ProxyConfigs.Decode(existing.Data); err == nil && cfg.AuthKey != "" {
			return cfg.AuthKey, nil
		}
	}
	req := tailnet.AuthKeyRequest{
		Tags:        p.config.Tags,
		Description: fmt.Sprintf("tsingress %s %s/%s", p.parent.typ, p.parent.namespace, p.parent.name),
		Expiry:      authKeyExpiry,
	}
	key, err := m.tailnet.CreateAuthKey(ctx, req)
	if err != nil {
		return "", err
	}
	logAuthKey(ctx, req, key, p.name())
	return key.Secret.Reveal(), nil
}

// state returns what the proxy of par reports, or nil while no running Pod has reported:
// state left by an earlier Pod does not describe the running proxy. It also returns the Pod,
// nil while there is none. A state that cannot be read (edited by hand) is not reported either,
// and the finding says why: the object is still served as it asks.
func (m *proxies) state(ctx context.Context, par parent) (*contract.ProxyState, *corev1.Pod, *finding, error) {
	name := par.proxyName() + "-0"
	key := client.ObjectKey{Namespace: m.settings.Namespace, Name: name}
	pod := &corev1.Pod{}
	if err := m.Get(ctx, key, pod); err != nil {
		return nil, nil, nil, client.IgnoreNotFound(err)
	}
	secret := &corev1.Secret{}
	if err := m.Get(ctx, key, secret); err != nil {
		return nil, pod, nil, client.IgnoreNotFound(err)
	}
	st, err := contract.ParseState(secret.Data)
	if err != nil {
		f := warnf(ReasonProxyStateInvalid, "the proxy's state in Secret %s/%s cannot be read (%v); it is ignored until the proxy "+
			"writes it again, which a restart of Pod %s makes it do at once", key.Namespace, key.Name, err, pod.Name)
		return nil, pod, &f, nil
	}
	if !st.CurrentFor(string(pod.UID)) {
		return nil, pod, nil, nil
	}
	return st, pod, nil, nil
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

	secret := &corev1.Secret{}
	switch err := m.Get(ctx, client.ObjectKey{Namespace: ns, Name: name + "-0"}, secret); {
	case err == nil:
		if id := string(secret.Data[contract.StateDeviceID]); id != "" {
			if err := m.tailnet.DeleteDevice(ctx, id); err != nil {
				return false, fmt.Errorf("deleting tailnet device %s: %w", id, err)
			}
			log.FromContext(ctx).Info("deleted tailnet device", "deviceID", id, "proxy", name)
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
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-0"}},
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

// logAuthKey logs a minted auth key by its ID, never its secret.
func logAuthKey(ctx context.Context, req tailnet.AuthKeyRequest, key tailnet.AuthKey, proxy string) {
	log.FromContext(ctx).Info("minted auth key", "keyID", key.ID, "proxy", proxy, "tags", req.Tags,
		"description", req.Description, "expires", key.Expires)
}

// proxyClassName is the ProxyClass an object asks for: its label, else its annotation, else
// the operator's default.
func proxyClassName(obj client.Object, def string) string {
	if v := obj.GetLabels()[LabelProxyClass]; v != "" {
		return v
	}
	if v := obj.GetAnnotations()[LabelProxyClass]; v != "" {
		return v
	}
	return def
}

// readyProxyClass returns the named ProxyClass when it is ready for use, or a message saying why
// not. An empty name means no class.
func readyProxyClass(ctx context.Context, c client.Client, name string) (*tsv1alpha1.ProxyClass, string, error) {
	if name == "" {
		return nil, "", nil
	}
	pc := &tsv1alpha1.ProxyClass{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, pc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("ProxyClass %q does not exist", name), nil
		}
		return nil, "", err
	}
	cond := meta.FindStatusCondition(pc.Status.Conditions, tsv1alpha1.ProxyClassReady)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != pc.Generation {
		return nil, fmt.Sprintf("ProxyClass %q is not ready", name), nil
	}
	return pc, "", nil
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
