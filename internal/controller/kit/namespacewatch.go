package kit

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// NamespaceNameWatch sees objects of one kind by name only, like NameWatch, but in the namespaces
// it is told to watch, each started when first needed: the operator holds no cluster-wide right
// to the kind (users' Secrets), only what a namespace's owner grants it there, so a cluster-wide
// watch would be refused. A namespace that stops granting it is forgotten.
type NamespaceNameWatch struct {
	mgr           ctrl.Manager
	kind          schema.GroupVersionKind
	fieldSelector fields.Selector

	started chan struct{}
	mu      sync.Mutex
	ctx     context.Context // the manager's, once started
	watches map[string]context.CancelFunc
	sinks   []nameSink
}

// nameSink is one controller's watch: its mapping and queue.
type nameSink struct {
	ctx   context.Context
	mapFn handler.MapFunc
	queue workqueue.TypedRateLimitingInterface[reconcile.Request]
}

// NewNamespaceNameWatch watches kind, the objects fieldSelector selects (nil: all), in the
// namespaces Watch names.
func NewNamespaceNameWatch(mgr ctrl.Manager, kind schema.GroupVersionKind, fieldSelector fields.Selector) (*NamespaceNameWatch, error) {
	w := &NamespaceNameWatch{mgr: mgr, kind: kind, fieldSelector: fieldSelector,
		started: make(chan struct{}), watches: map[string]context.CancelFunc{}}
	if err := mgr.Add(w); err != nil {
		return nil, fmt.Errorf("adding the watch of %s names to the manager: %w", kind.Kind, err)
	}
	return w, nil
}

// Start keeps the manager's context for the namespaces' caches and stops them all with it.
func (w *NamespaceNameWatch) Start(ctx context.Context) error {
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	close(w.started)
	<-ctx.Done()
	return nil
}

// NeedLeaderElection is false: every replica of the operator keeps its caches warm.
func (w *NamespaceNameWatch) NeedLeaderElection() bool { return false }

// Watch starts the watch of namespace, when it is not running already.
func (w *NamespaceNameWatch) Watch(ctx context.Context, namespace string) error {
	select {
	case <-w.started:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the manager to start the watch of %s names: %w", w.kind.Kind, ctx.Err())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.watches[namespace]; ok {
		return nil
	}
	opts := nameCacheOptions(w.mgr)
	opts.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	opts.DefaultFieldSelector = w.fieldSelector
	opts.DefaultWatchErrorHandler = w.watchErrors(namespace)
	c, err := cache.New(w.mgr.GetConfig(), opts)
	if err != nil {
		return fmt.Errorf("building the cache of %s names in %s: %w", w.kind.Kind, namespace, err)
	}
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(w.kind)
	inf, err := c.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("getting the informer of %s names in %s: %w", w.kind.Kind, namespace, err)
	}
	send := func(o any) { w.dispatch(o) }
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    send,
		UpdateFunc: func(_, o any) { send(o) },
		DeleteFunc: send,
	}); err != nil {
		return fmt.Errorf("handling the events of %s names in %s: %w", w.kind.Kind, namespace, err)
	}
	cacheCtx, stop := context.WithCancel(w.ctx)
	go func() {
		if err := c.Start(cacheCtx); err != nil {
			log.FromContext(w.ctx).Error(err, "watching names", "kind", w.kind.Kind, "namespace", namespace)
		}
	}()
	w.watches[namespace] = stop
	log.FromContext(ctx).V(1).Info("watching names", "kind", w.kind.Kind, "namespace", namespace)
	return nil
}

// watchErrors handles the errors of namespace's watch: a namespace that stops granting the kind
// (its RoleBinding removed, or the namespace deleted) is forgotten at the first refusal, rather
// than listed again and again; other errors are retried as a reflector does.
func (w *NamespaceNameWatch) watchErrors(namespace string) toolscache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, r *toolscache.Reflector, err error) {
		if !apierrors.IsForbidden(err) {
			toolscache.DefaultWatchErrorHandler(ctx, r, err)
			return
		}
		log.FromContext(w.ctx).Info("no longer allowed to watch names; forgetting the namespace until an object there names one again",
			"kind", w.kind.Kind, "namespace", namespace)
		go w.Forget(w.ctx, namespace) // not under the informer that calls this
	}
}

// Forget stops the watch of namespace, where the operator may no longer read the kind.
func (w *NamespaceNameWatch) Forget(ctx context.Context, namespace string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if stop, ok := w.watches[namespace]; ok {
		stop()
		delete(w.watches, namespace)
		log.FromContext(ctx).V(1).Info("no longer watching names", "kind", w.kind.Kind, "namespace", namespace)
	}
}

// dispatch hands an informer's event to every controller watching.
func (w *NamespaceNameWatch) dispatch(o any) {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	obj, ok := o.(*metav1.PartialObjectMetadata)
	if !ok {
		return
	}
	w.mu.Lock()
	sinks := append([]nameSink(nil), w.sinks...)
	w.mu.Unlock()
	for _, s := range sinks {
		for _, req := range s.mapFn(s.ctx, obj) {
			s.queue.Add(req)
		}
	}
}

// Source is a watch of the objects, in every namespace watched now or later, that sends each
// event through mapFn.
func (w *NamespaceNameWatch) Source(mapFn handler.MapFunc) source.Source {
	return source.Func(func(ctx context.Context, queue workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.sinks = append(w.sinks, nameSink{ctx: ctx, mapFn: mapFn, queue: queue})
		return nil
	})
}
