package kit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Changes queued while a flush runs are applied together in the next one, and each caller gets
// its own change's result.
func TestBatcherCoalesces(t *testing.T) {
	var flushes atomic.Int32
	release := make(chan struct{})
	var applied []int
	b := Batcher[int]{Flush: func(_ string, batch []int) []error {
		if flushes.Add(1) == 1 {
			<-release // the first flush is slow: the others queue meanwhile
		}
		applied = append(applied, batch...)
		errs := make([]error, len(batch))
		for i, c := range batch {
			if c%10 == 0 {
				errs[i] = errors.New("refused")
			}
		}
		return errs
	}}
	ctx := context.Background()
	firstDone := make(chan error)
	go func() { firstDone <- b.Do(ctx, "g", 1) }()
	for flushes.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make([]error, 21)
	for i := 2; i <= 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.Do(ctx, "g", i)
		}()
	}
	// Wait until the 19 are queued behind the first flush.
	for {
		b.Mu.Lock()
		n := len(b.queues["g"].pending)
		b.Mu.Unlock()
		if n == 19 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatalf("first change: %v", err)
	}
	wg.Wait()
	if got := flushes.Load(); got != 2 {
		t.Errorf("%d flushes for 20 changes, want 2 (one, then the 19 queued meanwhile)", got)
	}
	if len(applied) != 20 {
		t.Errorf("applied %d changes, want 20", len(applied))
	}
	for i := 2; i <= 20; i++ {
		if want := i%10 == 0; (errs[i] != nil) != want {
			t.Errorf("change %d: error %v, want one: %t", i, errs[i], want)
		}
	}
	b.Mu.Lock()
	defer b.Mu.Unlock()
	if len(b.queues) != 0 {
		t.Errorf("queues left after draining: %v", b.queues)
	}
}

// A caller whose context ends stops waiting; the change is still applied.
func TestBatcherCallerGone(t *testing.T) {
	release := make(chan struct{})
	done := make(chan struct{})
	b := Batcher[int]{Flush: func(_ string, batch []int) []error {
		<-release
		close(done)
		return make([]error, len(batch))
	}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Do(ctx, "g", 1); !errors.Is(err, context.Canceled) {
		t.Errorf("do with an ended context = %v", err)
	}
	close(release)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the change was never flushed")
	}
}

func TestNewerVersion(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{{"10", "9", true}, {"9", "10", false}, {"12", "12", false}, {"123", "122", true}, {"x2", "1", false}, {"", "1", false}} {
		if got := NewerVersion(c.a, c.b); got != c.want {
			t.Errorf("newerVersion(%q, %q) = %t, want %t", c.a, c.b, got, c.want)
		}
	}
}
