package firewall

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
)

func TestCensusDecide(t *testing.T) {
	for _, tc := range []struct {
		name   string
		c      census
		want   Mode
		legacy bool
	}{
		{"empty namespace", census{}, ModeNFTables, false},
		{"tie", census{native: 3, xtNFT: 3}, ModeNFTables, false},
		{"more iptables-nft rules", census{native: 2, xtNFT: 3}, ModeIPTables, false},
		{"more legacy rules", census{native: 2, xtNFT: 1, xtLegacy: 4}, ModeIPTables, true},
		{"both iptables flavours count", census{native: 4, xtNFT: 3, xtLegacy: 2}, ModeIPTables, false},
		{"kube-proxy iptables beats counts", census{native: 100, kubeXTNFT: true}, ModeIPTables, false},
		{"kube-proxy iptables-legacy", census{native: 100, kubeXTLegacy: true}, ModeIPTables, true},
		{"kube-proxy iptables beats kube-proxy nftables", census{kubeNFT: true, kubeXTNFT: true}, ModeIPTables, false},
		{"kube-proxy nftables beats counts", census{xtNFT: 100, kubeNFT: true}, ModeNFTables, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.c.decide()
			if d.Mode != tc.want || d.Legacy != tc.legacy || d.Reason == "" {
				t.Errorf("decide(%+v) = %+v, want mode %s legacy %v with a reason", tc.c, d, tc.want, tc.legacy)
			}
		})
	}
}

func TestDetectMode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nftFile := func(t *testing.T, ns netnstest.NS, ruleset string) {
		t.Helper()
		f := t.TempDir() + "/rules.nft"
		if err := os.WriteFile(f, []byte(ruleset), 0o644); err != nil {
			t.Fatal(err)
		}
		ns.Exec(t, "nft", "-f", f)
	}
	const threeNFTRules = `table inet filter {
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 22 accept
		udp dport 53 accept
		icmp type echo-request accept
	}
}
`
	apply := func(t *testing.T, ns netnstest.NS, mode Mode) {
		t.Helper()
		r, err := New(ctx, Options{Mode: mode, NetNS: ns.Path})
		if err != nil {
			t.Fatal(err)
		}
		a := netip.MustParseAddr
		_, err = r.Apply(ctx, []Mapping{
			{Name: "a", TailnetIPs: []netip.Addr{a("100.64.0.1"), a("fd7a:115c:a1e0::1")}, Destinations: []netip.Addr{a("10.96.0.1"), a("fd00::1")}},
			{Name: "b", TailnetIPs: []netip.Addr{a("100.64.0.2")}, Destinations: []netip.Addr{a("10.96.0.2"), a("10.96.0.3"), a("10.96.0.4")}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		tools   []string
		prepare func(t *testing.T, ns netnstest.NS)
		want    Mode
		legacy  bool
	}{
		{name: "empty namespace", want: ModeNFTables},
		{
			name: "iptables-nft rules", tools: []string{"iptables"}, want: ModeIPTables,
			prepare: func(t *testing.T, ns netnstest.NS) {
				ns.Exec(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.0.0.0/8", "-j", "MASQUERADE")
				ns.Exec(t, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
			},
		},
		{
			name: "iptables-legacy rules", tools: []string{"iptables-legacy"}, want: ModeIPTables, legacy: true,
			prepare: func(t *testing.T, ns netnstest.NS) {
				ns.Exec(t, "iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-s", "10.0.0.0/8", "-j", "MASQUERADE")
			},
		},
		{
			name: "nftables rules", tools: []string{"nft", "iptables"}, want: ModeNFTables,
			prepare: func(t *testing.T, ns netnstest.NS) {
				nftFile(t, ns, threeNFTRules)
				ns.Exec(t, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
			},
		},
		{
			name: "kube-proxy iptables chain outweighs more nftables rules", tools: []string{"nft", "iptables"}, want: ModeIPTables,
			prepare: func(t *testing.T, ns netnstest.NS) {
				nftFile(t, ns, threeNFTRules)
				ns.Exec(t, "iptables", "-t", "nat", "-N", "KUBE-SERVICES")
			},
		},
		{
			name: "kube-proxy nftables table outweighs more iptables rules", tools: []string{"nft", "iptables"}, want: ModeNFTables,
			prepare: func(t *testing.T, ns netnstest.NS) {
				nftFile(t, ns, "table ip kube-proxy {\n\tchain services {\n\t}\n}\n")
				ns.Exec(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.0.0.0/8", "-j", "MASQUERADE")
				ns.Exec(t, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
			},
		},
		{
			name: "our nftables rules do not count", tools: []string{"iptables"}, want: ModeIPTables,
			prepare: func(t *testing.T, ns netnstest.NS) {
				apply(t, ns, ModeNFTables)
				ns.Exec(t, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT")
			},
		},
		{
			name: "our iptables rules do not count", tools: []string{"nft", "iptables"}, want: ModeNFTables,
			prepare: func(t *testing.T, ns netnstest.NS) {
				apply(t, ns, ModeIPTables)
				nftFile(t, ns, "table inet filter {\n\tchain input {\n\t\ttype filter hook input priority filter;\n\t\ttcp dport 22 accept\n\t}\n}\n")
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := netnstest.New(t, "detect")
			netnstest.NeedRoot(t, tc.tools...)
			if tc.prepare != nil {
				tc.prepare(t, ns)
			}
			d, err := DetectMode(ctx, ns.Path)
			if err != nil {
				t.Fatalf("DetectMode: %v", err)
			}
			if d.Mode != tc.want || d.Legacy != tc.legacy {
				t.Fatalf("DetectMode = %+v, want mode %s legacy %v", d, tc.want, tc.legacy)
			}
			r, err := New(ctx, Options{NetNS: ns.Path})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if r.Mode() != tc.want {
				t.Errorf("auto mode runner is %s, want %s", r.Mode(), tc.want)
			}
			forced, err := New(ctx, Options{Mode: ModeNFTables, NetNS: ns.Path})
			if err != nil || forced.Mode() != ModeNFTables {
				t.Errorf("forced nftables mode: %v", err)
			}
		})
	}
}

// Detection must not make the kernel create legacy tables in a namespace that has none.
func TestDetectModeCreatesNoLegacyTables(t *testing.T) {
	ns := netnstest.New(t, "nolegacy")
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Skip("needs iptables-legacy")
	}
	if _, err := DetectMode(context.Background(), ns.Path); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ip_tables_names", "ip6_tables_names"} {
		var b []byte
		err := netnamespace.Run(ns.Path, func() (err error) {
			b, err = os.ReadFile("/proc/thread-self/net/" + f)
			return err
		})
		if err == nil && strings.TrimSpace(string(b)) != "" {
			t.Errorf("%s lists %q after detection", f, b)
		}
	}
}
