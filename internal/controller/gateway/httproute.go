package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

// Indexes of HTTPRoutes: by the Gateways they name and the Services their backendRefs name,
// each as "namespace/name"; of Gateways on ProxyGroups: by group, and by the hostname they
// claim there.
const (
	indexRouteParents         = "tsingress.httproute.parents"
	indexRouteBackends        = "tsingress.httproute.backends"
	indexGatewayGroup         = "tsingress.gateway.proxygroup"
	indexGatewayGroupHostname = "tsingress.gateway.proxygroup-hostname"
	indexGatewayCertificates  = "tsingress.gateway.certificate-secrets"
)

// RouteReconciler writes this controller's entries of a route's status.parents, for HTTPRoutes
// or (Kind GRPCRoute) GRPCRoutes: one per parentRef to a Gateway of a class of this operator. It
// decides as the Gateway reconciler does, which serves the routes; it writes nothing else.
type RouteReconciler struct {
	common
	kit.Reporter
	Kind gatewayv1.Kind
}

func (r *RouteReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	obj, route, status, err := r.read(ctx, req.NamespacedName)
	if err != nil || obj == nil {
		if obj == nil && err == nil {
			r.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	defer func() { r.Settle(obj, err == nil) }()
	gateways, err := r.gateways(ctx, route)
	if err != nil {
		return ctrl.Result{}, err
	}
	in, err := gatherRouteInputs(ctx, r.Client, []gatewayv1.HTTPRoute{*route})
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decideRoute(route, gateways, in)
	defer func() {
		before := obj.DeepCopyObject().(client.Object)
		*status = routeStatus(*status, d, obj.GetGeneration())
		if perr := kit.PatchStatus(ctx, r.Client, before, obj); perr != nil && err == nil {
			err = fmt.Errorf("writing the status of %s %s: %w", r.Kind, req.NamespacedName, perr)
		}
	}()
	for _, p := range d.Parents {
		if !p.accepted() {
			r.Warning(obj, p.NotAccepted, "Gateway %s: %s", p.Gateway, p.Why)
		}
	}
	if len(d.Parents) > 0 {
		for _, u := range d.Unresolved {
			r.Warning(obj, u.Reason, "%s", u.Message)
		}
	}
	return ctrl.Result{}, nil
}

// newRoute is an empty route of the reconciler's kind.
func (r *RouteReconciler) newRoute() client.Object {
	if r.Kind == kindGRPCRoute {
		return &gatewayv1.GRPCRoute{}
	}
	return &gatewayv1.HTTPRoute{}
}

// read reads the route of the reconciler's kind, as itself, as the HTTPRoute it is served as,
// and its status to write; nil when it does not exist.
func (r *RouteReconciler) read(ctx context.Context, key types.NamespacedName) (client.Object, *gatewayv1.HTTPRoute, *gatewayv1.RouteStatus, error) {
	obj := r.newRoute()
	if err := r.Get(ctx, key, obj); err != nil {
		return nil, nil, nil, client.IgnoreNotFound(fmt.Errorf("reading %s %s: %w", r.Kind, key, err))
	}
	if g, ok := obj.(*gatewayv1.GRPCRoute); ok {
		return g, grpcAsHTTP(g), &g.Status.RouteStatus, nil
	}
	h := obj.(*gatewayv1.HTTPRoute)
	return h, h, &h.Status.RouteStatus, nil
}

// gateways reads and decides the Gateways of a class of this operator that the route names.
func (r *RouteReconciler) gateways(ctx context.Context, route *gatewayv1.HTTPRoute) (map[types.NamespacedName]*gatewayView, error) {
	out := map[types.NamespacedName]*gatewayView{}
	for _, key := range parentKeys(route) {
		gw := &gatewayv1.Gateway{}
		if err := r.Get(ctx, key, gw); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading Gateway %s: %w", key, err)
		}
		if ours, err := r.ours(ctx, gw); err != nil || !ours || gw.DeletionTimestamp != nil {
			if err != nil {
				return nil, err
			}
			continue
		}
		in, err := r.gatherGateway(ctx, gw)
		if err != nil {
			return nil, err
		}
		view, _ := decideGateway(gw, in, r.Settings.DefaultTags)
		out[key] = &view
	}
	return out, nil
}

// listRoutes lists the HTTPRoutes and GRPCRoutes that opts select, each as the HTTPRoute it is
// served as.
func listRoutes(ctx context.Context, c client.Reader, opts ...client.ListOption) ([]gatewayv1.HTTPRoute, error) {
	hl := &gatewayv1.HTTPRouteList{}
	if err := c.List(ctx, hl, opts...); err != nil {
		return nil, fmt.Errorf("listing HTTPRoutes: %w", err)
	}
	gl := &gatewayv1.GRPCRouteList{}
	if err := c.List(ctx, gl, opts...); err != nil {
		return nil, fmt.Errorf("listing GRPCRoutes: %w", err)
	}
	out := hl.Items
	for i := range gl.Items {
		out = append(out, *grpcAsHTTP(&gl.Items[i]))
	}
	return out, nil
}

// asHTTPRoute is an HTTPRoute or GRPCRoute as the HTTPRoute it is served as.
func asHTTPRoute(o client.Object) *gatewayv1.HTTPRoute {
	if g, ok := o.(*gatewayv1.GRPCRoute); ok {
		return grpcAsHTTP(g)
	}
	return o.(*gatewayv1.HTTPRoute)
}

// gatherRouteInputs reads the labels of the routes' namespaces, the Services the routes name and
// the ReferenceGrants of the namespaces of those in another namespace than their route's.
func gatherRouteInputs(ctx context.Context, c client.Client, routes []gatewayv1.HTTPRoute) (routeInputs, error) {
	in := routeInputs{Services: map[types.NamespacedName]*corev1.Service{}, NamespaceLabels: map[string]labels.Set{}}
	grantNS := map[string]bool{}
	for i := range routes {
		if ns := routes[i].Namespace; in.NamespaceLabels[ns] == nil {
			meta := namespaceMetadata()
			if err := c.Get(ctx, client.ObjectKey{Name: ns}, meta); client.IgnoreNotFound(err) != nil {
				return in, fmt.Errorf("reading the labels of namespace %s: %w", ns, err)
			}
			in.NamespaceLabels[ns] = labels.Set(meta.Labels)
			if in.NamespaceLabels[ns] == nil {
				in.NamespaceLabels[ns] = labels.Set{}
			}
		}
		for _, key := range backendKeys(&routes[i]) {
			if key.Namespace != routes[i].Namespace {
				grantNS[key.Namespace] = true
			}
			if _, done := in.Services[key]; done {
				continue
			}
			svc := &corev1.Service{}
			switch err := c.Get(ctx, key, svc); {
			case err == nil:
				in.Services[key] = svc
			case !apierrors.IsNotFound(err):
				return in, fmt.Errorf("reading backend Service %s: %w", key, err)
			}
		}
	}
	for ns := range grantNS {
		list := &gatewayv1.ReferenceGrantList{}
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return in, fmt.Errorf("listing the ReferenceGrants of namespace %s: %w", ns, err)
		}
		in.Grants = append(in.Grants, list.Items...)
	}
	return in, nil
}

