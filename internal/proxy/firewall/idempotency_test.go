package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
)

// ourRules lists every rule of ours in ns as "<where> handle=<h> comment=<tag>". Handles are
// nf_tables' and change whenever a rule is re-created, so equal listings mean untouched rules.
// iptables-nft keeps comments out of nf_tables' own comment field, so for it the handles are
// paired with iptables' listing of the same chains, which is in the same order.
func ourRules(t *testing.T, ns netnstest.NS, mode Mode) []string {
	t.Helper()
	if mode == ModeNFTables {
		var out []string
		for _, l := range nftDump(t, ns) {
			if strings.HasPrefix(l, "rule ip tsingress ") || strings.HasPrefix(l, "rule ip6 tsingress ") {
				out = append(out, l)
			}
		}
		return out
	}
	fd, done, err := openNetNS(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	conn, _ := nftables.New(nftables.WithNetNSFd(fd))
	var out []string
	err = netnamespace.Run(ns.Path, func() error {
		for _, f := range families {
			ipt, err := newIPT(f, iptBinaries(false)[f])
			if err != nil {
				return err
			}
			for _, c := range iptChains {
				for _, chain := range []string{c[1], c[2]} {
					if ok, err := ipt.ChainExists(c[0], chain); err != nil || !ok {
						continue // a family without mappings has no chains of ours
					}
					lines, err := ipt.List(c[0], chain)
					if err != nil {
						return err
					}
					lines = slices.DeleteFunc(lines, func(l string) bool { return !strings.HasPrefix(l, "-A ") })
					tb := &nftables.Table{Name: c[0], Family: nftFamily(f)}
					rules, err := conn.GetRules(tb, &nftables.Chain{Name: chain, Table: tb})
					if err != nil {
						return err
					}
					if len(rules) != len(lines) {
						return fmt.Errorf("%s %s: nftables has %d rules, iptables lists %d", f, chain, len(rules), len(lines))
					}
					for i, r := range rules {
						tag := ""
						if m := commentRE.FindStringSubmatch(lines[i]); m != nil {
							tag = m[1]
						}
						out = append(out, fmt.Sprintf("%s %s %s handle=%d comment=%q", f, c[0], chain, r.Handle, tag))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing iptables rules: %v", err)
	}
	return out
}

func TestIdempotentApply(t *testing.T) {
	t.Parallel()
	for _, mode := range []Mode{ModeNFTables, ModeIPTables} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ns := netnstest.New(t, "idem")
			if mode == ModeIPTables {
				netnstest.NeedRoot(t, "iptables", "ip6tables")
			}
			ctx := context.Background()
			r, err := New(ctx, Options{Mode: mode, NetNS: ns.Path})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			addrs := func(s ...string) []netip.Addr {
				var out []netip.Addr
				for _, a := range s {
					out = append(out, netip.MustParseAddr(a))
				}
				return out
			}
			a := Mapping{Name: "standalone", TailnetIPs: addrs("100.64.0.1", "fd7a:115c:a1e0::1"), Destinations: addrs("10.96.0.10", "fd00:96::10")}
			b := Mapping{Name: "svc:b", TailnetIPs: addrs("100.100.0.2"), Destinations: addrs("10.96.0.20", "10.96.0.21", "10.96.0.22")}
			c := Mapping{Name: "svc:c", TailnetIPs: addrs("fd7a:115c:a1e0::3"), Destinations: addrs("fd00:96::30")}
			bad := Mapping{Name: "svc:bad", TailnetIPs: addrs("100.100.0.9"), Destinations: addrs("fd00:96::99")}

			apply := func(ms ...Mapping) []string {
				t.Helper()
				st, err := r.Apply(ctx, ms)
				for _, m := range ms {
					s := st.Mappings[m.Name]
					if (s.Error != "") != (m.Name == bad.Name) {
						t.Fatalf("status of %s = %+v", m.Name, s)
					}
				}
				if hasBad := slices.ContainsFunc(ms, func(m Mapping) bool { return m.Name == bad.Name }); hasBad != (err != nil) {
					t.Fatalf("Apply error = %v, want one only for %s", err, bad.Name)
				}
				return ourRules(t, ns, mode)
			}
			ownedBy := func(name string) func(string) bool {
				return func(l string) bool { return strings.Contains(l, `comment="tsingress/`+name+`/`) }
			}

			first := apply(a, b, c, bad)
			// Per family: a jump or two, two clamp rules, a masquerade rule (nftables) and DNAT
			// rules; iptables has one masquerade rule per tailnet IP instead, with the mapping's.
			wantDNAT := map[string]int{"standalone": 2, "svc:b": 1, "svc:c": 1, "masquerade": 2}
			if mode == ModeIPTables {
				wantDNAT = map[string]int{"standalone": 4, "svc:b": 3 + 1, "svc:c": 2} // a DNAT rule per destination
			}
			for name, n := range wantDNAT {
				if got := len(slices.DeleteFunc(slices.Clone(first), func(l string) bool { return !ownedBy(name)(l) })); got != n {
					t.Errorf("%s has %d rules, want %d:\n%s", name, got, n, strings.Join(first, "\n"))
				}
			}
			if slices.ContainsFunc(first, ownedBy(bad.Name)) {
				t.Errorf("invalid mapping got rules:\n%s", strings.Join(first, "\n"))
			}
			whole := nftDump(t, ns)

			// Same set again, reordered, destinations shuffled: nothing changes anywhere.
			b2 := b
			b2.Destinations = slices.Clone(b.Destinations)
			slices.Reverse(b2.Destinations)
			if again := apply(c, bad, b2, a); !slices.Equal(again, first) {
				t.Fatalf("second Apply changed rules:\nbefore:\n%s\nafter:\n%s", strings.Join(first, "\n"), strings.Join(again, "\n"))
			}
			if w := nftDump(t, ns); !slices.Equal(w, whole) {
				t.Fatalf("second Apply changed the ruleset:\nbefore:\n%s\nafter:\n%s", strings.Join(whole, "\n"), strings.Join(w, "\n"))
			}

			// A fresh runner, as after a restart, finds the rules and leaves them be.
			r, err = New(ctx, Options{Mode: mode, NetNS: ns.Path})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if again := apply(a, b, c); !slices.Equal(again, first) {
				t.Fatalf("Apply after restart changed rules:\nbefore:\n%s\nafter:\n%s", strings.Join(first, "\n"), strings.Join(again, "\n"))
			}

			// Removing b removes exactly b's rules.
			withoutB := apply(a, c)
			if want := slices.DeleteFunc(slices.Clone(first), ownedBy("svc:b")); !slices.Equal(withoutB, want) {
				t.Fatalf("removing svc:b:\nwant:\n%s\ngot:\n%s", strings.Join(want, "\n"), strings.Join(withoutB, "\n"))
			}

			// Changing c re-creates c's rule only.
			c.Destinations = addrs("fd00:96::31")
			changed := apply(a, c)
			if got, want := slices.DeleteFunc(slices.Clone(changed), ownedBy("svc:c")), slices.DeleteFunc(slices.Clone(withoutB), ownedBy("svc:c")); !slices.Equal(got, want) {
				t.Fatalf("changing svc:c touched other rules:\nwant:\n%s\ngot:\n%s", strings.Join(want, "\n"), strings.Join(got, "\n"))
			}
			oldC := slices.DeleteFunc(slices.Clone(withoutB), func(l string) bool { return !ownedBy("svc:c")(l) })
			newC := slices.DeleteFunc(slices.Clone(changed), func(l string) bool { return !ownedBy("svc:c")(l) })
			if len(newC) != wantDNAT["svc:c"] || len(oldC) != wantDNAT["svc:c"] || slices.Equal(newC, oldC) {
				t.Fatalf("svc:c rule not replaced: before %q, after %q", oldC, newC)
			}

			// Only IPv6 left: the IPv4 table or chains go.
			only6 := apply(c)
			if slices.ContainsFunc(only6, func(l string) bool { return strings.Contains(l, " ip ") || strings.HasPrefix(l, "ipv4 ") }) {
				t.Fatalf("IPv4 rules remain with only an IPv6 mapping:\n%s", strings.Join(only6, "\n"))
			}
			if len(only6) == 0 {
				t.Fatal("IPv6 mapping has no rules")
			}
			if err := r.Cleanup(ctx); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if left := leftovers(t, ns, mode, false); len(left) > 0 {
				t.Errorf("after Cleanup, still installed:\n%s", strings.Join(left, "\n"))
			}
		})
	}
}

// After a change of mode, New removes what the previous backend or flavour installed.
func TestNewRemovesOtherModesRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		from, to   Mode
		fromLegacy bool
	}{
		{"nftables to iptables", ModeNFTables, ModeIPTables, false},
		{"iptables to nftables", ModeIPTables, ModeNFTables, false},
		{"iptables-legacy to iptables-nft", ModeIPTables, ModeIPTables, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ns := netnstest.New(t, "switch")
			netnstest.NeedRoot(t, "iptables", "ip6tables")
			legacyRule := []string{"INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"}
			if tc.fromLegacy {
				netnstest.NeedRoot(t, "iptables-legacy", "ip6tables-legacy")
				ns.Exec(t, append([]string{"iptables-legacy", "-A"}, legacyRule...)...)
			}
			ctx := context.Background()
			m := []Mapping{{Name: "standalone", TailnetIPs: addrs("100.64.0.1", "fd7a:115c:a1e0::1"), Destinations: addrs("10.96.0.10", "fd00:96::10")}}
			r, err := New(ctx, Options{Mode: tc.from, NetNS: ns.Path})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Apply(ctx, m); err != nil {
				t.Fatal(err)
			}
			checkBackendUsed(t, ns, tc.from, tc.fromLegacy)
			if tc.fromLegacy {
				// Without other legacy rules, detection now picks the nf_tables flavour.
				ns.Exec(t, append([]string{"iptables-legacy", "-D"}, legacyRule...)...)
			}

			if r, err = New(ctx, Options{Mode: tc.to, NetNS: ns.Path}); err != nil {
				t.Fatal(err)
			}
			left := leftovers(t, ns, ModeIPTables, false)
			if tc.fromLegacy {
				left = append(left, leftovers(t, ns, ModeIPTables, true)...)
			}
			if len(left) > 0 {
				t.Fatalf("after New in %s mode, rules of the previous mode remain:\n%s", tc.to, strings.Join(left, "\n"))
			}
			if _, err := r.Apply(ctx, m); err != nil {
				t.Fatal(err)
			}
			checkBackendUsed(t, ns, tc.to, false)
			if err := r.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
