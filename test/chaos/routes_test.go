//go:build chaos

package chaos

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"tailscale.com/ipn"
	"tailscale.com/tailcfg"
	"tailscale.com/types/netmap"
)

// routeMoves records when the test client's route to a Tailscale Service address moved from one
// host to another (or away): the moments at which the client drops what the old host still
// sends from that address, so that a request then in flight fails whatever the proxies do.
type routeMoves struct {
	mu    sync.Mutex
	times []time.Time
}

// watchRoutes watches the client's netmaps until ctx ends.
func watchRoutes(ctx context.Context) (*routeMoves, error) {
	lc, err := suite.client.LocalClient()
	if err != nil {
		return nil, err
	}
	w, err := lc.WatchIPNBus(ctx, ipn.NotifyInitialNetMap)
	if err != nil {
		return nil, err
	}
	m := &routeMoves{}
	go func() {
		defer w.Close()
		var last map[netip.Prefix]tailcfg.StableNodeID
		for {
			n, err := w.Next()
			if err != nil {
				return
			}
			if n.NetMap == nil {
				continue
			}
			now := serviceRoutes(n.NetMap)
			if last != nil && movedAny(last, now) {
				m.mu.Lock()
				m.times = append(m.times, time.Now())
				m.mu.Unlock()
			}
			last = now
		}
	}()
	return m, nil
}

// serviceRoutes maps each address a peer is routed for beyond its own (Tailscale Service
// addresses) to that peer.
func serviceRoutes(nm *netmap.NetworkMap) map[netip.Prefix]tailcfg.StableNodeID {
	out := map[netip.Prefix]tailcfg.StableNodeID{}
	for _, p := range nm.Peers {
		own := p.Addresses().AsSlice()
		for _, pfx := range p.AllowedIPs().All() {
			if !slices.Contains(own, pfx) {
				out[pfx] = p.StableID()
			}
		}
	}
	return out
}

// movedAny reports whether an address routed before is routed to another peer, or to none, now.
func movedAny(before, now map[netip.Prefix]tailcfg.StableNodeID) bool {
	for pfx, id := range before {
		if now[pfx] != id {
			return true
		}
	}
	return false
}

// during reports whether a move happened while a request ran from start to end.
func (m *routeMoves) during(start, end time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.times {
		if !t.Before(start) && !t.After(end) {
			return true
		}
	}
	return false
}

func (m *routeMoves) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.times)
}
