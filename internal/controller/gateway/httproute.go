package gateway

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
)

// HTTPRouteReconciler writes this controller's entries of an HTTPRoute's status.parents: one
// per parentRef to a Gateway of a class of this operator. It decides as the Gateway reconciler
// does, which serves the routes; it writes nothing else.
type HTTPRouteReconciler struct {
	common
	kit.Reporter
}

func (r *HTTPRouteReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	route := &gatewayv1.HTTPRoute{}
	if err := r.Get(ctx, req.NamespacedName, route); err != nil {
		if apierrors.IsNotFound(err) {
			r.Forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading HTTPRoute %s: %w", req.NamespacedName, err)
	}
	defer func() { r.Settle(route, err == nil) }()
	gateways, err := r.gateways(ctx, route)
	if err != nil {
		return ctrl.Result{}, err
	}
	in, err := gatherBackends(ctx, r.Client, []gatewayv1.HTTPRoute{*route})
	if err != nil {
		return ctrl.Result{}, err
	}
	d := decideRoute(route, gateways, in)
	defer func() {
		before := route.DeepCopy()
		route.Status = routeStatus(route.Status, d, route.Generation)
		if perr := kit.PatchStatus(ctx, r.Client, before, route); perr != nil && err == nil {
			err = fmt.Errorf("writing the status of HTTPRoute %s: %w", req.NamespacedName, perr)
		}
	}()
	for _, p := range d.Parents {
		if !p.accepted() {
			r.Warning(route, p.NotAccepted, "Gateway %s: %s", p.Gateway, p.Why)
		}
	}
	if len(d.Parents) > 0 {
		for _, u := range d.Unresolved {
			r.Warning(route, u.Reason, "%s", u.Message)
		}
	}
	return ctrl.Result{}, nil
}

// gateways reads and decides the Gateways of a class of this operator that the route names.
func (r *HTTPRouteReconciler) gateways(ctx context.Context, route *gatewayv1.HTTPRoute) (map[types.NamespacedName]*gatewayView, error) {
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

// gatherBackends reads the Services the routes name and the ReferenceGrants of the namespaces
// of those in another namespace than their route's.
func gatherBackends(ctx context.Context, c client.Client, routes []gatewayv1.HTTPRoute) (backendInputs, error) {
	in := backendInputs{Services: map[types.NamespacedName]*corev1.Service{}}
	grantNS := map[string]bool{}
	for i := range routes {
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

// indexRoutes registers the indexes of HTTPRoutes both reconcilers watch through.
func indexRoutes(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	keys := func(f func(*gatewayv1.HTTPRoute) []types.NamespacedName) client.IndexerFunc {
		return func(o client.Object) []string {
			var out []string
			for _, k := range f(o.(*gatewayv1.HTTPRoute)) {
				out = append(out, k.String())
			}
			return out
		}
	}
	if err := idx.IndexField(ctx, &gatewayv1.HTTPRoute{}, indexRouteParents, keys(parentKeys)); err != nil {
		return fmt.Errorf("adding the %s index: %w", indexRouteParents, err)
	}
	if err := idx.IndexField(ctx, &gatewayv1.HTTPRoute{}, indexRouteBackends, keys(backendKeys)); err != nil {
		return fmt.Errorf("adding the %s index: %w", indexRouteBackends, err)
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
	return nil
}

// SetupWithManager watches HTTPRoutes (not their status), the Gateways they name, and the
// Services and ReferenceGrants their backendRefs resolve through.
func (r *HTTPRouteReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&gatewayv1.HTTPRoute{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("httproute").
		Watches(&gatewayv1.Gateway{}, handler.EnqueueRequestsFromMapFunc(r.routesOf(indexRouteParents))).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.routesOf(indexRouteBackends))).
		Watches(&gatewayv1.ReferenceGrant{}, handler.EnqueueRequestsFromMapFunc(r.routesFrom)).
		Complete(r)
}

// routesOf maps an object to the routes that name it through an index.
func (r *HTTPRouteReconciler) routesOf(index string) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		list := &gatewayv1.HTTPRouteList{}
		if err := r.List(ctx, list, client.MatchingFields{index: client.ObjectKeyFromObject(o).String()}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing HTTPRoutes", "index", index)
			return nil
		}
		return routeRequests(list.Items)
	}
}

// routesFrom maps a ReferenceGrant to the routes of the namespaces it grants.
func (r *HTTPRouteReconciler) routesFrom(ctx context.Context, o client.Object) []reconcile.Request {
	var out []reconcile.Request
	for _, f := range o.(*gatewayv1.ReferenceGrant).Spec.From {
		list := &gatewayv1.HTTPRouteList{}
		if err := r.List(ctx, list, client.InNamespace(string(f.Namespace))); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing HTTPRoutes", "namespace", f.Namespace)
			return nil
		}
		out = append(out, routeRequests(list.Items)...)
	}
	return out
}

func routeRequests(items []gatewayv1.HTTPRoute) []reconcile.Request {
	out := make([]reconcile.Request, 0, len(items))
	for i := range items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&items[i])})
	}
	return out
}
