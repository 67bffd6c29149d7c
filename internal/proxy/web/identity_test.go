package web

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"tailscale.com/client/tailscale/apitype"
	"tailscale.com/tailcfg"
)

func TestIdentitiesCacheByIP(t *testing.T) {
	calls := 0
	fail := false
	c := newIdentities(func(_ context.Context, addr string) (*apitype.WhoIsResponse, error) {
		calls++
		if fail {
			return nil, errors.New("tailscaled unreachable")
		}
		return &apitype.WhoIsResponse{UserProfile: &tailcfg.UserProfile{LoginName: addr}}, nil
	})
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	ctx := context.Background()
	lookup := func(addr string) string {
		t.Helper()
		who, err := c.lookup(ctx, addr)
		if err != nil {
			return "error"
		}
		return who.UserProfile.LoginName
	}

	if got := lookup("100.64.0.1:1000"); got != "100.64.0.1:1000" || calls != 1 {
		t.Fatalf("first lookup = %q after %d calls", got, calls)
	}
	// Another connection of the same device is answered from the cache.
	if got := lookup("100.64.0.1:2000"); got != "100.64.0.1:1000" || calls != 1 {
		t.Errorf("same IP, other port = %q after %d calls, want the cached answer", got, calls)
	}
	if lookup("100.64.0.2:1000"); calls != 2 {
		t.Errorf("another IP: %d calls, want 2", calls)
	}
	// After the TTL the device is asked about again, and a failure is not remembered.
	now = now.Add(identityTTL)
	fail = true
	if got := lookup("100.64.0.1:1000"); got != "error" || calls != 3 {
		t.Errorf("expired entry = %q after %d calls", got, calls)
	}
	fail = false
	if got := lookup("100.64.0.1:3000"); got != "100.64.0.1:3000" || calls != 4 {
		t.Errorf("after a failure = %q after %d calls, want a new lookup", got, calls)
	}
	// An address that is not ip:port is passed through uncached.
	lookup("pipe")
	lookup("pipe")
	if calls != 6 {
		t.Errorf("unparsable address: %d calls, want 6", calls)
	}
}

func TestIdentitiesBounded(t *testing.T) {
	c := newIdentities(func(context.Context, string) (*apitype.WhoIsResponse, error) {
		return &apitype.WhoIsResponse{}, nil
	})
	for i := range maxIdentityEntries + 10 {
		addr := netipFrom(i)
		if _, err := c.lookup(context.Background(), addr); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(c.entries); n == 0 || n > maxIdentityEntries {
		t.Errorf("%d entries, want at most %d", n, maxIdentityEntries)
	}
}

func netipFrom(i int) string {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{100, 64, byte(i / 256), byte(i % 256)}), 80).String()
}
