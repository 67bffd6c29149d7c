// Package service holds the reconcilers of L3 Services (tailscale.com/expose or
// loadBalancerClass tailscale): standalone (a proxy of its own that DNATs its tailnet IPs to the
// Service) and HA (DNAT entries in a ProxyGroup's documents behind a Tailscale Service). It must
// not reach into another reconciler's package.
package service

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// ServiceOwned is the status the standalone reconciler owns on a Service it serves.
var ServiceOwned = kit.ServiceStatusOwner{Conditions: []string{kit.ConditionProxyReady}}

// ServiceReconciler exposes Services on the tailnet at L3 through a standalone proxy each.
type ServiceReconciler struct {
	client.Client
	kit.Reporter
	Settings kit.Settings
	proxies  *proxies.Proxies
}

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=services/status,verbs=get;update;patch

// serves reports whether s is to be exposed by a standalone proxy.
func (r *ServiceReconciler) serves(s *corev1.Service) bool {
	return s.DeletionTimestamp == nil && s.Annotations[kit.AnnotationProxyGroup] == "" && exposed(s, r.Settings)
}

func (r *ServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return kit.Served[*corev1.Service]{
		Client: r.Client, Reporter: r.Reporter, Kind: "Service", Finalizer: kit.FinalizerName,
		New: func() *corev1.Service { return &corev1.Service{} }, Serves: r.serves, Serve: r.serve, Unserve: r.unserve,
	}.Reconcile(ctx, req)
}

