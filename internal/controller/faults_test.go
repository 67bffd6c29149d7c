package controller

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// applyFaults makes the operator's applies of chosen objects fail, as an API server going
// away between two writes of one pass does.
var applyFaults faults

type faults struct {
	mu        sync.Mutex
	remaining map[string]int // by kind/namespace/name
}

// fail makes the next n applies of the object fail.
func (f *faults) fail(kind, namespace, name string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.remaining == nil {
		f.remaining = map[string]int{}
	}
	f.remaining[kind+"/"+namespace+"/"+name] = n
}

// take reports whether this apply of the object is to fail, counting it.
func (f *faults) take(kind, namespace, name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := kind + "/" + namespace + "/" + name
	if f.remaining[key] <= 0 {
		return false
	}
	f.remaining[key]--
	return true
}

// client is the manager's client, with the faults in its applies.
func (f *faults) client(config *rest.Config, options client.Options) (client.Client, error) {
	c, err := client.NewWithWatch(config, options)
	if err != nil {
		return nil, err
	}
	// Behind a pointer: the store tells its clients apart by comparing them, and the
	// interceptor's value holds functions, which do not compare.
	return &struct{ client.WithWatch }{interceptor.NewClient(c, interceptor.Funcs{
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			// What kit.Apply sends: an unstructured object.
			if u, ok := obj.(namedApply); ok && f.take(u.GetKind(), u.GetNamespace(), u.GetName()) {
				return fmt.Errorf("apply of %s %s/%s refused (injected: the API server went away)", u.GetKind(), u.GetNamespace(), u.GetName())
			}
			return c.Apply(ctx, obj, opts...)
		},
	})}, nil
}

// namedApply is what an unstructured apply configuration says of its object.
type namedApply interface {
	GetKind() string
	GetNamespace() string
	GetName() string
}
