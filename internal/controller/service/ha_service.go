package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// HAServiceReconciler serves Services annotated tailscale.com/proxy-group at L3 through a
// ProxyGroup: a Tailscale Service whose VIPs every advertising replica DNATs to the Service.
type HAServiceReconciler struct {
	client.Client
	kit.Reporter
	Settings kit.Settings
	store    groupstore.Store
}

func (r *HAServiceReconciler) serves(s *corev1.Service) bool {
	group := s.Annotations[kit.AnnotationProxyGroup]
	if s.DeletionTimestamp != nil || group == "" {
		return false
	}
	return exposed(s, r.Settings)
}

func (r *HAServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return kit.Served[*corev1.Service]{
		Client: r.Client, Reporter: r.Reporter, Kind: "Service",
		New: func() *corev1.Service { return &corev1.Service{} }, Serves: r.serves, Serve: r.serve, Unserve: func(ctx context.Context, svc *corev1.Service) (ctrl.Result, error) {
			return r.unserve(ctx, svc, "svc:"+kit.HAServiceHostname(svc))
		},
	}.Reconcile(ctx, req)
}

// serve runs a pass over a Service this reconciler serves; it adds its finalizer once the
// Service is valid.
func (r *HAServiceReconciler) serve(ctx context.Context, svc *corev1.Service) (_ ctrl.Result, err error) {
	hostname := kit.HAServiceHostname(svc)
	svcName := "svc:" + hostname
	var st HAServiceOutcome
	defer func() {
		want := st.Status(svc.Status, svc.Generation, svc.Spec.Type == corev1.ServiceTypeLoadBalancer)
		if perr := kit.PatchServiceStatus(ctx, r.Client, svc, HAServiceOwned, want); perr != nil && err == nil {
			err = fmt.Errorf("writing Service status: %w", perr)
		}
	}()

	scope, err := r.gather(ctx, svc, hostname)
	if err != nil {
		return ctrl.Result{}, err
	}
	cfg, findings := DecideHAService(scope, r.Settings)
	r.Findings(svc, findings)
	if kit.HasBlocking(findings) {
		st.Invalid(kit.FirstBlocking(findings).Reason, findingMessages(findings))
		return ctrl.Result{}, nil
	}
	pg := scope.group
	if err := kit.AddFinalizer(ctx, r.Client, svc, groupstore.FinalizerServicePG); err != nil {
		return ctrl.Result{}, err
	}
	ts, err := r.store.ClaimService(ctx, "Service", svc, svcName, []string{"do-not-validate"}, cfg.Tags)
	if err != nil {
		var notOurs groupstore.ErrNotOurs
		if errors.As(err, &notOurs) {
			r.Warning(svc, kit.ReasonInvalidTailscaleSvc, "%v", err)
			st.Invalid(kit.ReasonInvalidTailscaleSvc, err.Error())
			return ctrl.Result{}, nil
		}
		st.Failed(kit.ReasonIngressSvcCreateFailed, err.Error())
		return r.TailnetFailure(svc, err)
	}
	if ts.Created {
		r.Created(svc, kit.ReasonTailscaleServiceCreated, "created Tailscale Service %s (%s) for ProxyGroup %s", svcName, groupstore.AddrList(ts.Addrs), pg.Name)
	}
	vips := groupstore.VipsFor(ts.Addrs, *cfg.Forward)
	if len(vips) == 0 {
		msg := fmt.Sprintf("the Tailscale Service has addresses %v, none of the Service's IP families (%v); make the Service dual-stack, or give the Tailscale Service an address of its family", ts.Addrs, svc.Spec.IPFamilies)
		r.Warning(svc, kit.ReasonUnsupportedIPFamily, "%s", msg)
		st.Invalid(kit.ReasonUnsupportedIPFamily, msg)
		// The tailnet is not watched: look again for an address the tailnet may have added.
		return ctrl.Result{RequeueAfter: kit.TailnetRetry}, nil
	}
	st.Valid()
	entry := groupstore.Entry{Kind: "Service", Object: svc, Group: pg.Name, Service: svcName, DNAT: &contract.DNATService{VIPs: vips, Destination: *cfg.Forward}}
	if err := r.store.Put(ctx, entry); err != nil {
		if errors.Is(err, groupstore.ErrConfigFull) {
			st.Failed(kit.ReasonConfigMapFull, err.Error())
		}
		// Otherwise (a conflict, the group's ConfigMap not created yet) the Service stays
		// waiting for its replicas, and the retry or the ConfigMap's creation brings it back.
		return groupstore.PutFailure(r.Reporter, svc, err)
	}
	adv, err := r.store.Advertisers(ctx, pg, svcName)
	if err != nil {
		return ctrl.Result{}, err
	}
	st.Configured(adv.Replicas, adv.Total, hostname+"."+adv.Domain, vips, adv.DNATErrors)
	if adv.Replicas > 0 {
		r.Progress(svc, "serving", kit.ReasonServing, "serving %s at %s through ProxyGroup %s", svcName, strings.Join(vips, ", "), pg.Name)
	}
	return ctrl.Result{RequeueAfter: ts.Recheck}, nil
}

