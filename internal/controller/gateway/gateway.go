// Package gateway holds the operator's Gateway API controllers: the GatewayClass reconciler,
// which accepts the classes whose controllerName is ControllerName; the Gateway reconciler, which
// serves their Gateways on standalone proxies or ProxyGroups with the routes of their HTTPRoutes
// and GRPCRoutes; the route reconcilers, which write this controller's entries of the routes'
// status; and the start of
// those controllers, now when the Gateway API CRDs are served or later, once they are installed,
// without a restart. It must not touch a class, Gateway or status entry of another controller,
// nor install or change the Gateway API CRDs (users install them).
package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

// ControllerName is the spec.controllerName of the GatewayClasses this operator serves.
const ControllerName gatewayv1.GatewayController = "tailscale.com/gateway-controller"

// GatewayClassCRD is the name of the CRD the controllers wait for. It is the one they use.
const GatewayClassCRD = "gatewayclasses.gateway.networking.k8s.io"

var gatewayClassKind = schema.GroupKind{Group: gatewayv1.GroupName, Kind: "GatewayClass"}

// servingKinds are the kinds the Gateway and HTTPRoute reconcilers read besides GatewayClasses.
// Their CRDs are installed with it but may reach API discovery later, and a controller set up
// before its kinds are served fails.
var servingKinds = []schema.GroupKind{
	{Group: gatewayv1.GroupName, Kind: "Gateway"},
	{Group: gatewayv1.GroupName, Kind: "HTTPRoute"},
	{Group: gatewayv1.GroupName, Kind: "GRPCRoute"},
	{Group: gatewayv1.GroupName, Kind: "ReferenceGrant"},
}

// discoveryRetry is how soon an Established CRD is looked up again while API discovery does not
// list it yet (it lags the CRD's status by moments).
const discoveryRetry = 2 * time.Second

// Setup starts the Gateway API controllers on mgr now if the GatewayClass CRD is served, else
// once it is installed and Established: the operator runs without the Gateway API CRDs. rep
// reports for the GatewayClass reconciler; serving is what Gateways are served with (nil: the
// GatewayClass reconciler alone, for an operator that serves no proxies).
func Setup(mgr ctrl.Manager, rep kit.Reporter, serving *Serving) error {
	// In Setup rather than in each caller's scheme: every manager that runs the operator (its
	// main, the test suites, make dev) gets the kinds the controllers read.
	if err := gatewayv1.Install(mgr.GetScheme()); err != nil {
		return fmt.Errorf("adding the Gateway API types to the scheme: %w", err)
	}
	crds, err := newCRDCache(mgr)
	if err != nil {
		return err
	}
	s := &starter{mgr: mgr, crds: crds, rep: rep, serving: serving}
	served, err := s.kindsServed()
	if err != nil {
		return err
	}
	if served {
		_, err := s.start(context.Background())
		return err
	}
	ctrl.Log.WithName("gateway").Info("Gateway API CRDs not installed: the Gateway API controllers start once they are", "crd", GatewayClassCRD)
	return ctrl.NewControllerManagedBy(mgr).
		Named("gateway-api-crds").
		WatchesRawSource(source.Kind(crds, &apiextensionsv1.CustomResourceDefinition{},
			&handler.TypedEnqueueRequestForObject[*apiextensionsv1.CustomResourceDefinition]{})).
		Complete(s)
}

// newCRDCache caches the GatewayClass CRD alone, selected by name: the operator may list and
// watch that CRD and no other (config/rbac), and reads its bundle version from it.
func newCRDCache(mgr ctrl.Manager) (cache.Cache, error) {
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building the scheme of the CRD cache: %w", err)
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(),
		Scheme:     scheme,
		Mapper:     mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&apiextensionsv1.CustomResourceDefinition{}: {Field: fields.OneTermEqualSelector("metadata.name", GatewayClassCRD)},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("building the cache of the Gateway API CRDs: %w", err)
	}
	if err := mgr.Add(c); err != nil {
		return nil, fmt.Errorf("adding the cache of the Gateway API CRDs to the manager: %w", err)
	}
	return c, nil
}

