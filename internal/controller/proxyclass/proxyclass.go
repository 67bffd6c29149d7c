// Package proxyclass holds the ProxyClass reconciler: it validates what the CRD schema cannot and
// reports ProxyClassReady. How a class shapes a proxy's Pod is the proxies package's.
package proxyclass

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

var serviceMonitorKind = schema.GroupKind{Group: "monitoring.coreos.com", Kind: "ServiceMonitor"}

// recheckMissingCRD is how often a ProxyClass that needs the ServiceMonitor CRD looks for it
// again; the operator does not watch CRDs.
const recheckMissingCRD = 5 * time.Minute

// ProxyClassReconciler validates ProxyClasses and reports ProxyClassReady.
type ProxyClassReconciler struct {
	client.Client
	kit.Reporter
	Mapper meta.RESTMapper
}

// +kubebuilder:rbac:groups=tailscale.com,resources=proxyclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=tailscale.com,resources=proxyclasses/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

func (r *ProxyClassReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	pc := &tsv1alpha1.ProxyClass{}
	if err := r.Get(ctx, req.NamespacedName, pc); err != nil {
		if apierrors.IsNotFound(err) {
			r.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	defer func() { r.Settle(pc, err == nil) }()
	hasSM, err := r.serviceMonitorCRDInstalled()
	if err != nil {
		return ctrl.Result{}, err
	}
	v := validateProxyClass(&pc.Spec, hasSM)

	before := pc.DeepCopy()
	ok := len(v.problems) == 0
	reason, msg := kit.ReasonProxyClassValid, "ProxyClass is valid"
	if !ok {
		reason, msg = kit.ReasonProxyClassInvalid, "ProxyClass is not valid: "+strings.Join(v.problems, "; ")
		r.Warning(pc, kit.ReasonProxyClassInvalid, "%s", msg)
	}
	for _, w := range v.warnings {
		r.Warning(pc, kit.ReasonCustomTSEnvVar, "%s", w)
	}
	for _, w := range v.ignored {
		r.Warning(pc, kit.ReasonProxyClassFieldIgnored, "%s", w)
	}
	if kit.SetCondition(&pc.Status.Conditions, tsv1alpha1.ProxyClassReady, ok, reason, msg, pc.Generation) {
		if err := kit.PatchStatus(ctx, r.Client, before, pc); err != nil {
			return ctrl.Result{}, fmt.Errorf("writing the status of ProxyClass %s: %w", pc.Name, err)
		}
	}
	if v.missingCRD {
		return ctrl.Result{RequeueAfter: recheckMissingCRD}, nil
	}
	return ctrl.Result{}, nil
}

func (r *ProxyClassReconciler) serviceMonitorCRDInstalled() (bool, error) {
	_, err := r.Mapper.RESTMapping(serviceMonitorKind)
	if meta.IsNoMatchError(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking up the ServiceMonitor kind: %w", err)
	}
	return true, nil
}

type proxyClassValidation struct {
	problems, warnings []string
	// ignored are fields accepted and not served.
	ignored    []string
	missingCRD bool
}

// validateProxyClass checks what the CRD schema cannot: label syntax, images, env overrides and
// the presence of the ServiceMonitor CRD.
func validateProxyClass(spec *tsv1alpha1.ProxyClassSpec, serviceMonitorCRD bool) proxyClassValidation {
	var v proxyClassValidation
	if ss := spec.StatefulSet; ss != nil {
		v.labels("statefulSet.labels", ss.Labels)
		v.annotations("statefulSet.annotations", ss.Annotations)
		if p := ss.Pod; p != nil {
			v.labels("statefulSet.pod.labels", p.Labels)
			v.annotations("statefulSet.pod.annotations", p.Annotations)
			v.labels("statefulSet.pod.nodeSelector", p.NodeSelector)
			v.container("tailscaleContainer", p.TailscaleContainer)
			v.container("tailscaleInitContainer", p.TailscaleInitContainer)
			if c := p.TailscaleInitContainer; c != nil && c.Debug != nil && c.Debug.Enable {
				v.problems = append(v.problems, "tailscaleInitContainer.debug cannot be enabled: the init container runs no server")
			}
			if p.TailscaleInitContainer != nil && proxies.PodSysctlForwarding(spec) {
				v.problems = append(v.problems, "tailscaleInitContainer cannot apply: securityContext.sysctls turns IP forwarding on, so the proxies have no init container")
			}
		}
	}
	if spec.StaticEndpoints != nil {
		v.ignored = append(v.ignored, "staticEndpoints is not served by this operator yet: the proxies are reached as without it (directly or through DERP, as the tailnet finds)")
	}
	if m := spec.Metrics; m != nil && m.ServiceMonitor != nil && m.ServiceMonitor.Enable {
		v.labels("metrics.serviceMonitor.labels", m.ServiceMonitor.Labels)
		if !serviceMonitorCRD {
			v.missingCRD = true
			v.problems = append(v.problems, "metrics.serviceMonitor.enable needs the ServiceMonitor CRD (monitoring.coreos.com), which is not installed")
		}
	}
	return v
}

func (v *proxyClassValidation) labels(field string, m map[string]string) {
	for k, val := range m {
		for _, e := range validation.IsQualifiedName(k) {
			v.problems = append(v.problems, fmt.Sprintf("%s: key %q: %s", field, k, e))
		}
		for _, e := range validation.IsValidLabelValue(val) {
			v.problems = append(v.problems, fmt.Sprintf("%s: value %q of %q: %s", field, val, k, e))
		}
	}
}

func (v *proxyClassValidation) annotations(field string, m map[string]string) {
	for k := range m {
		for _, e := range validation.IsQualifiedName(strings.ToLower(k)) {
			v.problems = append(v.problems, fmt.Sprintf("%s: key %q: %s", field, k, e))
		}
	}
}

func (v *proxyClassValidation) container(field string, c *tsv1alpha1.Container) {
	if c == nil {
		return
	}
	if c.Image != "" && (strings.TrimSpace(c.Image) != c.Image || strings.ContainsAny(c.Image, " \t\n")) {
		v.problems = append(v.problems, fmt.Sprintf("%s.image %q contains white space", field, c.Image))
	}
	if isOriginalProxyImage(c.Image) {
		v.problems = append(v.problems, fmt.Sprintf("%s.image %q is the Tailscale operator's proxy (containerboot), which does not read "+
			"this operator's proxy configuration: name this operator's proxy image (ghcr.io/tsingress/proxy) or a mirror of it", field, c.Image))
	}
	for _, e := range c.Env {
		// Turning log upload off is a choice the proxy leaves to the user, not an override.
		if strings.HasPrefix(e.Name, "TS_") && e.Name != "TS_NO_LOGS_NO_SUPPORT" {
			v.warnings = append(v.warnings, fmt.Sprintf("%s.env sets %s, which overrides the proxy's own setting", field, e.Name))
		}
	}
}

// isOriginalProxyImage says whether image is the Tailscale operator's proxy image, or a mirror
// that keeps its path: ProxyClasses written for that operator name it, and a Pod running it
// would crash-loop on a configuration it cannot read.
func isOriginalProxyImage(image string) bool {
	name, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i]
	}
	return name == "tailscale/tailscale" || strings.HasSuffix(name, "/tailscale/tailscale")
}

// SetupWithManager watches ProxyClasses; status-only updates do not retrigger it.
func (r *ProxyClassReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&tsv1alpha1.ProxyClass{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("proxyclass").
		Complete(r)
}