// haServiceScope is what a pass reads about a Service on a ProxyGroup before it decides.
type HAServiceScope struct {
	Svc      *corev1.Service
	Hostname string
	// group is the ProxyGroup named, or nil with groupFinding saying why it cannot serve.
	group        *tsv1alpha1.ProxyGroup
	GroupFinding *kit.Finding
	// TakenBy is another object ("Kind namespace/name") that already serves the hostname on a
	// ProxyGroup.
	TakenBy string
}

func (r *HAServiceReconciler) gather(ctx context.Context, svc *corev1.Service, hostname string) (HAServiceScope, error) {
	s := HAServiceScope{Svc: svc, Hostname: hostname}
	var err error
	if s.group, s.GroupFinding, err = groupstore.ResolveGroup(ctx, r.Client, svc.Namespace, svc.Annotations[kit.AnnotationProxyGroup]); err != nil {
		return s, err
	}
	if s.TakenBy, err = r.hostnameTakenBy(ctx, svc, hostname); err != nil || s.TakenBy != "" {
		if s.TakenBy != "" {
			s.TakenBy = "Service " + s.TakenBy
		}
		return s, err
	}
	s.TakenBy, err = groupstore.TakenByOtherKind(ctx, r.store, "Service", "svc:"+hostname)
	return s, err
}

// DecideHAService decides what a Service asks its ProxyGroup to forward, or why it cannot be
// served (every finding blocks but an unsupported annotation's).
func DecideHAService(s HAServiceScope, settings kit.Settings) (*contract.ProxyConfig, []kit.Finding) {
	cfg, findings := ServiceProxyConfig(s.Svc, settings)
	if s.GroupFinding != nil {
		findings = append(findings, *s.GroupFinding)
	}
	if s.TakenBy != "" {
		findings = append(findings, kit.Blockf(kit.ReasonDuplicateHostname, "%s already serves %s on a ProxyGroup; hostnames must be unique", s.TakenBy, s.Hostname))
	}
	if cfg != nil && relaysUDP(cfg.Forward) {
		// A replica can bind a VIP's UDP port only once the tailnet has made it the VIP's host,
		// after it advertises: until then datagrams would reach the backend without a header.
		findings = append(findings, kit.Blockf(kit.ReasonInvalidAnnotation,
			"annotation %s: on a ProxyGroup the PROXY protocol relays TCP ports only; put the UDP ports on a Service of their own, or on a standalone proxy",
			kit.AnnotationProxyProtocol))
	}
	return cfg, findings
}

func relaysUDP(d *contract.Destination) bool {
	for _, p := range d.Ports {
		if p.Protocol == "UDP" {
			return true
		}
	}
	return false
}

// hostnameTakenBy returns another HA Service that serves hostname and came first.
func (r *HAServiceReconciler) hostnameTakenBy(ctx context.Context, svc *corev1.Service, hostname string) (string, error) {
	list := &corev1.ServiceList{}
	if err := r.List(ctx, list, client.MatchingFields{groupstore.IndexServiceHostname: hostname}); err != nil {
		return "", fmt.Errorf("listing the Services that ask for hostname %s: %w", hostname, err)
	}
	others := make([]*corev1.Service, len(list.Items))
	for i := range list.Items {
		others[i] = &list.Items[i]
	}
	return groupstore.TakenBy(svc, others, func(o *corev1.Service) bool { return r.serves(o) && kit.HAServiceHostname(o) == hostname }, groupstore.FinalizerServicePG), nil
}

// haServiceOwned is the status the reconciler owns on a Service it serves.
var HAServiceOwned = kit.ServiceStatusOwner{Conditions: []string{kit.ConditionIngressSvcValid, kit.ConditionIngressSvcConfigured}}

// haServiceOutcome is what a pass found about a Service on a ProxyGroup. A condition whose
// reason stays empty was not decided in this pass and is left as it was: a control-plane
// outage says nothing about whether the Service is valid.
type HAServiceOutcome struct {
	isValid, isConfigured bool
	validReason, validMsg string
	confReason, confMsg   string
	fqdn                  string
	vips                  []string
}

func (o *HAServiceOutcome) Invalid(reason, msg string) {
	o.isValid, o.validReason, o.validMsg = false, reason, msg
	o.confReason, o.confMsg = reason, "the Service is not valid for a ProxyGroup"
}

func (o *HAServiceOutcome) Failed(reason, msg string) {
	o.isConfigured, o.confReason, o.confMsg = false, reason, msg
}

