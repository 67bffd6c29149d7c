package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
)

// HAServiceReconciler serves Services annotated tailscale.com/proxy-group at L3 through a
// ProxyGroup: a Tailscale Service whose VIPs every advertising replica DNATs to the Service.
type HAServiceReconciler struct {
	client.Client
	reporter
	Settings   Settings
	docs       groupDocs
	services   *tailscaleServices
	standalone ServiceReconciler // for its selection rules
}

func (r *HAServiceReconciler) serves(s *corev1.Service) bool {
	group := s.Annotations[AnnotationProxyGroup]
	if s.DeletionTimestamp != nil || group == "" {
		return false
	}
	cp := s.DeepCopy()
	delete(cp.Annotations, AnnotationProxyGroup)
	return r.standalone.serves(cp)
}

func (r *HAServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	svc := &corev1.Service{}
	if err := r.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	hostname := haServiceHostname(svc)
	svcName := "svc:" + hostname
	if !r.serves(svc) {
		return r.unserve(ctx, svc, svcName)
	}
	defer func() { r.settle(svc, err == nil) }()
	var st haServiceOutcome
	defer func() {
		want := st.status(svc.Status, svc.Generation, svc.Spec.Type == corev1.ServiceTypeLoadBalancer)
		if perr := patchServiceStatus(ctx, r.Client, svc, haServiceOwned, want); perr != nil && err == nil {
			err = fmt.Errorf("writing Service status: %w", perr)
		}
	}()

	scope, err := r.gather(ctx, svc, hostname)
	if err != nil {
		return ctrl.Result{}, err
	}
	cfg, findings := decideHAService(scope, r.Settings)
	r.findings(svc, findings)
	if hasBlocking(findings) {
		st.invalid(firstBlocking(findings).reason, findingMessages(findings))
		return ctrl.Result{}, nil
	}
	pg := scope.group
	if err := addFinalizer(ctx, r.Client, svc, FinalizerServicePG); err != nil {
		return ctrl.Result{}, err
	}
	ts, err := r.services.ensure(ctx, svcName, []string{"do-not-validate"}, cfg.Tags)
	if err != nil {
		var notOurs errNotOurs
		if errors.As(err, &notOurs) {
			r.warning(svc, ReasonInvalidTailscaleSvc, "%v", err)
			st.invalid(ReasonInvalidTailscaleSvc, err.Error())
			return ctrl.Result{}, nil
		}
		st.failed(ReasonIngressSvcCreateFailed, err.Error())
		return r.tailnetFailure(svc, err)
	}
	if ts.created {
		r.created(svc, ReasonTailscaleServiceCreated, "created Tailscale Service %s (%s) for ProxyGroup %s", svcName, addrList(ts.Addrs), pg.Name)
	}
	vips := vipsFor(ts.Addrs, *cfg.Forward)
	if len(vips) == 0 {
		msg := fmt.Sprintf("the Tailscale Service has addresses %v, none of the Service's IP families (%v); make the Service dual-stack, or give the Tailscale Service an address of its family", ts.Addrs, svc.Spec.IPFamilies)
		r.warning(svc, ReasonUnsupportedIPFamily, "%s", msg)
		st.invalid(ReasonUnsupportedIPFamily, msg)
		// The tailnet is not watched: look again for an address the tailnet may have added.
		return ctrl.Result{RequeueAfter: tailnetRetry}, nil
	}
	st.valid()
	owner, here := ownerOf("Service", svc), placement{uid: svc.UID, pg: pg.Name, svcName: svcName}
	if !r.docs.placedAt(owner, here) {
		if err := r.docs.removeElsewhere(ctx, svcName, pg.Name); err != nil {
			return ctrl.Result{}, err
		}
		if err := releaseOwned(ctx, r.docs, r.services, owner, svcName); err != nil {
			return r.tailnetFailure(svc, err)
		}
		r.docs.place(owner, here)
	}
	if err := r.docs.setDNAT(ctx, pg.Name, svcName, &contract.DNATService{VIPs: vips, Destination: *cfg.Forward}, owner); err != nil {
		if errors.Is(err, errConfigFull) {
			st.failed(ReasonConfigMapFull, err.Error())
		}
		// Otherwise (a conflict, the group's ConfigMap not created yet) the Service stays
		// waiting for its replicas, and the retry or the ConfigMap's creation brings it back.
		return docsFailure(r.reporter, svc, err)
	}
	n, total, domain, dnatErrs, err := advertisers(ctx, r.Client, r.Settings.Namespace, pg, svcName)
	if err != nil {
		return ctrl.Result{}, err
	}
	st.configured(n, total, hostname+"."+domain, vips, dnatErrs)
	if n > 0 {
		r.progress(svc, "serving", ReasonServing, "serving %s at %s through ProxyGroup %s", svcName, strings.Join(vips, ", "), pg.Name)
	}
	return ctrl.Result{RequeueAfter: ts.recheck}, nil
}

