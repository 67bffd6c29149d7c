// Package kit is the toolkit every reconciler of the operator uses: the one apply path for child
// objects, status conditions, the stable reasons and user-facing annotations and labels, the
// Event reporter, the operator's settings, and batched writes to shared objects. It owns no
// reconciler and imports no other controller package; everything else builds on it.
package kit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// fieldOwner is the operator's server-side-apply field manager.
const fieldOwner = "tsingress-operator"

// This file holds every write of the reconcilers: children are applied (or, when their content
// belongs to someone else once they exist, created), shared documents are written under their
// resourceVersion, status is patched once per pass, and children are removed.

// Apply writes a child object. Server-side apply makes it idempotent and lets the operator own
// exactly the fields it sets: the keys a proxy writes into its state Secret belong to the
// proxy's field manager and survive every apply.
func Apply(ctx context.Context, c client.Client, obj client.Object) error {
	if alreadyApplied(ctx, c, obj) {
		return nil
	}
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return fmt.Errorf("finding the kind of %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("converting %s %s/%s for apply: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	u["apiVersion"], u["kind"] = gvk.GroupVersion().String(), gvk.Kind
	// Fields the typed structs render although nobody set them.
	delete(u, "status")
	unstructured.RemoveNestedField(u, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u, "spec", "template", "metadata", "creationTimestamp")
	ac := client.ApplyConfigurationFromUnstructured(&unstructured.Unstructured{Object: u})
	if err := c.Apply(ctx, ac, client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// alreadyApplied reports whether the cache holds a Secret or ConfigMap child as obj would make
// it: the same labels, annotations, owners and type, and, when obj sets data, the same data.
// Applying it again would change nothing, and a ProxyGroup applies some forty such children
// (its replicas' state and report Secrets) on every pass. A child whose data obj leaves alone
// (a replica's state) compares by metadata. Anything else is applied.
func alreadyApplied(ctx context.Context, c client.Client, obj client.Object) bool {
	key := client.ObjectKeyFromObject(obj)
	switch want := obj.(type) {
	case *corev1.Secret:
		have := &corev1.Secret{}
		if c.Get(ctx, key, have, client.UnsafeDisableDeepCopy) != nil {
			return false
		}
		return sameChildMeta(want, have) && (want.Type == "" || want.Type == have.Type) && len(want.StringData) == 0 &&
			(want.Data == nil || maps.EqualFunc(want.Data, have.Data, bytes.Equal))
	case *corev1.ConfigMap:
		have := &corev1.ConfigMap{}
		if c.Get(ctx, key, have, client.UnsafeDisableDeepCopy) != nil {
			return false
		}
		return sameChildMeta(want, have) && (want.Data == nil || maps.Equal(want.Data, have.Data)) &&
			(want.BinaryData == nil || maps.EqualFunc(want.BinaryData, have.BinaryData, bytes.Equal))
	}
	return false
}

// sameChildMeta compares what apply sets of an object's metadata.
func sameChildMeta(want, have client.Object) bool {
	return have.GetDeletionTimestamp() == nil && maps.Equal(want.GetLabels(), have.GetLabels()) &&
		maps.Equal(want.GetAnnotations(), have.GetAnnotations()) &&
		equality.Semantic.DeepEqual(want.GetOwnerReferences(), have.GetOwnerReferences())
}

// Create writes a child whose content, once it exists, another writer owns: a ProxyGroup's
// certificate Secret, which its issuing replica fills. An apply would take its fields back.
func Create(ctx context.Context, c client.Client, obj client.Object) error {
	if err := c.Create(ctx, obj); err != nil {
		return fmt.Errorf("creating %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// WriteShared writes obj, changed from before, under before's resourceVersion: an object that
// several writers change by read-modify-write (a ProxyGroup's ConfigMap, a segment of the
// certificate ledger) never loses a concurrent change; the conflict goes back to the caller to
// retry. A whole update rather than a merge patch: these objects are large documents with few
// keys, whose changed key is sent whole either way, and computing the patch took two encodings
// and a diff of both versions.
func WriteShared(ctx context.Context, c client.Client, before, obj client.Object) error {
	obj.SetResourceVersion(before.GetResourceVersion())
	return c.Update(ctx, obj)
}

// ScaleStatefulSet sets the replicas of sts, as read, under its resourceVersion: a decision
// taken on a stale read conflicts, and the caller's next pass decides again.
func ScaleStatefulSet(ctx context.Context, c client.Client, sts *appsv1.StatefulSet, replicas int32) error {
	before := sts.DeepCopy()
	sts.Spec.Replicas = &replicas
	return c.Patch(ctx, sts, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

// SetAnnotation sets one annotation of obj (by its namespace and name) through the API, and
// creates obj bearing it when it does not exist yet. A merge patch under its own field manager:
// what Apply writes later neither needs nor removes it, so it outlives the applies between.
func SetAnnotation(ctx context.Context, c client.Client, obj client.Object, key, value string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		return fmt.Errorf("encoding annotation %s: %w", key, err)
	}
	err = c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(annotationOwner))
	if apierrors.IsNotFound(err) {
		obj.SetAnnotations(map[string]string{key: value})
		err = c.Create(ctx, obj, client.FieldOwner(annotationOwner))
	}
	if err != nil {
		return fmt.Errorf("setting annotation %s on %s/%s: %w", key, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// annotationOwner is the field manager of SetAnnotation's writes.
const annotationOwner = fieldOwner + "-annotations"

// Remove deletes a child; one already gone is not an error.
func Remove(ctx context.Context, c client.Client, obj client.Object, opts ...client.DeleteOption) error {
	return client.IgnoreNotFound(c.Delete(ctx, obj, opts...))
}

// PatchStatus writes obj's status, changed from before, when it changed.
func PatchStatus(ctx context.Context, c client.Client, before, obj client.Object) error {
	if equality.Semantic.DeepEqual(before, obj) {
		return nil
	}
	return c.Status().Patch(ctx, obj, client.MergeFrom(before))
}

func AddFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) error {
	if controllerutil.ContainsFinalizer(obj, finalizer) {
		return nil
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	controllerutil.AddFinalizer(obj, finalizer)
	return c.Patch(ctx, obj, patch)
}

func RemoveFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) error {
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	controllerutil.RemoveFinalizer(obj, finalizer)
	return client.IgnoreNotFound(c.Patch(ctx, obj, patch))
}

// ServiceStatusOwner is the part of a Service's status one reconciler owns: its condition
// types and status.loadBalancer (of a LoadBalancer Service it serves). The standalone and HA
// Service reconcilers write the same Services; each touches only what it owns.
type ServiceStatusOwner struct {
	Conditions []string
}

// PatchServiceStatus writes the owned part of want into svc's status. The strategic merge
// patch names conditions by type, so a condition another reconciler wrote since svc was read
// survives (a merge patch would replace the whole list).
func PatchServiceStatus(ctx context.Context, c client.Client, svc *corev1.Service, owner ServiceStatusOwner, want corev1.ServiceStatus) error {
	before := svc.DeepCopy()
	for _, t := range owner.Conditions {
		if w := meta.FindStatusCondition(want.Conditions, t); w != nil {
			meta.SetStatusCondition(&svc.Status.Conditions, *w)
		} else {
			meta.RemoveStatusCondition(&svc.Status.Conditions, t)
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		svc.Status.LoadBalancer.Ingress = want.LoadBalancer.Ingress
	}
	if equality.Semantic.DeepEqual(before.Status, svc.Status) {
		return nil
	}
	return c.Status().Patch(ctx, svc, client.StrategicMergeFrom(before))
}

// ClearServiceStatus removes what owner reported on a Service it no longer serves.
func ClearServiceStatus(ctx context.Context, c client.Client, svc *corev1.Service, owner ServiceStatusOwner) error {
	return PatchServiceStatus(ctx, c, svc, owner, corev1.ServiceStatus{})
}
