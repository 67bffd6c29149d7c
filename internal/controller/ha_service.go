package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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

// Conditions of a Service served by a ProxyGroup (the original operator's names).
const (
	ConditionIngressSvcValid      = "TailscaleIngressSvcValid"
	ConditionIngressSvcConfigured = "TailscaleIngressSvcConfigured"
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

func haServiceHostname(s *corev1.Service) string {
	if h := s.Annotations[AnnotationHostname]; h != "" {
		return h
	}
	return truncateLabel(dnsLabelish(s.Namespace + "-" + s.Name))
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
	st := haServiceStatus{svc: svc}
	defer func() { st.write(ctx, r.Client) }()

	pg, f, err := resolveGroup(ctx, r.Client, svc.Annotations[AnnotationProxyGroup])
	if err != nil {
		return ctrl.Result{}, err
	}
	cfg, findings := serviceProxyConfig(svc, r.Settings)
	if f != nil {
		findings = append(findings, *f)
	}
	if other, err := r.hostnameTakenBy(ctx, svc, hostname); err != nil {
		return ctrl.Result{}, err
	} else if other != "" {
		findings = append(findings, blockf(ReasonDuplicateHostname, "Service %s already serves %s on a ProxyGroup; hostnames must be unique", other, hostname))
	}
	r.findings(svc, findings)
	if hasBlocking(findings) {
		st.invalid(firstBlocking(findings).reason, findingMessages(findings))
		return ctrl.Result{}, nil
	}
	if err := addFinalizer(ctx, r.Client, svc, FinalizerServicePG); err != nil {
		return ctrl.Result{}, err
	}
	ts, created, err := r.services.ensure(ctx, svcName, []string{"do-not-validate"}, cfg.Tags)
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
	if created {
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
	if err := r.docs.removeElsewhere(ctx, svcName, pg.Name); err != nil {
		return ctrl.Result{}, err
	}
	if err := releaseOwned(ctx, r.docs, r.services, ownerOf("Service", svc), svcName); err != nil {
		return r.tailnetFailure(svc, err)
	}
	if err := r.docs.setDNAT(ctx, pg.Name, svcName, &contract.DNATService{VIPs: vips, Destination: *cfg.Forward}, ownerOf("Service", svc)); err != nil {
		if errors.Is(err, errConfigFull) {
			st.failed(ReasonConfigMapFull, err.Error())
		}
		// Otherwise (a conflict, the group's ConfigMap not created yet) the Service stays
		// waiting for its replicas, and the retry or the ConfigMap's creation brings it back.
		return r.docsFailure(svc, err)
	}
	n, total, domain, err := advertisers(ctx, r.Client, r.Settings.Namespace, pg, svcName)
	if err != nil {
		return ctrl.Result{}, err
	}
	st.configured(n, total, hostname+"."+domain, vips)
	if n > 0 {
		r.progress(svc, "serving", ReasonServing, "serving %s at %s through ProxyGroup %s", svcName, strings.Join(vips, ", "), pg.Name)
	}
	return ctrl.Result{}, nil
}

// hostnameTakenBy returns another HA Service that serves hostname and came first.
func (r *HAServiceReconciler) hostnameTakenBy(ctx context.Context, svc *corev1.Service, hostname string) (string, error) {
	list := &corev1.ServiceList{}
	if err := r.List(ctx, list); err != nil {
		return "", err
	}
	others := make([]*corev1.Service, len(list.Items))
	for i := range list.Items {
		others[i] = &list.Items[i]
	}
	return takenBy(svc, others, func(o *corev1.Service) bool { return r.serves(o) && haServiceHostname(o) == hostname }, FinalizerServicePG), nil
}

// haServiceStatus collects a Service's conditions and load-balancer status during a pass. A
// condition whose reason stays empty was not decided in this pass and is left as it was: a
// control-plane outage says nothing about whether the Service is valid.
type haServiceStatus struct {
	svc                   *corev1.Service
	isValid, isConfigured bool
	validReason, validMsg string
	confReason, confMsg   string
	lb                    []corev1.LoadBalancerIngress
}

func (s *haServiceStatus) invalid(reason, msg string) {
	s.isValid, s.validReason, s.validMsg = false, reason, msg
	s.confReason, s.confMsg = reason, "the Service is not valid for a ProxyGroup"
}

func (s *haServiceStatus) failed(reason, msg string) {
	s.isConfigured, s.confReason, s.confMsg = false, reason, msg
}

func (s *haServiceStatus) valid() {
	s.isValid, s.validReason, s.validMsg = true, ReasonIngressSvcValid, "the Service can be served by its ProxyGroup"
	s.confReason, s.confMsg = ReasonIngressSvcNoBackends, "waiting for replicas to advertise the Tailscale Service"
}

func (s *haServiceStatus) configured(n, total int, fqdn string, vips []string) {
	s.confMsg = fmt.Sprintf("%d/%d proxy replicas ready and advertising", n, total)
	if n == 0 {
		return
	}
	s.isConfigured, s.confReason = true, ReasonIngressSvcConfigured
	if s.svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		s.lb = []corev1.LoadBalancerIngress{{Hostname: fqdn}}
		for _, ip := range vips {
			s.lb = append(s.lb, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
		}
	}
}

func (s *haServiceStatus) write(ctx context.Context, c client.Client) {
	if s.confReason == "" {
		return
	}
	before := s.svc.DeepCopy()
	gen := s.svc.Generation
	if s.validReason != "" {
		setCondition(&s.svc.Status.Conditions, ConditionIngressSvcValid, s.isValid, s.validReason, s.validMsg, gen)
	}
	setCondition(&s.svc.Status.Conditions, ConditionIngressSvcConfigured, s.isConfigured, s.confReason, s.confMsg, gen)
	if s.svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		s.svc.Status.LoadBalancer.Ingress = s.lb
	}
	if !equality.Semantic.DeepEqual(before.Status, s.svc.Status) {
		if err := c.Status().Patch(ctx, s.svc, client.MergeFrom(before)); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "writing Service status")
		}
	}
}

// unserve removes a Service's entry from every group and releases its Tailscale Service.
func (r *HAServiceReconciler) unserve(ctx context.Context, svc *corev1.Service, svcName string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(svc, FinalizerServicePG) {
		r.forget(client.ObjectKeyFromObject(svc))
		return ctrl.Result{}, nil
	}
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
		if err := clearServiceStatus(ctx, r.Client, svc, ConditionIngressSvcValid, ConditionIngressSvcConfigured); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := removeFinalizer(ctx, r.Client, svc, FinalizerServicePG); err != nil {
		return ctrl.Result{}, err
	}
	r.forget(client.ObjectKeyFromObject(svc))
	return ctrl.Result{}, nil
}

// SetupWithManager watches Services, ProxyGroups and their children.
func (r *HAServiceReconciler) SetupWithManager(mgr ctrl.Manager, docs groupDocs, services *tailscaleServices) error {
	r.docs, r.services = docs, services
	r.standalone = ServiceReconciler{Settings: r.Settings}
	forGroup := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		name := groupOf(o)
		if name == "" {
			return nil
		}
		list := &corev1.ServiceList{}
		if err := r.List(ctx, list); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		for i := range list.Items {
			s := &list.Items[i]
			if s.Annotations[AnnotationProxyGroup] == name && r.serves(s) {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(s)})
			}
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.Service{}).
		Named("service-proxygroup").
		Watches(&tsv1alpha1.ProxyGroup{}, forGroup).
		Watches(&corev1.Secret{}, forGroup).
		Watches(&corev1.ConfigMap{}, forGroup).
		Complete(r)
}
