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
	lc, err := suite.Client.LocalClient()
	if err != nil {
		return nil, err
	}
	// On Linux the bus carries a netmap only at first; peer changes come as deltas.
	w, err := lc.WatchIPNBus(ctx, ipn.NotifyInitialNetMap|ipn.NotifyPeerChanges)
	if err != nil {
		return nil, err
	}
	m := &routeMoves{}
	go func() {
		defer w.Close()
		peers := map[tailcfg.NodeID]tailcfg.NodeView{}
		var last map[netip.Prefix]tailcfg.StableNodeID
		for {
			n, err := w.Next()
			if err != nil {
				return
			}
			//nolint:staticcheck // SA1019: the peers come whole in the initial netmap the watch asks for, then as changes
			if n.NetMap == nil && n.PeersChanged == nil && n.PeersRemoved == nil {
				continue
			}
			if nm := n.NetMap; nm != nil { //nolint:staticcheck // SA1019: as above
				clear(peers)
				for _, p := range nm.Peers {
					peers[p.ID()] = p
				}
			}
			for _, p := range n.PeersChanged {
				peers[p.ID] = p.View()
			}
			for _, id := range n.PeersRemoved {
				delete(peers, id)
			}
			now := serviceRoutes(peers)
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
func serviceRoutes(peers map[tailcfg.NodeID]tailcfg.NodeView) map[netip.Prefix]tailcfg.StableNodeID {
	out := map[netip.Prefix]tailcfg.StableNodeID{}
	for _, p := range peers {
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
