package controller

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
)

// LoadBalancerClass selects the operator for a LoadBalancer Service.
const LoadBalancerClass = "tailscale"

// serviceOwned is the status the standalone reconciler owns on a Service it serves.
var serviceOwned = serviceStatusOwner{conditions: []string{ConditionProxyReady}}

// ServiceReconciler exposes Services on the tailnet at L3 through a standalone proxy each.
type ServiceReconciler struct {
	client.Client
	reporter
	Settings Settings
	proxies  *proxies
}

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=get;update;patch

// serves reports whether s is to be exposed by a standalone proxy.
func (r *ServiceReconciler) serves(s *corev1.Service) bool {
	if s.DeletionTimestamp != nil || s.Annotations[AnnotationProxyGroup] != "" {
		return false
	}
	if s.Annotations[AnnotationExpose] == "true" {
		return true
	}
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if s.Spec.LoadBalancerClass == nil {
		return r.Settings.DefaultLoadBalancer
	}
	return *s.Spec.LoadBalancerClass == LoadBalancerClass
}

func (r *ServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	svc := &corev1.Service{}
	if err := r.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.serves(svc) {
		return r.unserve(ctx, svc)
	}
	defer func() { r.settle(svc, err == nil) }()
	if err := addFinalizer(ctx, r.Client, svc, FinalizerName); err != nil {
		return ctrl.Result{}, err
	}
	// Status is computed from what this pass observed and patched once, at the end.
	var out serviceOutcome
	defer func() {
		if out.reason == "" {
			return
		}
		// The reporter emits it once while it stands, so a steady failure does not flood the Events.
		if out.warning != nil {
			r.warning(svc, out.warning.reason, "%s", out.warning.message)
		}
		want := out.status(svc.Status, svc.Generation, svc.Spec.Type == corev1.ServiceTypeLoadBalancer)
		if perr := patchServiceStatus(ctx, r.Client, svc, serviceOwned, want); perr != nil && err == nil {
			err = fmt.Errorf("writing Service status: %w", perr)
		}
	}()

	s, err := r.gather(ctx, svc)
	if err != nil {
		return ctrl.Result{}, err
	}
	cfg, findings := serviceProxyConfig(svc, r.Settings)
	r.findings(svc, findings)
	if cfg == nil {
		out.set(false, ReasonProxyInvalid, findingMessages(findings))
		return ctrl.Result{}, nil
	}
	if s.classNotReady != "" {
		r.warning(svc, ReasonProxyClassNotReady, "%s; waiting for it", s.classNotReady)
		out.set(false, ReasonProxyPending, s.classNotReady)
		return ctrl.Result{}, nil
	}
	p := &standaloneProxy{parent: parentOf(parentTypeService, svc), class: s.class, config: *cfg, kernel: true}
	created, err := r.proxies.ensure(ctx, p)
	if err != nil {
		out.set(false, ReasonProxyFailed, err.Error())
		return r.tailnetFailure(svc, err)
	}
	if created {
		r.created(svc, ReasonProxyDeployed, "created the proxy %s/%s; it joins the tailnet as %s", r.Settings.Namespace, p.name(), cfg.Hostname)
	}
	if s.unreadable != nil {
		r.findings(svc, []finding{*s.unreadable})
	}
	out = proxyOutcome(svc, s.state, s.pod)
	if s.state != nil && s.state.FQDN != "" {
		r.progress(svc, "joined", ReasonDeviceJoined, "the proxy joined the tailnet as %s", s.state.FQDN)
	}
	if out.ready {
		r.progress(svc, "serving", ReasonServing, "%s", out.message)
	}
	return ctrl.Result{}, nil
}

// serviceScope is what a pass over a Service with a standalone proxy reads.
type serviceScope struct {
	class         *tsv1alpha1.ProxyClass
	classNotReady string
	// state is what the proxy reports (nil: nothing yet); unreadable says why it cannot be read.
	state      *contract.ProxyState
	pod        *corev1.Pod
	unreadable *finding
}

func (r *ServiceReconciler) gather(ctx context.Context, svc *corev1.Service) (serviceScope, error) {
	s := serviceScope{}
	class, err := resolveProxyClass(ctx, r.Client, svc, r.Settings.DefaultProxyClass)
	if err != nil {
		return s, err
	}
	s.class, s.classNotReady = class.ready(), class.notReady
	s.state, s.pod, s.unreadable, err = r.proxies.state(ctx, parentOf(parentTypeService, svc))
	return s, err
}

