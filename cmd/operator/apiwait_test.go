package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// A starting operator waits for the API server with its probes live and not ready, and frees
// the probes' address for the manager once the API server answers.
func TestWaitForAPIServer(t *testing.T) {
	var up atomic.Bool
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer api.Close()
	probe := freeAddr(t)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- waitForAPIServer(ctx, &rest.Config{Host: api.URL}, probe) }()

	status := func(path string) int {
		for ctx.Err() == nil {
			res, err := http.Get("http://" + probe + path)
			if err == nil {
				res.Body.Close()
				return res.StatusCode
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no answer on %s", path)
		return 0
	}
	if got := status("/healthz"); got != http.StatusOK {
		t.Errorf("/healthz while waiting: %d, want 200", got)
	}
	if got := status("/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz while waiting: %d, want 503", got)
	}
	select {
	case err := <-done:
		t.Fatalf("returned before the API server answered: %v", err)
	case <-time.After(apiWaitInterval + time.Second):
	}
	up.Store(true)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("still waiting after the API server answered")
	}
	ln, err := net.Listen("tcp", probe)
	if err != nil {
		t.Fatalf("the probes' address is still taken: %v", err)
	}
	ln.Close()

	// Stopped while waiting, it says so.
	up.Store(false)
	stopped, stop := context.WithCancel(t.Context())
	stop()
	if err := waitForAPIServer(stopped, &rest.Config{Host: api.URL}, ""); err == nil {
		t.Error("a stopped wait reports success")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
