package proxy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/backoff"
	"github.com/tsingress/tsingress/internal/proxy/l3"
)

// The restart policy: what a config change may not change without a new process.
func TestRestartReason(t *testing.T) {
	base := contract.ProxyConfig{Kind: contract.KindIngress, Hostname: "p", ControlURL: "https://c", Tags: []string{"tag:a", "tag:b"},
		StateSecret: "s", AuthKey: "k1"}
	for _, tc := range []struct {
		name     string
		change   func(*contract.ProxyConfig)
		loggedIn bool
		want     string // in the reason; "" for none
	}{
		{"nothing", func(*contract.ProxyConfig) {}, false, ""},
		{"kind", func(c *contract.ProxyConfig) { c.Kind = contract.KindService }, true, "kind changed"},
		{"hostname", func(c *contract.ProxyConfig) { c.Hostname = "q" }, true, "hostname changed"},
		{"control URL", func(c *contract.ProxyConfig) { c.ControlURL = "https://d" }, true, "control URL changed"},
		{"tags", func(c *contract.ProxyConfig) { c.Tags = []string{"tag:a"} }, true, "tags changed"},
		{"tags reordered", func(c *contract.ProxyConfig) { c.Tags = []string{"tag:b", "tag:a"} }, true, ""},
		{"state Secret", func(c *contract.ProxyConfig) { c.StateSecret = "t" }, true, "state Secret changed"},
		{"new key, not logged in", func(c *contract.ProxyConfig) { c.AuthKey = "k2" }, false, "new auth key"},
		{"new key, logged in", func(c *contract.ProxyConfig) { c.AuthKey = "k2" }, true, ""},
		{"key removed, not logged in", func(c *contract.ProxyConfig) { c.AuthKey = "" }, false, ""},
		{"acceptRoutes", func(c *contract.ProxyConfig) { c.AcceptRoutes = true }, true, "acceptRoutes changed"},
		{"served content", func(c *contract.ProxyConfig) { c.AdvertiseServices = []string{"svc:a"} }, false, ""},
		{"firewall mode alone", func(c *contract.ProxyConfig) { c.Firewall.Mode = contract.FirewallIPTables }, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := base
			cfg := base
			cfg.Tags = append([]string(nil), base.Tags...)
			tc.change(&cfg)
			got := restartReason(&old, &cfg, tc.loggedIn)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("restartReason = %q, want one with %q", got, tc.want)
			}
		})
	}
}

// A forwarder's firewall mode is fixed at its start; unset means auto.
func TestFirewallRestart(t *testing.T) {
	for _, tc := range []struct {
		old, cur contract.FirewallMode
		restart  bool
	}{
		{"", "", false},
		{"", contract.FirewallAuto, false},
		{contract.FirewallAuto, "", false},
		{contract.FirewallNFTables, contract.FirewallNFTables, false},
		{"", contract.FirewallIPTables, true},
		{contract.FirewallNFTables, contract.FirewallIPTables, true},
	} {
		old, cur := &contract.ProxyConfig{}, &contract.ProxyConfig{}
		old.Firewall.Mode, cur.Firewall.Mode = tc.old, tc.cur
		if got := firewallRestart(old, cur); (got != "") != tc.restart {
			t.Errorf("%q to %q: reason %q, want a restart %t", tc.old, tc.cur, got, tc.restart)
		}
	}
}

// A replica's new auth key waits while the node runs or the key is the one it started with.
func TestKeyPending(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     string
		running bool
		want    bool
	}{
		{"new key, not logged in", "k2", false, true},
		{"new key, logged in", "k2", true, false},
		{"the start key", "k1", false, false},
		{"no key", "", false, false},
	} {
		if got := keyPending(&contract.ProxyConfig{AuthKey: tc.key}, "k1", tc.running); got != tc.want {
			t.Errorf("%s: keyPending = %t, want %t", tc.name, got, tc.want)
		}
	}
}

// The forwarder is given the mappings when they changed, or when a failed attempt is due again.
func TestDNATNeeded(t *testing.T) {
	one := []l3.Mapping{{Name: "svc:a", TailnetIPs: []netip.Addr{netip.MustParseAddr("100.64.0.1")},
		Destination: contract.Destination{IPs: []string{"10.0.0.1"}}}}
	moved := []l3.Mapping{{Name: "svc:a", TailnetIPs: one[0].TailnetIPs, Destination: contract.Destination{IPs: []string{"10.0.0.2"}}}}
	failedAt := func(at time.Time) (backoff.Backoff, error) {
		b := backoff.Backoff{Min: time.Minute, Max: time.Hour}
		b.Fail(at)
		return b, errors.New("no")
	}
	for _, tc := range []struct {
		name     string
		applied  []l3.Mapping
		failedAt time.Time // zero: the last attempt succeeded
		want     []l3.Mapping
		needed   bool
	}{
		{"nothing asked, nothing given", nil, time.Time{}, nil, false},
		{"first mapping", nil, time.Time{}, one, true},
		{"unchanged", one, time.Time{}, one, false},
		{"destination moved", one, time.Time{}, moved, true},
		{"removed", one, time.Time{}, nil, true},
		{"failed, not due yet", one, time.Now(), one, false},
		{"failed, due", one, time.Now().Add(-time.Hour), one, true},
		{"failed, changed before due", one, time.Now(), moved, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &dnat{applied: tc.applied}
			if !tc.failedAt.IsZero() {
				d.retry, d.err = failedAt(tc.failedAt)
			}
			if got := d.needed(tc.want); got != tc.needed {
				t.Errorf("needed = %t, want %t", got, tc.needed)
			}
		})
	}
}