func (o *HAServiceOutcome) Valid() {
	o.isValid, o.validReason, o.validMsg = true, kit.ReasonIngressSvcValid, "the Service can be served by its ProxyGroup"
	o.confReason, o.confMsg = kit.ReasonIngressSvcNoBackends, "waiting for replicas to advertise the Tailscale Service"
}

// Configured reports how many replicas advertise the Service and, for the others that cannot
// install its DNAT rules (a family disabled in their Pods, forwarding off), why.
func (o *HAServiceOutcome) Configured(n, total int, fqdn string, vips, dnatErrs []string) {
	o.confMsg = fmt.Sprintf("%d/%d proxy replicas ready and advertising", n, total)
	if len(dnatErrs) > 0 {
		o.confMsg += "; DNAT rules not in place on " + strings.Join(dnatErrs, "; ")
	}
	if n > 0 {
		o.isConfigured, o.confReason, o.fqdn, o.vips = true, kit.ReasonIngressSvcConfigured, fqdn, vips
	}
}

// Status computes a Service's status from a pass's outcome: the conditions it decided and, for
// a LoadBalancer Service, the addresses it is served at once configured.
func (o HAServiceOutcome) Status(cur corev1.ServiceStatus, gen int64, loadBalancer bool) corev1.ServiceStatus {
	st := *cur.DeepCopy()
	if o.confReason == "" {
		return st
	}
	if o.validReason != "" {
		kit.SetCondition(&st.Conditions, kit.ConditionIngressSvcValid, o.isValid, o.validReason, o.validMsg, gen)
	}
	kit.SetCondition(&st.Conditions, kit.ConditionIngressSvcConfigured, o.isConfigured, o.confReason, o.confMsg, gen)
	if loadBalancer {
		var lb []corev1.LoadBalancerIngress
		if o.isConfigured {
			// As the original writes it, the name and the first address (IPv4 where there is
			// one) in one entry, so that ingress[0].ip reads an address; the others after it.
			lb = []corev1.LoadBalancerIngress{{Hostname: o.fqdn}}
			for i, ip := range ipv4First(o.vips) {
				if i == 0 {
					lb[0].IP, lb[0].IPMode = ip, ptr.To(corev1.LoadBalancerIPModeVIP)
					continue
				}
				lb = append(lb, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
			}
		}
		st.LoadBalancer.Ingress = lb
	}
	return st
}

// ipv4First orders addresses IPv4 first, each family as it came.
func ipv4First(ips []string) []string {
	family := func(ip string) int {
		if strings.Contains(ip, ":") {
			return 6
		}
		return 4
	}
	out := slices.Clone(ips)
	slices.SortStableFunc(out, func(a, b string) int { return family(a) - family(b) })
	return out
}

// unserve removes a Service's entry from every group and releases its Tailscale Service.
func (r *HAServiceReconciler) unserve(ctx context.Context, svc *corev1.Service, svcName string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(svc, groupstore.FinalizerServicePG) {
		r.Forget(client.ObjectKeyFromObject(svc))
		return ctrl.Result{}, nil
	}
	if err := r.store.Withdraw(ctx, "Service", svc, svcName); err != nil {
		return r.TailnetFailure(svc, err)
	}
	return kit.Unserved(ctx, r.Client, r.Reporter, svc, groupstore.FinalizerServicePG, func(ctx context.Context) error {
		return kit.ClearServiceStatus(ctx, r.Client, svc, HAServiceOwned)
	})
}

// onGroup lists the Services served on a ProxyGroup.
func (r *HAServiceReconciler) onGroup(ctx context.Context, name string) []reconcile.Request {
	return r.served(ctx, client.MatchingFields{groupstore.IndexServiceGroup: name})
}

// served lists the Services that opts select and this reconciler serves.
func (r *HAServiceReconciler) served(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	list := &corev1.ServiceList{}
	if err := r.List(ctx, list, append(opts, client.UnsafeDisableDeepCopy)...); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if r.serves(&list.Items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// SetupWithManager watches Services, ProxyGroups and their children.
func (r *HAServiceReconciler) SetupWithManager(mgr ctrl.Manager, store groupstore.Store) error {
	r.store = store
	group := store.Events("Service", r.onGroup)
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Service{}, builder.WithPredicates(groupstore.OwnWrites(groupstore.FinalizerServicePG))).
		Named("service-proxygroup").
		WithOptions(groupstore.HAControllerOptions).
		Watches(&tsv1alpha1.ProxyGroup{}, group).
		Watches(&corev1.Secret{}, group).
		Watches(&corev1.ConfigMap{}, group).
		Watches(&tsv1alpha1.ProxyGroupPolicy{}, handler.EnqueueRequestsFromMapFunc(r.servicesOfNamespace)).
		Complete(r)
}

// servicesOfNamespace lists the Services served on ProxyGroups in o's namespace: a change of
// its ProxyGroupPolicies may let them on a group or keep them from it.
func (r *HAServiceReconciler) servicesOfNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	return r.served(ctx, client.InNamespace(o.GetNamespace()))
}
