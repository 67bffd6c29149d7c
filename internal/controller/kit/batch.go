package kit

import (
	"context"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Batcher applies changes to shared objects in batches. Reconcilers queue a change under the
// key of the object it changes and wait; one flush per key runs at a time and takes every
// change queued since the previous flush. An object that many reconcilers change (a
// ProxyGroup's documents, the certificate ledger) is then read, decoded, encoded and written
// once per batch instead of once per change, and its writers never conflict with each other.
type Batcher[C any] struct {
	// Flush applies a batch to the object of key and returns each change's error.
	Flush func(key string, batch []C) []error

	Mu     sync.Mutex
	queues map[string]*batchQueue[C]
}

type batchQueue[C any] struct {
	pending []queued[C]
	running bool
}

type queued[C any] struct {
	change C
	done   chan error
}

// Do queues change under key and waits until it is applied or ctx ends.
func (b *Batcher[C]) Do(ctx context.Context, key string, change C) error {
	q := queued[C]{change: change, done: make(chan error, 1)}
	b.Mu.Lock()
	if b.queues == nil {
		b.queues = map[string]*batchQueue[C]{}
	}
	bq := b.queues[key]
	if bq == nil {
		bq = &batchQueue[C]{}
		b.queues[key] = bq
	}
	bq.pending = append(bq.pending, q)
	if !bq.running {
		bq.running = true
		go b.drain(key, bq)
	}
	b.Mu.Unlock()
	select {
	case err := <-q.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain flushes a key's queue until it is empty.
func (b *Batcher[C]) drain(key string, bq *batchQueue[C]) {
	for {
		b.Mu.Lock()
		batch := bq.pending
		bq.pending = nil
		if len(batch) == 0 {
			bq.running = false
			delete(b.queues, key)
			b.Mu.Unlock()
			return
		}
		b.Mu.Unlock()
		changes := make([]C, len(batch))
		for i, q := range batch {
			changes[i] = q.change
		}
		errs := b.Flush(key, changes)
		for i, q := range batch {
			q.done <- errs[i]
		}
	}
}

// LastWritten remembers, per object, the version a flush last wrote: right after a write the
// cache may still hold the previous one, which would only conflict.
type LastWritten[T any] struct {
	mu   sync.Mutex
	objs map[string]T
}

func (l *LastWritten[T]) Get(key string) (T, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.objs[key]
	return v, ok
}

func (l *LastWritten[T]) Set(key string, v T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.objs == nil {
		l.objs = map[string]T{}
	}
	l.objs[key] = v
}

func (l *LastWritten[T]) Forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.objs, key)
}

// FlushTimeout bounds one flush: reading, writing and retrying conflicts.
const FlushTimeout = 30 * time.Second

// MaxFlushAttempts bounds the conflicts one flush retries; the reconcilers retry after that.
const MaxFlushAttempts = 5

// Freshest is the object to start a read-modify-write from: the cached one, or a copy of the
// one last written when the cache does not show that write yet.
func Freshest[T client.Object](cached, last T) T {
	if last.GetUID() == cached.GetUID() && NewerVersion(last.GetResourceVersion(), cached.GetResourceVersion()) {
		return last.DeepCopyObject().(T)
	}
	return cached
}

// NewerVersion reports whether resourceVersion a is newer than b. Resource versions are opaque
// to clients but, from etcd, increasing integers; anything else is taken as not newer.
func NewerVersion(a, b string) bool {
	if len(a) != len(b) {
		return len(a) > len(b) && isDigits(a) && isDigits(b)
	}
	return a > b && isDigits(a) && isDigits(b)
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}