// haServiceScope is what a pass reads about a Service on a ProxyGroup before it decides.
type haServiceScope struct {
	svc      *corev1.Service
	hostname string
	// group is the ProxyGroup named, or nil with groupFinding saying why it cannot serve.
	group        *tsv1alpha1.ProxyGroup
	groupFinding *finding
	// takenBy is another Service that already serves the hostname on a ProxyGroup.
	takenBy string
}

func (r *HAServiceReconciler) gather(ctx context.Context, svc *corev1.Service, hostname string) (haServiceScope, error) {
	s := haServiceScope{svc: svc, hostname: hostname}
	var err error
	if s.group, s.groupFinding, err = resolveGroup(ctx, r.Client, svc.Annotations[AnnotationProxyGroup]); err != nil {
		return s, err
	}
	s.takenBy, err = r.hostnameTakenBy(ctx, svc, hostname)
	return s, err
}

// decideHAService decides what a Service asks its ProxyGroup to forward, or why it cannot be
// served (every finding blocks).
func decideHAService(s haServiceScope, settings Settings) (*contract.ProxyConfig, []finding) {
	cfg, findings := serviceProxyConfig(s.svc, settings)
	if s.groupFinding != nil {
		findings = append(findings, *s.groupFinding)
	}
	if s.takenBy != "" {
		findings = append(findings, blockf(ReasonDuplicateHostname, "Service %s already serves %s on a ProxyGroup; hostnames must be unique", s.takenBy, s.hostname))
	}
	return cfg, findings
}

// hostnameTakenBy returns another HA Service that serves hostname and came first.
func (r *HAServiceReconciler) hostnameTakenBy(ctx context.Context, svc *corev1.Service, hostname string) (string, error) {
	list := &corev1.ServiceList{}
	if err := r.List(ctx, list, client.MatchingFields{indexServiceHostname: hostname}); err != nil {
		return "", err
	}
	others := make([]*corev1.Service, len(list.Items))
	for i := range list.Items {
		others[i] = &list.Items[i]
	}
	return takenBy(svc, others, func(o *corev1.Service) bool { return r.serves(o) && haServiceHostname(o) == hostname }, FinalizerServicePG), nil
}

// haServiceOwned is the status the reconciler owns on a Service it serves.
var haServiceOwned = serviceStatusOwner{conditions: []string{ConditionIngressSvcValid, ConditionIngressSvcConfigured}}

// haServiceOutcome is what a pass found about a Service on a ProxyGroup. A condition whose
// reason stays empty was not decided in this pass and is left as it was: a control-plane
// outage says nothing about whether the Service is valid.
type haServiceOutcome struct {
	isValid, isConfigured bool
	validReason, validMsg string
	confReason, confMsg   string
	fqdn                  string
	vips                  []string
}

func (o *haServiceOutcome) invalid(reason, msg string) {
	o.isValid, o.validReason, o.validMsg = false, reason, msg
	o.confReason, o.confMsg = reason, "the Service is not valid for a ProxyGroup"
}

func (o *haServiceOutcome) failed(reason, msg string) {
	o.isConfigured, o.confReason, o.confMsg = false, reason, msg
}

