package kit

import (
	"context"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// QuietSecrets wraps the operator's client and uncached reader so that no request about a
// Secret carries the reconcile's logger: client-go logs request and response bodies at V(8)
// through the context's logger, and a Secret's body is its credentials (auth keys, TLS keys).
// Other requests keep their logger.
func QuietSecrets(c client.Client, api client.Reader) (client.Client, client.Reader) {
	return quietClient{c}, quietReader{api}
}

// quiet drops the logger from ctx when obj is about a Secret.
func quiet(ctx context.Context, obj any) context.Context {
	switch o := obj.(type) {
	case *corev1.Secret, *corev1.SecretList:
		return logr.NewContext(ctx, logr.Discard())
	case interface{ GetKind() string }: // an apply configuration from Apply, unstructured
		if o.GetKind() == "Secret" {
			return logr.NewContext(ctx, logr.Discard())
		}
	}
	return ctx
}

type quietReader struct{ client.Reader }

func (r quietReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return r.Reader.Get(quiet(ctx, obj), key, obj, opts...)
}

func (r quietReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return r.Reader.List(quiet(ctx, list), list, opts...)
}

type quietClient struct{ client.Client }

func (c quietClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.Client.Get(quiet(ctx, obj), key, obj, opts...)
}

func (c quietClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.Client.List(quiet(ctx, list), list, opts...)
}

func (c quietClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.Client.Create(quiet(ctx, obj), obj, opts...)
}

func (c quietClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.Client.Update(quiet(ctx, obj), obj, opts...)
}

func (c quietClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.Client.Patch(quiet(ctx, obj), obj, patch, opts...)
}

func (c quietClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.Client.Delete(quiet(ctx, obj), obj, opts...)
}

func (c quietClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	return c.Client.Apply(quiet(ctx, obj), obj, opts...)
}