// serve runs a pass over a Service this reconciler serves.
func (r *ServiceReconciler) serve(ctx context.Context, svc *corev1.Service) (_ ctrl.Result, err error) {
	// Status is computed from what this pass observed and patched once, at the end.
	var out serviceOutcome
	defer func() {
		if out.reason == "" {
			return
		}
		// The reporter emits it once while it stands, so a steady failure does not flood the Events.
		if out.warning != nil {
			r.Warning(svc, out.warning.Reason, "%s", out.warning.Message)
		}
		want := out.status(svc.Status, svc.Generation, svc.Spec.Type == corev1.ServiceTypeLoadBalancer)
		if perr := kit.PatchServiceStatus(ctx, r.Client, svc, ServiceOwned, want); perr != nil && err == nil {
			err = fmt.Errorf("writing Service status: %w", perr)
		}
	}()

	s, err := r.gather(ctx, svc)
	if err != nil {
		return ctrl.Result{}, err
	}
	cfg, findings := ServiceProxyConfig(svc, r.Settings)
	r.Findings(svc, findings)
	if cfg == nil {
		out.set(false, kit.ReasonProxyInvalid, findingMessages(findings))
		return ctrl.Result{}, nil
	}
	if s.classNotReady != "" {
		r.Warning(svc, kit.ReasonProxyClassNotReady, "%s; waiting for it", s.classNotReady)
		out.set(false, kit.ReasonProxyPending, s.classNotReady)
		return ctrl.Result{}, nil
	}
	p := &proxies.StandaloneProxy{Parent: proxies.ParentOf(proxies.ParentTypeService, svc), Class: s.class, Config: *cfg, Kernel: true}
	created, err := r.proxies.Ensure(ctx, p)
	if err != nil {
		out.set(false, kit.ReasonProxyFailed, err.Error())
		return r.TailnetFailure(svc, err)
	}
	if created {
		r.Created(svc, kit.ReasonProxyDeployed, "created the proxy %s/%s; it joins the tailnet as %s", r.Settings.Namespace, p.Name(), cfg.Hostname)
	}
	if s.unreadable != nil {
		r.Findings(svc, []kit.Finding{*s.unreadable})
	}
	out = proxyOutcome(svc, s.state, s.pod)
	if s.state != nil && s.state.FQDN != "" {
		r.Progress(svc, "joined", kit.ReasonDeviceJoined, "the proxy joined the tailnet as %s", s.state.FQDN)
	}
	if out.ready {
		r.Progress(svc, "serving", kit.ReasonServing, "%s", out.message)
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
	unreadable *kit.Finding
}

func (r *ServiceReconciler) gather(ctx context.Context, svc *corev1.Service) (serviceScope, error) {
	s := serviceScope{}
	class, err := proxies.ResolveProxyClass(ctx, r.Client, svc, r.Settings.DefaultProxyClass)
	if err != nil {
		return s, err
	}
	s.class, s.classNotReady = class.Ready(), class.NotReady
	s.state, s.pod, s.unreadable, err = r.proxies.State(ctx, proxies.ParentOf(proxies.ParentTypeService, svc))
	return s, err
}

// serviceOutcome is what a pass found about a Service with a standalone proxy: its condition
// (an empty reason: not decided, left as it was) and, for a LoadBalancer, its addresses.
type serviceOutcome struct {
	ready   bool
	reason  string
	message string
	lb      []corev1.LoadBalancerIngress
	// warning is emitted as an Event when the condition changes.
	warning *kit.Finding
}

func (o *serviceOutcome) set(ready bool, reason, msg string) {
	o.ready, o.reason, o.message = ready, reason, msg
}

// failed records a failure that is also a Warning.
func (o *serviceOutcome) failed(reason, msg string) {
	o.set(false, reason, msg)
	o.warning = &kit.Finding{Reason: reason, Message: msg, Warning: true}
}

// proxyOutcome reads the condition off what the proxy and its Pod report: waiting, failed, or
// forwarding the families it can, with the others named.
func proxyOutcome(svc *corev1.Service, st *contract.ProxyState, pod *corev1.Pod) serviceOutcome {
	var o serviceOutcome
	if msg := proxies.PodRefused(pod); msg != "" {
		o.failed(kit.ReasonProxyFailed, msg)
		return o
	}
	if f := proxies.LoginNeeded(proxyPodName(svc, pod), st); f != nil {
		o.failed(f.Reason, f.Message)
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
		o.set(false, kit.ReasonProxyPending, "waiting for the proxy Pod to join the tailnet")
		return o
	case st.Firewall == nil:
		o.set(false, kit.ReasonProxyPending, "waiting for the proxy to install its DNAT rules")
		return o
	}
	m, ok := st.Firewall.Mappings[contract.StandaloneMapping]
	switch {
	case !ok:
		o.set(false, kit.ReasonProxyPending, "waiting for the proxy to install its DNAT rules")
		return o
	// A proxy that knows no per-family errors reports any failure as the mapping's.
	case len(m.TailnetIPs) == 0 || (m.Error != "" && len(m.FamilyErrors) == 0):
		o.failed(kit.ReasonProxyFailed, "the proxy could not install its DNAT rules: "+m.Error)
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
		o.warning = &kit.Finding{Reason: kit.ReasonIPFamilyNotForwarded, Message: notForwarded, Warning: true}
	}
	o.set(true, kit.ReasonProxyReady, msg)
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
	kit.SetCondition(&st.Conditions, kit.ConditionProxyReady, o.ready, o.reason, o.message, gen)
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
	reason = kit.ReasonProxyFailed
	var parts []string
	for _, f := range needed {
		p, ok := problems[f]
		if !ok {
			return "", ""
		}
		if p.Reason == contract.FamilyForwardingOff {
			reason = kit.ReasonIPForwardingDisabled
		}
		parts = append(parts, p.Message)
	}
	return reason, "the proxy cannot forward traffic: " + strings.Join(parts, "; ")
}

// unserve removes the proxy of a Service that is deleted or no longer exposed.
func (r *ServiceReconciler) unserve(ctx context.Context, svc *corev1.Service) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(svc, kit.FinalizerName) {
		r.Forget(client.ObjectKeyFromObject(svc))
		return ctrl.Result{}, nil
	}
	done, refused, err := r.proxies.Teardown(ctx, proxies.ParentOf(proxies.ParentTypeService, svc))
	if refused != nil {
		r.Findings(svc, []kit.Finding{*refused})
	}
	if err != nil {
		return r.TailnetFailure(svc, err)
	}
	if !done {
		return ctrl.Result{RequeueAfter: kit.CleanupPoll}, nil
	}
	return kit.Unserved(ctx, r.Client, r.Reporter, svc, kit.FinalizerName, func(ctx context.Context) error {
		return kit.ClearServiceStatus(ctx, r.Client, svc, ServiceOwned)
	})
}

// SetupWithManager watches Services, their proxies' children and ProxyClasses.
func (r *ServiceReconciler) SetupWithManager(mgr ctrl.Manager, p *proxies.Proxies) error {
	r.proxies = p
	children := handler.EnqueueRequestsFromMapFunc(kit.ParentRequests(proxies.ParentTypeService))
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
		if r.serves(s) && proxies.ProxyClassOf(s, r.Settings.DefaultProxyClass) == o.GetName() {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(s)})
		}
	}
	return reqs
}

// proxyPodName names the Service's proxy Pod, by the StatefulSet's when there is none yet.
func proxyPodName(svc *corev1.Service, pod *corev1.Pod) string {
	if pod != nil {
		return pod.Name
	}
	return proxies.ParentOf(proxies.ParentTypeService, svc).ProxyName() + "-0"
}
