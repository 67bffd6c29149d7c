package gateway

import (
	"context"
	"fmt"

	"golang.org/x/mod/semver"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/consts"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

const bundleVersionAnnotation = consts.BundleVersionAnnotation

// supportedBundle is the Gateway API release (major.minor) the operator is built and tested
// with: that of sigs.k8s.io/gateway-api in go.mod.
var supportedBundle = semver.MajorMinor(consts.BundleVersion)

const proxyClassKind = "ProxyClass"

// Condition types of a GatewayClass this reconciler owns.
const (
	conditionAccepted         = string(gatewayv1.GatewayClassConditionStatusAccepted)
	conditionSupportedVersion = string(gatewayv1.GatewayClassConditionStatusSupportedVersion)
)

// GatewayClassReconciler accepts the GatewayClasses whose controllerName is ControllerName and
// reports their status; it reads their ProxyClass (parametersRef) and the GatewayClass CRD's
// bundle version.
type GatewayClassReconciler struct {
	client.Client
	kit.Reporter
	// CRDs caches the GatewayClass CRD.
	CRDs cache.Cache
}

// Classes are read and watched to accept those of ControllerName, and their status written.
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gatewayclasses,verbs=list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gatewayclasses/status,verbs=patch
// The ProxyClass a class's parametersRef names, watched so the class follows its readiness.
// +kubebuilder:rbac:groups=tailscale.com,resources=proxyclasses,verbs=list;watch
// The GatewayClass CRD alone (a field selector on its name), for the start of the controllers
// once it is installed and for its bundle version.
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,resourceNames=gatewayclasses.gateway.networking.k8s.io,verbs=list;watch
// Warning Events for bad parameters and unsupported versions.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

func (r *GatewayClassReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	gc := &gatewayv1.GatewayClass{}
	if err := r.Get(ctx, req.NamespacedName, gc); err != nil {
		if apierrors.IsNotFound(err) {
			r.Forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading GatewayClass %s: %w", req.Name, err)
	}
	if gc.Spec.ControllerName != ControllerName {
		return ctrl.Result{}, nil // another controller's: never touched
	}
	defer func() { r.Settle(gc, err == nil) }()
	scope, err := r.gather(ctx, gc)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		before := gc.DeepCopy()
		gc.Status = classStatus(gc.Status, scope, gc.Generation)
		if perr := kit.PatchStatus(ctx, r.Client, before, gc); perr != nil && err == nil {
			err = fmt.Errorf("writing the status of GatewayClass %s: %w", gc.Name, perr)
		}
	}()
	if scope.invalidParams != "" {
		r.Warning(gc, kit.ReasonInvalidParameters, "%s", scope.invalidParams)
	}
	if msg := versionProblem(scope.bundleVersion); msg != "" {
		r.Warning(gc, kit.ReasonUnsupportedVersion, "%s", msg)
	}
	return ctrl.Result{}, nil
}

// classScope is what a pass found about a class.
type classScope struct {
	// invalidParams says why spec.parametersRef cannot be used; "" when it can or is unset.
	invalidParams string
	// bundleVersion is the GatewayClass CRD's gateway.networking.k8s.io/bundle-version.
	bundleVersion string
}

func (r *GatewayClassReconciler) gather(ctx context.Context, gc *gatewayv1.GatewayClass) (classScope, error) {
	var s classScope
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := r.CRDs.Get(ctx, client.ObjectKey{Name: GatewayClassCRD}, crd); client.IgnoreNotFound(err) != nil {
		return s, fmt.Errorf("reading CRD %s: %w", GatewayClassCRD, err)
	}
	s.bundleVersion = crd.Annotations[bundleVersionAnnotation]
	ref := gc.Spec.ParametersRef
	if ref == nil {
		return s, nil
	}
	if string(ref.Group) != tsv1alpha1.GroupVersion.Group || string(ref.Kind) != proxyClassKind {
		s.invalidParams = fmt.Sprintf("parametersRef names a %s of group %q; only a ProxyClass (group %s) is supported", ref.Kind, ref.Group, tsv1alpha1.GroupVersion.Group)
		return s, nil
	}
	if ref.Namespace != nil {
		s.invalidParams = "parametersRef.namespace must be unset: a ProxyClass is cluster-scoped"
		return s, nil
	}
	pc := &tsv1alpha1.ProxyClass{}
	if err := r.Get(ctx, client.ObjectKey{Name: ref.Name}, pc); err != nil {
		if !apierrors.IsNotFound(err) {
			return s, fmt.Errorf("reading ProxyClass %s: %w", ref.Name, err)
		}
		s.invalidParams = fmt.Sprintf("ProxyClass %q does not exist", ref.Name)
		return s, nil
	}
	if c := meta.FindStatusCondition(pc.Status.Conditions, tsv1alpha1.ProxyClassReady); c == nil ||
		c.Status != metav1.ConditionTrue || c.ObservedGeneration != pc.Generation {
		s.invalidParams = fmt.Sprintf("ProxyClass %q is not ready", ref.Name)
	}
	return s, nil
}

// classStatus computes a class's status from a pass's scope. The reconciler owns the Accepted
// and SupportedVersion conditions and supportedFeatures; other conditions are kept.
func classStatus(status gatewayv1.GatewayClassStatus, s classScope, gen int64) gatewayv1.GatewayClassStatus {
	status = *status.DeepCopy()
	for _, c := range status.Conditions {
		// The spec: a condition written at a newer generation than the one read means the
		// object read is stale; its next event brings the newer one.
		if (c.Type == conditionAccepted || c.Type == conditionSupportedVersion) && c.ObservedGeneration > gen {
			return status
		}
	}
	if s.invalidParams != "" {
		kit.SetCondition(&status.Conditions, conditionAccepted, false, kit.ReasonInvalidParameters, s.invalidParams, gen)
	} else {
		kit.SetCondition(&status.Conditions, conditionAccepted, true, kit.ReasonGatewayClassAccepted, "accepted by "+string(ControllerName), gen)
	}
	// An unsupported version is served on a best-effort basis, as the spec allows: Accepted
	// follows the parameters alone.
	if msg := versionProblem(s.bundleVersion); msg != "" {
		kit.SetCondition(&status.Conditions, conditionSupportedVersion, false, kit.ReasonUnsupportedVersion, msg, gen)
	} else {
		kit.SetCondition(&status.Conditions, conditionSupportedVersion, true, kit.ReasonSupportedVersion,
			fmt.Sprintf("Gateway API CRDs at %s; supported: %s.x", s.bundleVersion, supportedBundle), gen)
	}
	// Features are listed once they are served and pass the conformance suite; no Gateway is
	// served yet.
	status.SupportedFeatures = nil
	return status
}

// versionProblem says why a bundle version is not supported, or "".
func versionProblem(v string) string {
	switch {
	case v == "":
		return fmt.Sprintf("the GatewayClass CRD has no %s annotation; supported: Gateway API %s.x", bundleVersionAnnotation, supportedBundle)
	case !semver.IsValid(v) || semver.MajorMinor(v) != supportedBundle:
		return fmt.Sprintf("the Gateway API CRDs are at %s; supported: %s.x (others best effort)", v, supportedBundle)
	}
	return ""
}

func ours(o client.Object) bool {
	gc, ok := o.(*gatewayv1.GatewayClass)
	return ok && gc.Spec.ControllerName == ControllerName
}

// SetupWithManager watches this controller's classes (not their status), the ProxyClasses they
// name and the GatewayClass CRD.
func (r *GatewayClassReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&gatewayv1.GatewayClass{}, builder.WithPredicates(predicate.NewPredicateFuncs(ours), predicate.GenerationChangedPredicate{})).
		Named("gatewayclass").
		Watches(&tsv1alpha1.ProxyClass{}, handler.EnqueueRequestsFromMapFunc(r.classesNaming)).
		WatchesRawSource(source.Kind(r.CRDs, &apiextensionsv1.CustomResourceDefinition{},
			handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ *apiextensionsv1.CustomResourceDefinition) []reconcile.Request {
				return r.classes(ctx, func(*gatewayv1.GatewayClass) bool { return true })
			}))).
		Complete(r)
}

// classesNaming lists this controller's classes whose parametersRef names the ProxyClass pc.
func (r *GatewayClassReconciler) classesNaming(ctx context.Context, pc client.Object) []reconcile.Request {
	return r.classes(ctx, func(gc *gatewayv1.GatewayClass) bool {
		ref := gc.Spec.ParametersRef
		return ref != nil && string(ref.Group) == tsv1alpha1.GroupVersion.Group && string(ref.Kind) == proxyClassKind && ref.Name == pc.GetName()
	})
}

// classes lists this controller's classes that keep accepts.
func (r *GatewayClassReconciler) classes(ctx context.Context, keep func(*gatewayv1.GatewayClass) bool) []reconcile.Request {
	list := &gatewayv1.GatewayClassList{}
	if err := r.List(ctx, list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing GatewayClasses")
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if gc := &list.Items[i]; ours(gc) && keep(gc) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: gc.Name}})
		}
	}
	return out
}
