package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// health serves /healthz (the process is alive and answering), /readyz (logged in, config
// applied and serving HTTPS with a certificate; it says what it is still waiting for) and
// /metrics (while the config enables them).
type health struct {
	notReady atomic.Pointer[string] // why the proxy is not ready; empty when it is
	metrics  *proxyMetrics
}

func newHealth(m *proxyMetrics) *health {
	h := &health{metrics: m}
	h.set("starting")
	return h
}

// set records why the proxy is not ready; "" means it is.
func (h *health) set(reason string) { h.notReady.Store(&reason) }

// serve listens until the returned stop is called: liveness must outlast ctx while requests
// drain.
func (h *health) serve(opts Options) (stop func(), err error) {
	ln := opts.HealthListener
	if ln == nil {
		if opts.HealthAddr == "" {
			return func() {}, nil
		}
		if ln, err = net.Listen("tcp", opts.HealthAddr); err != nil {
			return nil, fmt.Errorf("health endpoint: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if reason := *h.notReady.Load(); reason != "" {
			http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /metrics", h.metrics.handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			opts.Logger.Error("health endpoint stopped", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx) // past the second, the probes go unanswered anyway
	}, nil
}
