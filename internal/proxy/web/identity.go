package web

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"tailscale.com/client/tailscale/apitype"
)

// Callers are remembered by tailnet IP for identityTTL: asking tailscaled who is calling is a
// LocalAPI round trip with JSON both ways, which cost more CPU than the rest of the proxy's
// work on a small request. A tailnet IP belongs to one device for the device's life, so only a
// renamed user or a re-tagged device shows late, by at most the TTL.
const (
	identityTTL        = 10 * time.Second
	maxIdentityEntries = 4096
)

// identities caches WhoIs answers by the caller's IP. Failures are not cached: a caller that
// could not be identified is asked about again on its next request.
type identities struct {
	whois WhoIsFunc
	now   func() time.Time

	mu      sync.Mutex
	entries map[netip.Addr]identity
}

type identity struct {
	who     *apitype.WhoIsResponse
	expires time.Time
}

func newIdentities(whois WhoIsFunc) *identities {
	return &identities{whois: whois, now: time.Now, entries: map[netip.Addr]identity{}}
}

// lookup identifies the caller at remoteAddr (ip:port).
func (c *identities) lookup(ctx context.Context, remoteAddr string) (*apitype.WhoIsResponse, error) {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return c.whois(ctx, remoteAddr)
	}
	ip := ap.Addr().Unmap()
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[ip]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.who, nil
	}
	who, err := c.whois(ctx, remoteAddr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= maxIdentityEntries {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= maxIdentityEntries {
			clear(c.entries) // all fresh: a burst of callers, who are asked again
		}
	}
	c.entries[ip] = identity{who: who, expires: now.Add(identityTTL)}
	return who, nil
}