// namespaceMetadata is a Namespace's metadata, which is all routes are decided by: the
// operator watches no more of Namespaces than that.
func namespaceMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return m
}

// The labels of routes' namespaces, which listeners' allowedRoutes select by: metadata only.
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch

// parentKeys lists the Gateways a route names.
func parentKeys(route *gatewayv1.HTTPRoute) []types.NamespacedName {
	var out []types.NamespacedName
	for _, ref := range route.Spec.ParentRefs {
		if key, ok := gatewayRef(route.Namespace, ref); ok && !slices.Contains(out, key) {
			out = append(out, key)
		}
	}
	return out
}

// indexRoutes registers the indexes of routes and Gateways the reconcilers watch through.
func indexRoutes(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	keys := func(f func(*gatewayv1.HTTPRoute) []types.NamespacedName) client.IndexerFunc {
		return func(o client.Object) []string {
			var out []string
			for _, k := range f(asHTTPRoute(o)) {
				out = append(out, k.String())
			}
			return out
		}
	}
	for _, obj := range []client.Object{&gatewayv1.HTTPRoute{}, &gatewayv1.GRPCRoute{}} {
		if err := idx.IndexField(ctx, obj, indexRouteParents, keys(parentKeys)); err != nil {
			return fmt.Errorf("adding the %s index: %w", indexRouteParents, err)
		}
		if err := idx.IndexField(ctx, obj, indexRouteBackends, keys(backendKeys)); err != nil {
			return fmt.Errorf("adding the %s index: %w", indexRouteBackends, err)
		}
	}
	onGroup := func(f func(*gatewayv1.Gateway) string) client.IndexerFunc {
		return func(o client.Object) []string {
			gw := o.(*gatewayv1.Gateway)
			if gw.Annotations[kit.AnnotationProxyGroup] == "" {
				return nil
			}
			return []string{f(gw)}
		}
	}
	if err := idx.IndexField(ctx, &gatewayv1.Gateway{}, indexGatewayGroup, onGroup(func(gw *gatewayv1.Gateway) string {
		return gw.Annotations[kit.AnnotationProxyGroup]
	})); err != nil {
		return fmt.Errorf("adding the %s index: %w", indexGatewayGroup, err)
	}
	if err := idx.IndexField(ctx, &gatewayv1.Gateway{}, indexGatewayGroupHostname, onGroup(gatewayHostname)); err != nil {
		return fmt.Errorf("adding the %s index: %w", indexGatewayGroupHostname, err)
	}
	if err := idx.IndexField(ctx, &gatewayv1.Gateway{}, indexGatewayCertificates, gatewayCertificateKeys); err != nil {
		return fmt.Errorf("adding the %s index: %w", indexGatewayCertificates, err)
	}
	return nil
}