// serviceProxyConfig is the proxy config a Service asks for, or nil with the reasons it cannot
// be served.
func serviceProxyConfig(svc *corev1.Service, s Settings) (*contract.ProxyConfig, []finding) {
	var findings []finding
	hostname := svc.Annotations[AnnotationHostname]
	if hostname == "" {
		hostname = truncateLabel(dnsLabelish(svc.Namespace + "-" + svc.Name))
	} else if !contract.ValidHostname(hostname) {
		findings = append(findings, blockf(ReasonInvalidAnnotation,
			"annotation %s=%q must be a DNS label: lower-case letters, digits and dashes, at most 63", AnnotationHostname, hostname))
	}
	if v, ok := svc.Annotations[AnnotationExpose]; ok && v != "true" {
		if b, err := strconv.ParseBool(v); err != nil || b {
			findings = append(findings, blockf(ReasonInvalidAnnotation, "annotation %s=%q: only \"true\" exposes a Service", AnnotationExpose, v))
		}
	}
	tags, f := parseTags(svc, s.DefaultTags)
	if f != nil {
		findings = append(findings, *f)
	}
	var dest contract.Destination
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		dest.DNSName = svc.Spec.ExternalName
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		findings = append(findings, blockf(ReasonInvalidService, "headless Services (clusterIP: None) have no address to forward to; expose a ClusterIP Service"))
	case svc.Spec.ClusterIP == "":
		findings = append(findings, blockf(ReasonInvalidService, "the Service has no ClusterIP yet"))
	default:
		dest.IPs = svc.Spec.ClusterIPs
		if len(dest.IPs) == 0 {
			dest.IPs = []string{svc.Spec.ClusterIP}
		}
	}
	if len(findings) > 0 {
		return nil, findings
	}
	return &contract.ProxyConfig{
		Kind:       contract.KindService,
		Hostname:   hostname,
		Tags:       tags,
		ControlURL: s.ControlURL,
		Firewall:   contract.FirewallConfig{Mode: s.FirewallMode},
		Forward:    &dest,
	}, findings
}

func findingMessages(fs []finding) string {
	var msgs []string
	for _, f := range fs {
		msgs = append(msgs, f.message)
	}
	return strings.Join(msgs, "; ")
}

// serviceOutcome is what a pass found about a Service with a standalone proxy: its condition
// (an empty reason: not decided, left as it was) and, for a LoadBalancer, its addresses.
type serviceOutcome struct {
	ready   bool
	reason  string
	message string
	lb      []corev1.LoadBalancerIngress
	// warning is emitted as an Event when the condition changes.
	warning *finding
}

func (o *serviceOutcome) set(ready bool, reason, msg string) {
	o.ready, o.reason, o.message = ready, reason, msg
}

// failed records a failure that is also a Warning.
func (o *serviceOutcome) failed(reason, msg string) {
	o.set(false, reason, msg)
	o.warning = &finding{reason: reason, message: msg, warning: true}
}

