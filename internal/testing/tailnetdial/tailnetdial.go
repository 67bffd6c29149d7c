// Package tailnetdial dials from a tsnet node over the tailnet only, for test clients.
//
// tsnet.Server.Dial sends a destination that no peer routes yet, a Tailscale Service VIP before
// a host advertises it included, through the host's own network. There, something else may
// answer (a sandbox's egress proxy answers any address on port 80 with 404 Not Found), and an
// HTTP client keeps that connection alive and reuses it long after the tailnet routes the
// address. Dialing through here fails instead, so that the caller tries again.
package tailnetdial

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"tailscale.com/tsnet"
)

// ErrNoRoute is returned for a destination the tailnet does not route (yet).
var ErrNoRoute = errors.New("not routed over the tailnet")

// For returns a dial function for s (already started) with the signature of
// http.Transport.DialContext.
func For(s *tsnet.Server) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return Dial(ctx, s, network, addr)
	}
}

// Dial connects to addr (a MagicDNS name or an IP, and a port) over the tailnet through s,
// which must be started, or fails with ErrNoRoute.
func Dial(ctx context.Context, s *tsnet.Server, network, addr string) (net.Conn, error) {
	sys := s.Sys()
	if sys == nil {
		return nil, errors.New("tailnetdial: the tsnet server is not started")
	}
	// The plan resolves names as the dial would; the dial then gets the IP, not the name again.
	// Its own verdict is no help: to tsnet, the whole Tailscale range is a route of the host's.
	d := sys.Dialer.Get()
	dst, _, err := d.UserDialPlan(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	// What tsnet's dial asks before going through netstack: does a peer (or this node) route it?
	if d.UseNetstackForIP == nil || !d.UseNetstackForIP(dst.Addr()) {
		return nil, fmt.Errorf("%s (%s): %w", addr, dst.Addr(), ErrNoRoute)
	}
	c, err := s.Dial(ctx, network, dst.String())
	if err != nil {
		return nil, err
	}
	// The route may have gone between the plan and the dial.
	ip4, ip6 := s.TailscaleIPs()
	local, perr := netip.ParseAddrPort(c.LocalAddr().String())
	if from := local.Addr().Unmap(); perr != nil || (from != ip4 && from != ip6) {
		c.Close()
		return nil, fmt.Errorf("%s (%s): connected from %v, not from a tailnet address: %w", addr, dst.Addr(), c.LocalAddr(), ErrNoRoute)
	}
	return c, nil
}