func (o *haServiceOutcome) valid() {
	o.isValid, o.validReason, o.validMsg = true, ReasonIngressSvcValid, "the Service can be served by its ProxyGroup"
	o.confReason, o.confMsg = ReasonIngressSvcNoBackends, "waiting for replicas to advertise the Tailscale Service"
}

// configured reports how many replicas advertise the Service and, for the others that cannot
// install its DNAT rules (a family disabled in their Pods, forwarding off), why.
func (o *haServiceOutcome) configured(n, total int, fqdn string, vips, dnatErrs []string) {
	o.confMsg = fmt.Sprintf("%d/%d proxy replicas ready and advertising", n, total)
	if len(dnatErrs) > 0 {
		o.confMsg += "; DNAT rules not in place on " + strings.Join(dnatErrs, "; ")
	}
	if n > 0 {
		o.isConfigured, o.confReason, o.fqdn, o.vips = true, ReasonIngressSvcConfigured, fqdn, vips
	}
}

// status computes a Service's status from a pass's outcome: the conditions it decided and, for
// a LoadBalancer Service, the addresses it is served at once configured.
func (o haServiceOutcome) status(cur corev1.ServiceStatus, gen int64, loadBalancer bool) corev1.ServiceStatus {
	st := *cur.DeepCopy()
	if o.confReason == "" {
		return st
	}
	if o.validReason != "" {
		setCondition(&st.Conditions, ConditionIngressSvcValid, o.isValid, o.validReason, o.validMsg, gen)
	}
	setCondition(&st.Conditions, ConditionIngressSvcConfigured, o.isConfigured, o.confReason, o.confMsg, gen)
	if loadBalancer {
		var lb []corev1.LoadBalancerIngress
		if o.isConfigured {
			lb = []corev1.LoadBalancerIngress{{Hostname: o.fqdn}}
			for _, ip := range o.vips {
				lb = append(lb, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
			}
		}
		st.LoadBalancer.Ingress = lb
	}
	return st
}

// unserve removes a Service's entry from every group and releases its Tailscale Service.
func (r *HAServiceReconciler) unserve(ctx context.Context, svc *corev1.Service, svcName string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(svc, FinalizerServicePG) {
		r.forget(client.ObjectKeyFromObject(svc))
		return ctrl.Result{}, nil
	}
	r.docs.unplace(ownerOf("Service", svc))
	if err := r.docs.removeElsewhere(ctx, svcName, ""); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.services.release(ctx, svcName); err != nil {
		return r.tailnetFailure(svc, err)
	}
	if err := releaseOwned(ctx, r.docs, r.services, ownerOf("Service", svc), ""); err != nil {
		return r.tailnetFailure(svc, err)
	}
	if svc.DeletionTimestamp == nil {
		if err := clearServiceStatus(ctx, r.Client, svc, haServiceOwned); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := removeFinalizer(ctx, r.Client, svc, FinalizerServicePG); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(client.ObjectKeyFromObject(svc))
	return ctrl.Result{}, nil
}

// onGroup lists the Services served on a ProxyGroup.
func (r *HAServiceReconciler) onGroup(ctx context.Context, name string) []reconcile.Request {
	list := &corev1.ServiceList{}
	if err := r.List(ctx, list, client.MatchingFields{indexServiceGroup: name}); err != nil {
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
func (r *HAServiceReconciler) SetupWithManager(mgr ctrl.Manager, docs groupDocs, services *tailscaleServices) error {
	r.docs, r.services = docs, services
	r.standalone = ServiceReconciler{Settings: r.Settings}
	group := groupEvents{c: r.Client, docs: docs, kind: "Service", all: r.onGroup}.handler()
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Service{}, builder.WithPredicates(ownWrites(FinalizerServicePG))).
		Named("service-proxygroup").
		WithOptions(haControllerOptions).
		Watches(&tsv1alpha1.ProxyGroup{}, group).
		Watches(&corev1.Secret{}, group).
		Watches(&corev1.ConfigMap{}, group).
		Complete(r)
}
