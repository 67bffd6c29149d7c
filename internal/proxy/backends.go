package proxy

import (
	"context"
	"net"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/tsingress/tsingress/internal/contract"
)

// Backend checks of ProxyGroup replicas: a replica advertises an L7 service only while it can
// reach one of the service's backends, so that a replica on a partitioned node (or with a broken
// network) withdraws and clients go to one that can.
const (
	defaultBackendCheckInterval = 10 * time.Second
	backendDialTimeout          = 3 * time.Second
)

// backendAddrs lists the distinct host:port of a web service's backends.
func backendAddrs(ws contract.WebService) []string {
	var addrs []string
	for _, rt := range ws.AllRoutes() {
		for _, b := range rt.BackendsOf() {
			u, err := url.Parse(b.URL)
			if err != nil || u.Host == "" {
				continue
			}
			host := u.Host
			if u.Port() == "" {
				port := "80"
				if u.Scheme == "https" {
					port = "443"
				}
				host = net.JoinHostPort(u.Hostname(), port)
			}
			addrs = append(addrs, host)
		}
	}
	slices.Sort(addrs)
	return slices.Compact(addrs)
}

// anyReachable reports whether a TCP connection to one of addrs succeeds, trying all at once.
func anyReachable(ctx context.Context, addrs []string) bool {
	ctx, cancel := context.WithTimeout(ctx, backendDialTimeout)
	defer cancel()
	found := make(chan struct{}, len(addrs))
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Go(func() {
			var d net.Dialer
			if c, err := d.DialContext(ctx, "tcp", a); err == nil {
				c.Close()
				found <- struct{}{}
				cancel()
			}
		})
	}
	wg.Wait()
	return len(found) > 0
}

// checkBackends probes every served L7 service's backends off the loop goroutine and hands
// the verdicts back; one round at a time, and one more if asked during a round (new services
// are then not kept waiting for the next tick).
func (r *replica) checkBackends(ctx context.Context) {
	if r.checking {
		r.checkAgain = true
		return
	}
	r.checking, r.checkAgain = true, false
	targets := map[string][]string{}
	for name, ws := range r.serve.Services {
		if r.allowed(name) {
			targets[name] = backendAddrs(ws)
		}
	}
	go func() {
		verdicts := make(map[string]bool, len(targets))
		for name, addrs := range targets {
			verdicts[name] = len(addrs) == 0 || anyReachable(ctx, addrs) // a service that only redirects, or answers a fixed status, needs none
		}
		r.sendFunc(ctx, func() {
			r.checking = false
			for name, ok := range verdicts {
				if ok != r.backendsOK[name] {
					if ok {
						r.log.Info("a backend is reachable", "service", name)
					} else {
						r.log.Warn("no backend is reachable; the service is not advertised until one is", "service", name, "backends", targets[name])
					}
				}
			}
			r.backendsOK = verdicts
			if r.checkAgain {
				r.checkBackends(ctx)
			}
		})
	}()
}
