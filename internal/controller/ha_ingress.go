package controller

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
)

// HAIngressReconciler serves Ingresses annotated tailscale.com/proxy-group through a
// ProxyGroup: one Tailscale Service each, in the group's Serve config.
type HAIngressReconciler struct {
	client.Client
	reporter
	Settings Settings
	docs     groupDocs
	services *tailscaleServices
}

func (r *HAIngressReconciler) serves(ing *networkingv1.Ingress) bool {
	return ing.DeletionTimestamp == nil &&
		ing.Spec.IngressClassName != nil && *ing.Spec.IngressClassName == r.Settings.IngressClassName &&
		ing.Annotations[AnnotationProxyGroup] != ""
}

func (r *HAIngressReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ing := &networkingv1.Ingress{}
	if err := r.Get(ctx, req.NamespacedName, ing); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	hostname := ingressHostname(ing)
	svcName := "svc:" + hostname
	if !r.serves(ing) {
		return r.unserve(ctx, ing, svcName)
	}
	pg, f, err := resolveGroup(ctx, r.Client, ing.Annotations[AnnotationProxyGroup])
	if err != nil {
		return ctrl.Result{}, err
	}
	findings := []finding{}
	if f != nil {
		findings = append(findings, *f)
	}
	if !contract.ValidHostname(hostname) {
		findings = append(findings, warnf(ReasonInvalidHostname, "tailnet hostname %q (from the first TLS host) is not a valid DNS label", hostname))
	} else if other, err := r.hostnameTakenBy(ctx, ing, hostname); err != nil {
		return ctrl.Result{}, err
	} else if other != "" {
		findings = append(findings, warnf(ReasonDuplicateHostname, "Ingress %s already serves %s on a ProxyGroup; hostnames must be unique", other, hostname))
	}
	services, err := backendServices(ctx, r.Client, ing)
	if err != nil {
		return ctrl.Result{}, err
	}
	ws, routeFindings := buildWebService(ing, services)
	findings = append(findings, routeFindings...)
	tags, tf := parseTags(ing, r.Settings.DefaultTags)
	if tf != nil {
		findings = append(findings, *tf)
	}
	r.findings(ing, findings)
	if len(ws.Routes) == 0 {
		r.eventf(ing, corev1.EventTypeWarning, ReasonNoValidBackends, "no path of this Ingress can be served; nothing changed")
	}
	if len(ws.Routes) == 0 || tags == nil || hasBlocking(findings) {
		return ctrl.Result{}, nil
	}

	if err := addFinalizer(ctx, r.Client, ing, FinalizerIngressPG); err != nil {
		return ctrl.Result{}, err
	}
	ports := []string{"tcp:443"}
	if ws.HTTP != contract.HTTPOff {
		ports = append(ports, "tcp:80")
	}
	if _, err := r.services.ensure(ctx, svcName, ports, tags); err != nil {
		var notOurs errNotOurs
		if errors.As(err, &notOurs) {
			r.eventf(ing, corev1.EventTypeWarning, ReasonInvalidTailscaleSvc, "%v", err)
			return ctrl.Result{}, nil
		}
		return r.tailnetFailure(ing, err)
	}
	if err := r.docs.removeElsewhere(ctx, svcName, pg.Name); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.docs.setServe(ctx, pg.Name, svcName, &ws); err != nil {
		return r.docsFailure(ing, err)
	}
	return ctrl.Result{}, r.updateStatus(ctx, ing, pg, hostname, svcName, ws.HTTP != contract.HTTPOff)
}

// hasBlocking reports whether a finding stops an object from being served, as opposed to a
// route that is merely skipped.
func hasBlocking(fs []finding) bool {
	for _, f := range fs {
		switch f.reason {
		case ReasonProxyGroupNotFound, ReasonProxyGroupWrongType, ReasonInvalidHostname, ReasonDuplicateHostname:
			return true
		}
	}
	return false
}

