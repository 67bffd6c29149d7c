package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
)

// apiWaitInterval is how often a starting operator asks whether the API server answers.
const apiWaitInterval = 2 * time.Second

// waitForAPIServer returns once the API server answers, or with ctx's end. The manager cannot be
// made before (it asks the API server which kinds are namespaced), and a process that exits
// instead restarts its container, again and again while the API server is away (an operator
// starting over after losing its lease during an outage); meanwhile the health probes answer on
// probeAddr, live but not ready, so that the kubelet leaves the waiting process alone.
func waitForAPIServer(ctx context.Context, cfg *rest.Config, probeAddr string) error {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 5 * time.Second // an unreachable address may not refuse, only drop
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err = dc.ServerVersion(); err == nil {
		return nil
	}
	log := ctrl.Log.WithName("setup")
	log.Info("waiting for the API server", "err", err.Error())
	if probeAddr != "" && probeAddr != "0" {
		ln, err := net.Listen("tcp", probeAddr)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "waiting for the API server", http.StatusServiceUnavailable)
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln) //nolint:errcheck // ends with Close below
		// Closed before the manager binds the same address.
		defer srv.Close() //nolint:errcheck // it only answered probes while waiting
	}
	t := time.NewTicker(apiWaitInterval)
	defer t.Stop()
	lastLog := time.Now()
	for {
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-t.C:
		}
		if _, err = dc.ServerVersion(); err == nil {
			log.Info("the API server answers")
			return nil
		}
		if time.Since(lastLog) > 30*time.Second {
			log.Info("still waiting for the API server", "err", err.Error())
			lastLog = time.Now()
		}
	}
}
