// Package gateway holds the operator's Gateway API controllers: for now the GatewayClass
// reconciler, which accepts the classes whose controllerName is ControllerName, and the start of
// those controllers, now when the Gateway API CRDs are served or later, once they are installed,
// without a restart. It must not touch a class of another controller, nor install or change the
// Gateway API CRDs (users install them), and it serves no Gateway or route yet.
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

// discoveryRetry is how soon an Established CRD is looked up again while API discovery does not
// list it yet (it lags the CRD's status by moments).
const discoveryRetry = 2 * time.Second

// Setup starts the Gateway API controllers on mgr now if the GatewayClass CRD is served, else
// once it is installed and Established: the operator runs without the Gateway API CRDs. rep
// reports for the GatewayClass reconciler.
func Setup(mgr ctrl.Manager, rep kit.Reporter) error {
	// In Setup rather than in each caller's scheme: every manager that runs the operator (its
	// main, the test suites, make dev) gets the kinds the controllers read.
	if err := gatewayv1.Install(mgr.GetScheme()); err != nil {
		return fmt.Errorf("adding the Gateway API types to the scheme: %w", err)
	}
	crds, err := newCRDCache(mgr)
	if err != nil {
		return err
	}
	s := &starter{mgr: mgr, crds: crds, rep: rep}
	served, err := crdServed(mgr.GetRESTMapper())
	if err != nil {
		return err
	}
	if served {
		_, err := s.start()
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

// crdServed reports whether API discovery serves GatewayClasses at v1.
func crdServed(mapper meta.RESTMapper) (bool, error) {
	_, err := mapper.RESTMapping(gatewayClassKind, gatewayv1.GroupVersion.Version)
	if meta.IsNoMatchError(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking up the GatewayClass kind: %w", err)
	}
	return true, nil
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
	mgr  ctrl.Manager
	crds cache.Cache
	rep  kit.Reporter

	mu      sync.Mutex
	started bool
}

// start adds the controllers unless they were; it reports whether this call added them.
func (s *starter) start() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return false, nil
	}
	r := &GatewayClassReconciler{Client: s.mgr.GetClient(), Reporter: s.rep, CRDs: s.crds}
	if err := r.SetupWithManager(s.mgr); err != nil {
		return false, fmt.Errorf("setting up the GatewayClass controller: %w", err)
	}
	s.started = true
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
	served, err := crdServed(s.mgr.GetRESTMapper())
	if err != nil {
		return ctrl.Result{}, err
	}
	if !served {
		return ctrl.Result{RequeueAfter: discoveryRetry}, nil
	}
	added, err := s.start()
	if err != nil || !added {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).Info("Gateway API CRDs installed: started the Gateway API controllers",
		"crd", crd.Name, "bundleVersion", crd.Annotations[bundleVersionAnnotation])
	return ctrl.Result{}, nil
}