// docsFailure reports a group document that cannot be written.
func (r reporter) docsFailure(obj client.Object, err error) (ctrl.Result, error) {
	if errors.Is(err, errConfigFull) {
		r.eventf(obj, corev1.EventTypeWarning, ReasonConfigMapFull, "%v", err)
		return ctrl.Result{}, nil
	}
	if apierrors.IsNotFound(err) {
		// The ProxyGroup has not created its ConfigMap yet; its creation brings us back.
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

// hostnameTakenBy returns another HA Ingress that serves hostname and came first.
func (r *HAIngressReconciler) hostnameTakenBy(ctx context.Context, ing *networkingv1.Ingress, hostname string) (string, error) {
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list); err != nil {
		return "", err
	}
	others := make([]*networkingv1.Ingress, len(list.Items))
	for i := range list.Items {
		others[i] = &list.Items[i]
	}
	return takenBy(ing, others, func(o *networkingv1.Ingress) bool { return r.serves(o) && ingressHostname(o) == hostname }, FinalizerIngressPG), nil
}

func (r *HAIngressReconciler) updateStatus(ctx context.Context, ing *networkingv1.Ingress, pg *tsv1alpha1.ProxyGroup, hostname, svcName string, http bool) error {
	n, _, domain, err := advertisers(ctx, r.Client, r.Settings.Namespace, pg, svcName)
	if err != nil {
		return err
	}
	var want []networkingv1.IngressLoadBalancerIngress
	if n > 0 && domain != "" {
		ports := []networkingv1.IngressPortStatus{{Port: 443, Protocol: corev1.ProtocolTCP}}
		if http {
			ports = append(ports, networkingv1.IngressPortStatus{Port: 80, Protocol: corev1.ProtocolTCP})
		}
		want = []networkingv1.IngressLoadBalancerIngress{{Hostname: hostname + "." + domain, Ports: ports}}
	}
	return setIngressLoadBalancer(ctx, r.Client, ing, want)
}

// unserve removes an Ingress's entry from every group and releases its Tailscale Service.
func (r *HAIngressReconciler) unserve(ctx context.Context, ing *networkingv1.Ingress, svcName string) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ing, FinalizerIngressPG) {
		return ctrl.Result{}, nil
	}
	if err := r.docs.removeElsewhere(ctx, svcName, ""); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.services.release(ctx, svcName); err != nil {
		return r.tailnetFailure(ing, err)
	}
	if ing.DeletionTimestamp == nil {
		if err := setIngressLoadBalancer(ctx, r.Client, ing, nil); err != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{}, removeFinalizer(ctx, r.Client, ing, FinalizerIngressPG)
}

// SetupWithManager watches Ingresses, backend Services, ProxyGroups and their state Secrets.
func (r *HAIngressReconciler) SetupWithManager(mgr ctrl.Manager, docs groupDocs, services *tailscaleServices) error {
	r.docs, r.services = docs, services
	return ctrl.NewControllerManagedBy(mgr).
		For(&networkingv1.Ingress{}).
		Named("ingress-proxygroup").
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			list := &networkingv1.IngressList{}
			if err := r.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexIngressBackends: o.GetName()}); err != nil {
				return nil
			}
			return ingressRequests(list.Items, r.serves)
		})).
		Watches(&tsv1alpha1.ProxyGroup{}, handler.EnqueueRequestsFromMapFunc(r.forGroup)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.forGroup)).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.forGroup)).
		Complete(r)
}

// forGroup maps a ProxyGroup, or one of its Secrets or ConfigMaps, to the group's Ingresses.
func (r *HAIngressReconciler) forGroup(ctx context.Context, o client.Object) []reconcile.Request {
	name := groupOf(o)
	if name == "" {
		return nil
	}
	list := &networkingv1.IngressList{}
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	return ingressRequests(list.Items, func(ing *networkingv1.Ingress) bool {
		return r.serves(ing) && ing.Annotations[AnnotationProxyGroup] == name
	})
}

// groupOf names the ProxyGroup of a ProxyGroup object or of one of its children.
func groupOf(o client.Object) string {
	if _, ok := o.(*tsv1alpha1.ProxyGroup); ok {
		return o.GetName()
	}
	l := o.GetLabels()
	if l[LabelManaged] == "true" && l[LabelParentType] == parentTypeProxyGroup {
		return l[LabelParentName]
	}
	return ""
}

// backendServices fetches the Services an Ingress routes to; missing ones are left out.
func backendServices(ctx context.Context, c client.Client, ing *networkingv1.Ingress) (map[string]*corev1.Service, error) {
	services := map[string]*corev1.Service{}
	for _, name := range backendServiceNames(ing) {
		svc := &corev1.Service{}
		switch err := c.Get(ctx, client.ObjectKey{Namespace: ing.Namespace, Name: name}, svc); {
		case err == nil:
			services[name] = svc
		case !apierrors.IsNotFound(err):
			return nil, err
		}
	}
	return services, nil
}

// setIngressLoadBalancer writes an Ingress's load-balancer status when it changed.
func setIngressLoadBalancer(ctx context.Context, c client.Client, ing *networkingv1.Ingress, want []networkingv1.IngressLoadBalancerIngress) error {
	if equality.Semantic.DeepEqual(ing.Status.LoadBalancer.Ingress, want) {
		return nil
	}
	before := ing.DeepCopy()
	ing.Status.LoadBalancer.Ingress = want
	return c.Status().Patch(ctx, ing, client.MergeFrom(before))
}
