package kit

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Served is the skeleton of a reconciler of user objects that the operator may serve (Ingresses,
// Services): it reads the object, hands one it does not serve (any more) to Unserve, and
// otherwise adds Finalizer (when set) and runs Serve, then settles what the reporter was told in
// the pass. Serve owns the rest: gather, decide, apply, and its deferred status patch.
type Served[T client.Object] struct {
	Client   client.Client
	Reporter Reporter
	// Kind names the object in errors ("Ingress", "Service").
	Kind string
	// Finalizer is added before Serve runs; "" leaves adding one to Serve.
	Finalizer string
	New       func() T
	Serves    func(T) bool
	Serve     func(context.Context, T) (ctrl.Result, error)
	Unserve   func(context.Context, T) (ctrl.Result, error)
}

// Reconcile runs one pass over the object named by req.
func (s Served[T]) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	obj := s.New()
	if err := s.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			s.Reporter.Forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading %s %s: %w", s.Kind, req.NamespacedName, err)
	}
	if !s.Serves(obj) {
		return s.Unserve(ctx, obj)
	}
	defer func() { s.Reporter.Settle(obj, err == nil) }()
	if s.Finalizer != "" {
		if err := AddFinalizer(ctx, s.Client, obj, s.Finalizer); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer %s to %s %s: %w", s.Finalizer, s.Kind, req.NamespacedName, err)
		}
	}
	return s.Serve(ctx, obj)
}

// Unserved ends serving obj once what served it is gone: the status the reconciler wrote is
// cleared (unless obj is being deleted), its finalizer removed, and what the reporter was told
// of it forgotten. Each reconciler's unserve ends with it.
func Unserved(ctx context.Context, c client.Client, rep Reporter, obj client.Object, finalizer string, clearStatus func(context.Context) error) (ctrl.Result, error) {
	if obj.GetDeletionTimestamp() == nil {
		if err := clearStatus(ctx); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := RemoveFinalizer(ctx, c, obj, finalizer); err != nil {
		return ctrl.Result{}, err
	}
	rep.Forget(client.ObjectKeyFromObject(obj))
	return ctrl.Result{}, nil
}
