package kit

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// lastAppliedAnnotation is kubectl's copy of what was applied; for a Secret it holds the data.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// StripUnread drops from cached objects what the operator never reads.
func StripUnread(in any) (any, error) {
	if obj, err := meta.Accessor(in); err == nil {
		if obj.GetManagedFields() != nil {
			obj.SetManagedFields(nil)
		}
		if a := obj.GetAnnotations(); a[lastAppliedAnnotation] != "" {
			delete(a, lastAppliedAnnotation)
			obj.SetAnnotations(a)
		}
	}
	return in, nil
}

// NameWatch sees the objects of one kind in every namespace by name only, in a cache of its
// own: enough to reconcile what names one when it changes, without holding the contents (the
// certificates and keys of kubernetes.io/tls Secrets, every ConfigMap's data) of the whole
// cluster in memory. Reconcilers read the object they name through the API server.
type NameWatch struct {
	cache cache.Cache
	kind  schema.GroupVersionKind
}

// NewNameWatch watches every object of kind.
func NewNameWatch(mgr ctrl.Manager, kind schema.GroupVersionKind) (*NameWatch, error) {
	c, err := cache.New(mgr.GetConfig(), nameCacheOptions(mgr))
	if err != nil {
		return nil, fmt.Errorf("building the cache of %s names: %w", kind.Kind, err)
	}
	if err := mgr.Add(c); err != nil {
		return nil, fmt.Errorf("adding the cache of %s names to the manager: %w", kind.Kind, err)
	}
	return &NameWatch{cache: c, kind: kind}, nil
}

// nameCacheOptions are those of a cache of the manager's cluster that keeps names only.
func nameCacheOptions(mgr ctrl.Manager) cache.Options {
	return cache.Options{
		HTTPClient:       mgr.GetHTTPClient(),
		Scheme:           mgr.GetScheme(),
		Mapper:           mgr.GetRESTMapper(),
		DefaultTransform: nameOnly,
	}
}

// nameOnly keeps what identifies an object and tells that it changed.
func nameOnly(in any) (any, error) {
	if m, ok := in.(*metav1.PartialObjectMetadata); ok {
		m.ObjectMeta = metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
	}
	return in, nil
}

// Source is a watch of the objects that sends each event through mapFn.
func (w *NameWatch) Source(mapFn handler.MapFunc) source.Source {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(w.kind)
	return source.Kind(w.cache, obj, handler.TypedEnqueueRequestsFromMapFunc(
		func(ctx context.Context, o *metav1.PartialObjectMetadata) []reconcile.Request { return mapFn(ctx, o) }))
}
