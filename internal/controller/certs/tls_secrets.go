package certs

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
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

// tlsSecretWatch sees the kubernetes.io/tls Secrets of every namespace by name only, in a cache
// of its own: enough to reconcile the Ingresses that name one when it changes, without holding
// the certificates (and keys) of the whole cluster in memory.
type TLSSecretWatch struct {
	cache cache.Cache
}

func NewTLSSecretWatch(mgr ctrl.Manager) (*TLSSecretWatch, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient:           mgr.GetHTTPClient(),
		Scheme:               mgr.GetScheme(),
		Mapper:               mgr.GetRESTMapper(),
		DefaultFieldSelector: fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS)),
		DefaultTransform:     nameOnly,
	})
	if err != nil {
		return nil, fmt.Errorf("building the cache of kubernetes.io/tls Secrets: %w", err)
	}
	if err := mgr.Add(c); err != nil {
		return nil, fmt.Errorf("adding the cache of kubernetes.io/tls Secrets to the manager: %w", err)
	}
	return &TLSSecretWatch{cache: c}, nil
}

// nameOnly keeps what identifies an object and tells that it changed.
func nameOnly(in any) (any, error) {
	if m, ok := in.(*metav1.PartialObjectMetadata); ok {
		m.ObjectMeta = metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
	}
	return in, nil
}

// Source is a watch of the TLS Secrets that sends each event through mapFn.
func (t *TLSSecretWatch) Source(mapFn handler.MapFunc) source.Source {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	return source.Kind(t.cache, obj, handler.TypedEnqueueRequestsFromMapFunc(
		func(ctx context.Context, o *metav1.PartialObjectMetadata) []reconcile.Request { return mapFn(ctx, o) }))
}