// SetupWithManager watches routes of the reconciler's kind (not their status), the Gateways
// they name, the Services and ReferenceGrants their backendRefs resolve through, and the labels
// of their namespaces.
func (r *RouteReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(r.newRoute(), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named(strings.ToLower(string(r.Kind))).
		Watches(&gatewayv1.Gateway{}, handler.EnqueueRequestsFromMapFunc(r.routesOf(indexRouteParents))).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.routesOf(indexRouteBackends))).
		Watches(&gatewayv1.ReferenceGrant{}, handler.EnqueueRequestsFromMapFunc(r.routesFrom)).
		WatchesMetadata(namespaceMetadata(), handler.EnqueueRequestsFromMapFunc(r.routesIn), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Complete(r)
}

// routesIn maps a Namespace to the routes of the reconciler's kind in it.
func (r *RouteReconciler) routesIn(ctx context.Context, o client.Object) []reconcile.Request {
	routes, err := listRoutes(ctx, r.Client, client.InNamespace(o.GetName()))
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing routes", "namespace", o.GetName())
		return nil
	}
	return r.requests(routes)
}

// routesOf maps an object to the routes of the reconciler's kind that name it through an index.
func (r *RouteReconciler) routesOf(index string) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		routes, err := listRoutes(ctx, r.Client, client.MatchingFields{index: client.ObjectKeyFromObject(o).String()})
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing routes", "index", index)
			return nil
		}
		return r.requests(routes)
	}
}

// routesFrom maps a ReferenceGrant to the routes of the namespaces it grants.
func (r *RouteReconciler) routesFrom(ctx context.Context, o client.Object) []reconcile.Request {
	var out []reconcile.Request
	for _, f := range o.(*gatewayv1.ReferenceGrant).Spec.From {
		routes, err := listRoutes(ctx, r.Client, client.InNamespace(string(f.Namespace)))
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing routes", "namespace", f.Namespace)
			return nil
		}
		out = append(out, r.requests(routes)...)
	}
	return out
}

// requests are the requests of the routes of the reconciler's kind.
func (r *RouteReconciler) requests(routes []gatewayv1.HTTPRoute) []reconcile.Request {
	var out []reconcile.Request
	for i := range routes {
		if routeKind(&routes[i]) == r.Kind {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&routes[i])})
		}
	}
	return out
}