// crdServed reports whether API discovery serves the kinds at v1.
func crdServed(mapper meta.RESTMapper, kinds ...schema.GroupKind) (bool, error) {
	for _, k := range kinds {
		_, err := mapper.RESTMapping(k, gatewayv1.GroupVersion.Version)
		if meta.IsNoMatchError(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("looking up the %s kind: %w", k.Kind, err)
		}
	}
	return true, nil
}

// kindsServed reports whether API discovery serves every kind the controllers read.
func (s *starter) kindsServed() (bool, error) {
	kinds := []schema.GroupKind{gatewayClassKind}
	if s.serving != nil {
		kinds = append(kinds, servingKinds...)
	}
	return crdServed(s.mgr.GetRESTMapper(), kinds...)
}

// crdReady reports whether a CRD is Established and serves v1.
func crdReady(crd *apiextensionsv1.CustomResourceDefinition) bool {
	established := false
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			established = true
		}
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == gatewayv1.GroupVersion.Version && v.Served {
			return established
		}
	}
	return false
}

// starter adds the Gateway API controllers to the manager, once. Without the CRDs at start it
// is also the reconciler of the CRD watch, and adds them when the CRD is ready.
type starter struct {
	mgr     ctrl.Manager
	crds    cache.Cache
	rep     kit.Reporter
	serving *Serving

	mu sync.Mutex
	// done counts the steps of start taken: a step that failed is retried alone, as a
	// controller or index cannot be added twice.
	done int
}

// start adds the controllers unless they were; it reports whether this call added them.
func (s *starter) start(ctx context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	steps := []func() error{func() error {
		r := &GatewayClassReconciler{Client: s.mgr.GetClient(), Reporter: s.rep, CRDs: s.crds}
		if err := r.SetupWithManager(s.mgr); err != nil {
			return fmt.Errorf("setting up the GatewayClass controller: %w", err)
		}
		return nil
	}}
	if s.serving != nil {
		c := common{Client: s.mgr.GetClient(), Serving: s.serving}
		steps = append(steps, func() error { return indexRoutes(ctx, s.mgr) }, func() error {
			if err := (&GatewayReconciler{common: c, Reporter: s.serving.Gateways}).SetupWithManager(s.mgr); err != nil {
				return fmt.Errorf("setting up the Gateway controller: %w", err)
			}
			return nil
		}, func() error {
			if err := (&RouteReconciler{common: c, Reporter: s.serving.Routes, Kind: kindHTTPRoute}).SetupWithManager(s.mgr); err != nil {
				return fmt.Errorf("setting up the HTTPRoute controller: %w", err)
			}
			return nil
		}, func() error {
			if err := (&RouteReconciler{common: c, Reporter: s.serving.GRPCRoutes, Kind: kindGRPCRoute}).SetupWithManager(s.mgr); err != nil {
				return fmt.Errorf("setting up the GRPCRoute controller: %w", err)
			}
			return nil
		})
	}
	if s.done == len(steps) {
		return false, nil
	}
	for ; s.done < len(steps); s.done++ {
		if err := steps[s.done](); err != nil {
			return false, err
		}
	}
	return true, nil
}

func (s *starter) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := s.crds.Get(ctx, req.NamespacedName, crd); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading CRD %s: %w", req.Name, err)
	}
	if !crdReady(crd) {
		return ctrl.Result{}, nil // its next change is watched
	}
	served, err := s.kindsServed()
	if err != nil {
		return ctrl.Result{}, err
	}
	if !served {
		return ctrl.Result{RequeueAfter: discoveryRetry}, nil
	}
	added, err := s.start(ctx)
	if err != nil || !added {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).Info("Gateway API CRDs installed: started the Gateway API controllers",
		"crd", crd.Name, "bundleVersion", crd.Annotations[bundleVersionAnnotation])
	return ctrl.Result{}, nil
}
