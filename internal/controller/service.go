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
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
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

// ConditionProxyReady is the condition a standalone L3 proxy reports on its Service.
const ConditionProxyReady = "TailscaleProxyReady"

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
	// Status is computed from what this pass observed and written once, at the end.
	st := serviceStatus{svc: svc}
	defer func() { st.write(ctx, r) }()

	cfg, findings := serviceProxyConfig(svc, r.Settings)
	r.findings(svc, findings)
	if cfg == nil {
		st.set(false, ReasonProxyInvalid, findingMessages(findings))
		return ctrl.Result{}, nil
	}
	class, notReady, err := readyProxyClass(ctx, r.Client, proxyClassName(svc, r.Settings.DefaultProxyClass))
	if err != nil {
		return ctrl.Result{}, err
	}
	if notReady != "" {
		r.warning(svc, ReasonProxyClassNotReady, "%s; waiting for it", notReady)
		st.set(false, ReasonProxyPending, notReady)
		return ctrl.Result{}, nil
	}
	p := &standaloneProxy{parent: parentOf(parentTypeService, svc), class: class, config: *cfg, kernel: true}
	created, err := r.proxies.ensure(ctx, p)
	if err != nil {
		st.set(false, ReasonProxyFailed, err.Error())
		return r.tailnetFailure(svc, err)
	}
	if created {
		r.created(svc, ReasonProxyDeployed, "created the proxy %s/%s; it joins the tailnet as %s", r.Settings.Namespace, p.name(), cfg.Hostname)
	}
	state, pod, unreadable, err := r.proxies.state(ctx, p.parent)
	if err != nil {
		return ctrl.Result{}, err
	}
	if unreadable != nil {
		r.findings(svc, []finding{*unreadable})
	}
	if msg := podRefused(pod); msg != "" {
		st.set(false, ReasonProxyFailed, msg)
		st.warning = &finding{reason: ReasonProxyFailed, message: msg, warning: true}
		return ctrl.Result{}, nil
	}
	st.fromProxy(state)
	if state != nil && state.FQDN != "" {
		r.progress(svc, "joined", ReasonDeviceJoined, "the proxy joined the tailnet as %s", state.FQDN)
	}
	if st.ready {
		r.progress(svc, "serving", ReasonServing, "%s", st.message)
	}
	return ctrl.Result{}, nil
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

// serviceStatus collects a Service's condition and load-balancer status during a pass.
type serviceStatus struct {
	svc     *corev1.Service
	ready   bool
	reason  string
	message string
	lb      []corev1.LoadBalancerIngress
	// warning is emitted as an Event when the condition changes.
	warning *finding
}

func (s *serviceStatus) set(ready bool, reason, msg string) {
	s.ready, s.reason, s.message = ready, reason, msg
}

// fromProxy reads the condition off what the proxy reports: waiting, failed, or forwarding the
// families it can, with the others named.
func (s *serviceStatus) fromProxy(st *contract.ProxyState) {
	if st != nil && st.Firewall != nil {
		if reason, msg := familiesBlocked(st.Firewall.Families, serviceFamilies(s.svc)); reason != "" {
			s.set(false, reason, msg)
			s.warning = &finding{reason: reason, message: msg, warning: true}
			return
		}
	}
	switch {
	case st == nil || st.FQDN == "":
		s.set(false, ReasonProxyPending, "waiting for the proxy Pod to join the tailnet")
		return
	case st.Firewall == nil:
		s.set(false, ReasonProxyPending, "waiting for the proxy to install its DNAT rules")
		return
	}
	m, ok := st.Firewall.Mappings[contract.StandaloneMapping]
	switch {
	case !ok:
		s.set(false, ReasonProxyPending, "waiting for the proxy to install its DNAT rules")
		return
	// A proxy that knows no per-family errors reports any failure as the mapping's.
	case len(m.TailnetIPs) == 0 || (m.Error != "" && len(m.FamilyErrors) == 0):
		msg := "the proxy could not install its DNAT rules: " + m.Error
		s.set(false, ReasonProxyFailed, msg)
		s.warning = &finding{reason: ReasonProxyFailed, message: msg, warning: true}
		return
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
		s.warning = &finding{reason: ReasonIPFamilyNotForwarded, message: notForwarded, warning: true}
	}
	s.set(true, ReasonProxyReady, msg)
	if s.svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		s.lb = []corev1.LoadBalancerIngress{{Hostname: st.FQDN}}
		for _, ip := range m.TailnetIPs {
			// VIP is what the API server defaults to; set it so the comparison is stable.
			s.lb = append(s.lb, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
		}
	}
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

func (s *serviceStatus) write(ctx context.Context, r *ServiceReconciler) {
	if s.reason == "" {
		return
	}
	before := s.svc.DeepCopy()
	changed := setCondition(&s.svc.Status.Conditions, ConditionProxyReady, s.ready, s.reason, s.message, s.svc.Generation)
	// The reporter emits it once while it stands, so a steady failure does not flood the Events.
	if s.warning != nil {
		r.warning(s.svc, s.warning.reason, "%s", s.warning.message)
	}
	if s.svc.Spec.Type == corev1.ServiceTypeLoadBalancer && !equality.Semantic.DeepEqual(s.svc.Status.LoadBalancer.Ingress, s.lb) {
		s.svc.Status.LoadBalancer.Ingress = s.lb
		changed = true
	}
	if changed {
		if err := r.Status().Patch(ctx, s.svc, client.MergeFrom(before)); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "writing Service status")
		}
	}
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
		if err := clearServiceStatus(ctx, r.Client, svc, ConditionProxyReady); err != nil {
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
		if r.serves(s) && proxyClassName(s, r.Settings.DefaultProxyClass) == o.GetName() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(s)})
		}
	}
	return reqs
}

// clearServiceStatus removes what the operator reported on a Service it no longer serves.
func clearServiceStatus(ctx context.Context, c client.Client, svc *corev1.Service, conditions ...string) error {
	before := svc.DeepCopy()
	for _, t := range conditions {
		meta.RemoveStatusCondition(&svc.Status.Conditions, t)
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		svc.Status.LoadBalancer.Ingress = nil
	}
	if equality.Semantic.DeepEqual(before.Status, svc.Status) {
		return nil
	}
	return c.Status().Patch(ctx, svc, client.MergeFrom(before))
}
