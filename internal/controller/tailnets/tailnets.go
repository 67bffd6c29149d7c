// Package tailnets holds the Tailnet reconciler. This operator serves its own tailnet only: it
// accepts the Tailscale operator's Tailnet kind, so that manifests written for it apply, and
// reports each Tailnet as not served rather than leaving it without a word.
package tailnets

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// TailnetReconciler reports TailnetReady=False on every Tailnet; it owns that condition.
type TailnetReconciler struct {
	client.Client
	kit.Reporter
}

// +kubebuilder:rbac:groups=tailscale.com,resources=tailnets,verbs=get;list;watch
// +kubebuilder:rbac:groups=tailscale.com,resources=tailnets/status,verbs=get;update;patch

func (r *TailnetReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, err error) {
	tn := &tsv1alpha1.Tailnet{}
	if err := r.Get(ctx, req.NamespacedName, tn); err != nil {
		if apierrors.IsNotFound(err) {
			r.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	defer func() { r.Settle(tn, err == nil) }()
	before := tn.DeepCopy()
	msg := notServed(tn)
	r.Warning(tn, kit.ReasonTailnetNotServed, "%s", msg)
	if kit.SetCondition(&tn.Status.Conditions, tsv1alpha1.TailnetReady, false, kit.ReasonTailnetNotServed, msg, tn.Generation) {
		if err := kit.PatchStatus(ctx, r.Client, before, tn); err != nil {
			return ctrl.Result{}, fmt.Errorf("writing the status of Tailnet %s: %w", tn.Name, err)
		}
	}
	return ctrl.Result{}, nil
}

// notServed says why a Tailnet is not joined, naming what it asked for (never its credentials,
// which the operator does not read).
func notServed(tn *tsv1alpha1.Tailnet) string {
	where := "Tailscale's control server"
	if tn.Spec.LoginURL != "" {
		where = tn.Spec.LoginURL
	}
	return fmt.Sprintf("this operator serves its own tailnet only: ProxyGroups that name Tailnet %s (at %s, credentials in Secret %s) "+
		"are refused with ProxyGroupInvalid; run another operator for that tailnet", tn.Name, where, tn.Spec.Credentials.SecretName)
}

// SetupWithManager watches Tailnets; status-only updates do not retrigger it.
func (r *TailnetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&tsv1alpha1.Tailnet{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("tailnet").
		Complete(r)
}