// proxyOutcome reads the condition off what the proxy and its Pod report: waiting, failed, or
// forwarding the families it can, with the others named.
func proxyOutcome(svc *corev1.Service, st *contract.ProxyState, pod *corev1.Pod) serviceOutcome {
	var o serviceOutcome
	if msg := podRefused(pod); msg != "" {
		o.failed(ReasonProxyFailed, msg)
		return o
	}
	if st != nil && st.Firewall != nil {
		if reason, msg := familiesBlocked(st.Firewall.Families, serviceFamilies(svc)); reason != "" {
			o.failed(reason, msg)
			return o
		}
	}
	switch {
	case st == nil || st.FQDN == "":
		o.set(false, ReasonProxyPending, "waiting for the proxy Pod to join the tailnet")
		return o
	case st.Firewall == nil:
		o.set(false, ReasonProxyPending, "waiting for the proxy to install its DNAT rules")
		return o
	}
	m, ok := st.Firewall.Mappings[contract.StandaloneMapping]
	switch {
	case !ok:
		o.set(false, ReasonProxyPending, "waiting for the proxy to install its DNAT rules")
		return o
	// A proxy that knows no per-family errors reports any failure as the mapping's.
	case len(m.TailnetIPs) == 0 || (m.Error != "" && len(m.FamilyErrors) == 0):
		o.failed(ReasonProxyFailed, "the proxy could not install its DNAT rules: "+m.Error)
		return o
	}
	// Only what is forwarded is advertised: a tailnet address of a family the Service lacks, or
	// the proxy cannot forward, would refuse connections.
	msg := fmt.Sprintf("reachable on the tailnet at %s (%s)", st.FQDN, strings.Join(m.TailnetIPs, ", "))
	if len(m.FamilyErrors) > 0 {
		var parts []string
		for _, f := range []string{contract.FamilyIPv4, contract.FamilyIPv6} {
			if e, ok := m.FamilyErrors[f]; ok {
				parts = append(parts, f+": "+e)
			}
		}
		notForwarded := "not forwarded: " + strings.Join(parts, "; ")
		msg += "; " + notForwarded
		o.warning = &finding{reason: ReasonIPFamilyNotForwarded, message: notForwarded, warning: true}
	}
	o.set(true, ReasonProxyReady, msg)
	o.lb = []corev1.LoadBalancerIngress{{Hostname: st.FQDN}}
	for _, ip := range m.TailnetIPs {
		// VIP is what the API server defaults to; set it so the comparison is stable.
		o.lb = append(o.lb, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
	}
	return o
}

// status computes a Service's status from a pass's outcome: its condition and, for a
// LoadBalancer Service, the addresses it is served at while ready.
func (o serviceOutcome) status(cur corev1.ServiceStatus, gen int64, loadBalancer bool) corev1.ServiceStatus {
	st := *cur.DeepCopy()
	if o.reason == "" {
		return st
	}
	setCondition(&st.Conditions, ConditionProxyReady, o.ready, o.reason, o.message, gen)
	if loadBalancer {
		st.LoadBalancer.Ingress = o.lb
	}
	return st
}

// serviceFamilies are the address families a Service's traffic needs: those of its ClusterIPs,
// or both for an ExternalName, whose name may resolve to either.
func serviceFamilies(svc *corev1.Service) []string {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return []string{contract.FamilyIPv4, contract.FamilyIPv6}
	}
	var out []string
	for _, ip := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
		f := contract.FamilyIPv4
		if a, err := netip.ParseAddr(ip); err != nil {
			continue
		} else if a.Is6() {
			f = contract.FamilyIPv6
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// familiesBlocked returns a reason and message when the proxy can forward none of the families
// needed: IPForwardingDisabled when forwarding is what stops one of them, else ProxyFailed.
func familiesBlocked(problems map[string]contract.FamilyProblem, needed []string) (reason, msg string) {
	if len(needed) == 0 {
		return "", ""
	}
	reason = ReasonProxyFailed
	var parts []string
	for _, f := range needed {
		p, ok := problems[f]
		if !ok {
			return "", ""
		}
		if p.Reason == contract.FamilyForwardingOff {
			reason = ReasonIPForwardingDisabled
		}
		parts = append(parts, p.Message)
	}
	return reason, "the proxy cannot forward traffic: " + strings.Join(parts, "; ")
}

// unserve removes the proxy of a Service that is deleted or no longer exposed.
func (r *ServiceReconciler) unserve(ctx context.Context, svc *corev1.Service) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(svc, FinalizerName) {
		r.forget(client.ObjectKeyFromObject(svc))
		return ctrl.Result{}, nil
	}
	done, err := r.proxies.cleanup(ctx, parentOf(parentTypeService, svc))
	if err != nil {
		return r.tailnetFailure(svc, err)
	}
	if !done {
		return ctrl.Result{RequeueAfter: cleanupPoll}, nil
	}
	if svc.DeletionTimestamp == nil {
		if err := clearServiceStatus(ctx, r.Client, svc, serviceOwned); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := removeFinalizer(ctx, r.Client, svc, FinalizerName); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(client.ObjectKeyFromObject(svc))
	return ctrl.Result{}, nil
}

// SetupWithManager watches Services, their proxies' children and ProxyClasses.
func (r *ServiceReconciler) SetupWithManager(mgr ctrl.Manager, p *proxies) error {
	r.proxies = p
	children := handler.EnqueueRequestsFromMapFunc(parentRequests(parentTypeService))
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Service{}).
		Named("service").
		Watches(&appsv1.StatefulSet{}, children).
		Watches(&corev1.Secret{}, children).
		Watches(&corev1.Pod{}, children).
		Watches(&tsv1alpha1.ProxyClass{}, handler.EnqueueRequestsFromMapFunc(r.servicesForProxyClass)).
		Complete(r)
}

func (r *ServiceReconciler) servicesForProxyClass(ctx context.Context, o client.Object) []reconcile.Request {
	list := &corev1.ServiceList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		s := &list.Items[i]
		if r.serves(s) && proxyClassOf(s, r.Settings.DefaultProxyClass) == o.GetName() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(s)})
		}
	}
	return reqs
}
