package firewall

import (
	"bytes"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeAuto, "auto": ModeAuto, "nftables": ModeNFTables, "iptables": ModeIPTables} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"nft", "IPTABLES", "legacy"} {
		if _, err := ParseMode(in); err == nil {
			t.Errorf("ParseMode(%q) succeeded", in)
		}
	}
	if _, err := New(t.Context(), Options{Mode: "bogus"}); err == nil {
		t.Error("New accepted mode bogus")
	}
	for _, name := range []string{"sixteen-chars-00", "a/b", "a b"} {
		if _, err := New(t.Context(), Options{TunName: name}); err == nil {
			t.Errorf("New accepted interface name %q", name)
		}
	}
}

func TestBuildPlan(t *testing.T) {
	p := buildPlan([]Mapping{
		{Name: "svc:web", TailnetIPs: addrs("fd7a:115c:a1e0::5", "100.100.1.5"), Destinations: addrs("10.0.0.9", "10.0.0.9", "fd00::9", "10.0.0.1")},
		{Name: "standalone", TailnetIPs: addrs("100.64.0.1", "fd7a:115c:a1e0::1"), Destinations: addrs("10.96.0.10")},
	}, "tailscale0")
	if len(p.errs) != 0 {
		t.Fatalf("errors: %v", p.errs)
	}
	v4, v6 := p.fams[ipv4], p.fams[ipv6]
	if got := []string{v4.dnat[0].name, v4.dnat[1].name}; !slices.Equal(got, []string{"standalone", "svc:web"}) {
		t.Errorf("IPv4 owners %v, want sorted by name", got)
	}
	if web := v4.dnat[1].rules; len(web) != 1 || web[0].from != netip.MustParseAddr("100.100.1.5") || !slices.Equal(web[0].to, addrs("10.0.0.1", "10.0.0.9")) {
		t.Errorf("svc:web IPv4 rules = %+v, want 100.100.1.5 to the sorted, deduplicated destinations", web)
	}
	if len(v6.dnat) != 1 || v6.dnat[0].name != "svc:web" || !slices.Equal(v6.dnat[0].rules[0].to, addrs("fd00::9")) {
		t.Errorf("IPv6 owners = %+v, want only svc:web (standalone has no IPv6 destination)", v6.dnat)
	}
	for f, fp := range p.fams {
		if len(fp.clamp) != 2 || !fp.clamp[0].in || fp.clamp[1].in || fp.clamp[0].ifName != "tailscale0" {
			t.Errorf("%s clamp = %+v, want in and out on tailscale0", family(f), fp.clamp)
		}
	}
	if st := p.status["standalone"]; st.Error != "" || !slices.Equal(st.TailnetIPs, addrs("100.64.0.1")) || !slices.Equal(st.Destinations, addrs("10.96.0.10")) {
		t.Errorf("standalone status = %+v, want only the IPv4 pair in use", st)
	}
	if st := p.status["svc:web"]; !slices.Equal(st.TailnetIPs, addrs("100.100.1.5", "fd7a:115c:a1e0::5")) {
		t.Errorf("svc:web status = %+v", st)
	}

	// Tags name the owner, are stable, and follow the content.
	again := buildPlan([]Mapping{{Name: "svc:web", TailnetIPs: addrs("100.100.1.5"), Destinations: addrs("10.0.0.1", "10.0.0.9")}}, "tailscale0")
	if a, b := v4.dnat[1].tag, again.fams[ipv4].dnat[0].tag; a != b || !strings.HasPrefix(a, "tsingress/svc:web/") {
		t.Errorf("tags %q and %q differ for the same IPv4 rule", a, b)
	}
	changed := buildPlan([]Mapping{{Name: "svc:web", TailnetIPs: addrs("100.100.1.5"), Destinations: addrs("10.0.0.1")}}, "tailscale0")
	if changed.fams[ipv4].dnat[0].tag == v4.dnat[1].tag {
		t.Error("tag unchanged after a destination change")
	}
	otherTun := buildPlan([]Mapping{{Name: "svc:web", TailnetIPs: addrs("100.100.1.5"), Destinations: addrs("10.0.0.1")}}, "ts1")
	if otherTun.fams[ipv4].clamp[0].tag == v4.clamp[0].tag {
		t.Error("clamp tag unchanged after an interface change")
	}
	if len(changed.fams[ipv6].clamp) != 0 {
		t.Error("a family without mappings gets clamp rules")
	}
}

func TestBuildPlanRejects(t *testing.T) {
	good := Mapping{Name: "svc:a", TailnetIPs: addrs("100.64.0.1"), Destinations: addrs("10.0.0.1")}
	for _, tc := range []struct {
		name string
		m    Mapping
		want string
	}{
		{"empty name", Mapping{TailnetIPs: good.TailnetIPs, Destinations: good.Destinations}, "name"},
		{"space in name", Mapping{Name: "svc a", TailnetIPs: good.TailnetIPs, Destinations: good.Destinations}, "name"},
		{"slash in name", Mapping{Name: "svc/a", TailnetIPs: good.TailnetIPs, Destinations: good.Destinations}, "name"},
		{"no tailnet IP", Mapping{Name: "b", Destinations: good.Destinations}, "tailnet IPs: none given"},
		{"no destination", Mapping{Name: "b", TailnetIPs: addrs("100.64.0.2")}, "destinations: none given"},
		{"invalid address", Mapping{Name: "b", TailnetIPs: []netip.Addr{{}}, Destinations: good.Destinations}, "not a usable"},
		{"zone", Mapping{Name: "b", TailnetIPs: addrs("fe80::1%eth0"), Destinations: addrs("fd00::1")}, "not a usable"},
		{"4in6", Mapping{Name: "b", TailnetIPs: addrs("::ffff:100.64.0.2"), Destinations: good.Destinations}, "not a usable"},
		{"families do not meet", Mapping{Name: "b", TailnetIPs: addrs("100.64.0.2"), Destinations: addrs("fd00::1")}, "no tailnet IP has a destination"},
		{"tailnet IP taken", Mapping{Name: "b", TailnetIPs: addrs("100.64.0.1"), Destinations: addrs("10.0.0.2")}, "already used by mapping svc:a"},
		{"duplicate name", Mapping{Name: "svc:a", TailnetIPs: addrs("100.64.0.3"), Destinations: addrs("10.0.0.3")}, "duplicate name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := buildPlan([]Mapping{good, tc.m}, "tailscale0")
			if len(p.errs) != 1 || !strings.Contains(p.errs[0].Error(), tc.want) {
				t.Fatalf("errors %v, want one containing %q", p.errs, tc.want)
			}
			if st := p.status["svc:a"]; st.Error != "" {
				t.Errorf("the valid mapping failed too: %+v", st)
			}
			if tc.want != "duplicate name" && !strings.Contains(p.status[tc.m.Name].Error, tc.want) {
				t.Errorf("status of %q = %+v, want its error", tc.m.Name, p.status[tc.m.Name])
			}
			if n := len(p.fams[ipv4].dnat) + len(p.fams[ipv6].dnat); n != 1 {
				t.Errorf("%d owners planned, want only the valid one", n)
			}
		})
	}
}

func TestPlanFailures(t *testing.T) {
	p := buildPlan([]Mapping{{Name: "a", TailnetIPs: addrs("100.64.0.1", "fd7a::1"), Destinations: addrs("10.0.0.1", "fd00::1")}}, "t")
	p.fail("a", ipv6, errFake("boom"))
	p.failFamily(ipv4, errFake("no table"))
	if got, want := p.status["a"].Error, "ipv6: boom; ipv4: no table"; got != want {
		t.Errorf("status error %q, want %q", got, want)
	}
	if got, want := p.status["a"].FamilyErrors, map[string]string{"ipv4": "no table", "ipv6": "boom"}; !reflect.DeepEqual(got, want) {
		t.Errorf("family errors %v, want %v", got, want)
	}
	if st := p.status["a"]; len(st.TailnetIPs)+len(st.Destinations) != 0 {
		t.Errorf("failed families still listed: %+v", st)
	}

	// One family failing leaves the other's addresses in the status.
	p = buildPlan([]Mapping{{Name: "a", TailnetIPs: addrs("100.64.0.1", "fd7a::1"), Destinations: addrs("10.0.0.1", "fd00::1")}}, "t")
	p.fail("a", ipv6, errFake("boom"))
	p.fail("a", ipv6, errFake("again"))
	if st := p.status["a"]; !slices.Equal(st.TailnetIPs, addrs("100.64.0.1")) || !slices.Equal(st.Destinations, addrs("10.0.0.1")) ||
		st.FamilyErrors["ipv6"] != "boom; again" || st.FamilyErrors["ipv4"] != "" {
		t.Errorf("status %+v, want IPv4 in place and both IPv6 errors", st)
	}
	if len(p.errs) != 2 {
		t.Errorf("errs = %v, want two", p.errs)
	}
}

type errFake string

func (e errFake) Error() string { return string(e) }

func TestTagOwner(t *testing.T) {
	for tag, want := range map[string]string{
		makeTag("svc:web", "x"):    "svc:web",
		makeTag("standalone", ""):  "standalone",
		"tsingress/a.b-c/0123abcd": "a.b-c",
	} {
		if got, ok := tagOwner(tag); !ok || got != want {
			t.Errorf("tagOwner(%q) = %q, %v; want %q", tag, got, ok, want)
		}
	}
	for _, tag := range []string{"", "tsingress/jump", "tsingress//0123abcd", "other/x/0123abcd", "tsingress/x/0123"} {
		if got, ok := tagOwner(tag); ok {
			t.Errorf("tagOwner(%q) = %q, want no owner", tag, got)
		}
	}
}

func TestDiffChain(t *testing.T) {
	tagA, tagB, tagB2 := makeTag("a", "1"), makeTag("b", "1"), makeTag("b", "2")
	wants := []want{{owner: "a", tag: tagA, n: 1}, {owner: "b", tag: tagB2, n: 2}, {owner: "c", tag: makeTag("c", "1"), n: 1}}
	d := diffChain([]found{
		{id: 1, tag: tagA},             // as wanted
		{id: 2, tag: tagB},             // b changed
		{id: 3, tag: ""},               // not ours
		{id: 4, tag: makeTag("z", "")}, // owner gone
		{id: 5, tag: tagB2},            // half of the new b: still reinstalled
	}, wants)
	if !slices.Equal(d.install, []int{1, 2}) {
		t.Errorf("install = %v, want b and c", d.install)
	}
	if !reflect.DeepEqual(d.replaced, map[int][]uint64{1: {2, 5}}) {
		t.Errorf("replaced = %v, want b's rules 2 and 5", d.replaced)
	}
	if !slices.Equal(d.stale, []uint64{3, 4}) {
		t.Errorf("stale = %v, want 3 and 4", d.stale)
	}
	if d := diffChain([]found{{id: 7, tag: tagA}}, wants[:1]); len(d.install)+len(d.stale) != 0 {
		t.Errorf("an exact chain needs changes: %+v", d)
	}
}

func TestIPTablesSpecs(t *testing.T) {
	one := dnatSpecs(dnat{from: netip.MustParseAddr("100.64.0.1"), to: addrs("10.96.0.10")}, "T")
	if got, want := strings.Join(one[0], " "), "-d 100.64.0.1/32 -m comment --comment T -j DNAT --to-destination 10.96.0.10"; len(one) != 1 || got != want {
		t.Errorf("single destination:\n got %v\nwant %s", one, want)
	}
	three := dnatSpecs(dnat{from: netip.MustParseAddr("fd7a::1"), to: addrs("fd00::1", "fd00::2", "fd00::3")}, "T")
	want := []string{
		"-d fd7a::1/128 -m statistic --mode nth --every 3 --packet 0 -m comment --comment T -j DNAT --to-destination fd00::1",
		"-d fd7a::1/128 -m statistic --mode nth --every 2 --packet 0 -m comment --comment T -j DNAT --to-destination fd00::2",
		"-d fd7a::1/128 -m comment --comment T -j DNAT --to-destination fd00::3",
	}
	for i := range want {
		if i >= len(three) || strings.Join(three[i], " ") != want[i] {
			t.Errorf("rule %d:\n got %v\nwant %s", i, three, want[i])
		}
	}
	snat := strings.Join(snatSpec(netip.MustParseAddr("fd7a::1"), "tailscale0", "T"), " ")
	if want := "! -o tailscale0 -m conntrack --ctstate DNAT --ctorigdst fd7a::1/128 -m comment --comment T -j MASQUERADE"; snat != want {
		t.Errorf("source NAT:\n got %s\nwant %s", snat, want)
	}
	in := strings.Join(clampSpec(clampRule{tag: "T", ifName: "tailscale0", in: true}), " ")
	if want := "-i tailscale0 -p tcp -m tcp --tcp-flags SYN,RST SYN -m comment --comment T -j TCPMSS --clamp-mss-to-pmtu"; in != want {
		t.Errorf("clamp in:\n got %s\nwant %s", in, want)
	}
	if out := clampSpec(clampRule{tag: "T", ifName: "tailscale0"}); out[0] != "-o" {
		t.Errorf("clamp out starts %v", out[:2])
	}
}

func TestCommentRE(t *testing.T) {
	for line, want := range map[string]string{
		`-A TSINGRESS-PREROUTING -d 100.64.0.1/32 -m comment --comment "tsingress/svc:a/0123abcd" -j DNAT --to-destination 10.0.0.1`: "tsingress/svc:a/0123abcd",
		`-A TSINGRESS-PREROUTING -m comment --comment tsingress/a/0123abcd -j ACCEPT`:                                                "tsingress/a/0123abcd",
		`-A TSINGRESS-PREROUTING -m comment --comment "two words" -j ACCEPT`:                                                         "two",
	} {
		m := commentRE.FindStringSubmatch(line)
		if m == nil || m[1] != want {
			t.Errorf("comment of %q = %v, want %q", line, m, want)
		}
	}
	if m := commentRE.FindStringSubmatch(`-A X -j ACCEPT`); m != nil {
		t.Errorf("found a comment in a rule without one: %v", m)
	}
}

func TestNFTDNATExprs(t *testing.T) {
	tbl := &nftables.Table{Name: nftTable, Family: nftables.TableFamilyIPv4}
	exprs, set, _ := dnatExprs(tbl, dnat{from: netip.MustParseAddr("100.64.0.1"), to: addrs("10.96.0.10")}, 1)
	if set != nil || len(exprs) != 4 {
		t.Fatalf("single destination: %d exprs, set %v", len(exprs), set)
	}
	if p := exprs[0].(*expr.Payload); p.Offset != 16 || p.Len != 4 || p.Base != expr.PayloadBaseNetworkHeader {
		t.Errorf("payload %+v, want IPv4 daddr", p)
	}
	if c := exprs[1].(*expr.Cmp); !bytes.Equal(c.Data, []byte{100, 64, 0, 1}) {
		t.Errorf("cmp %v", c.Data)
	}
	if im := exprs[2].(*expr.Immediate); !bytes.Equal(im.Data, []byte{10, 96, 0, 10}) {
		t.Errorf("immediate %v", im.Data)
	}
	if n := exprs[3].(*expr.NAT); n.Type != expr.NATTypeDestNAT || n.Family != unix.NFPROTO_IPV4 || n.RegAddrMin != 1 || n.RegProtoMin != 0 {
		t.Errorf("nat %+v, want address-only DNAT", n)
	}

	tbl6 := &nftables.Table{Name: nftTable, Family: nftables.TableFamilyIPv6}
	exprs, set, elems := dnatExprs(tbl6, dnat{from: netip.MustParseAddr("fd7a::1"), to: addrs("fd00::1", "fd00::2", "fd00::3")}, 7)
	if set == nil || !set.Anonymous || !set.IsMap || set.ID != 7 || set.DataType.Name != nftables.TypeIP6Addr.Name || len(elems) != 3 {
		t.Fatalf("map %+v with %d elements", set, len(elems))
	}
	for i, e := range elems {
		if !bytes.Equal(e.Key, []byte{0, 0, 0, byte(i)}) || !bytes.Equal(e.Val, addrs("fd00::1", "fd00::2", "fd00::3")[i].AsSlice()) {
			t.Errorf("element %d = %v : %v", i, e.Key, e.Val)
		}
	}
	if p := exprs[0].(*expr.Payload); p.Offset != 24 || p.Len != 16 {
		t.Errorf("payload %+v, want IPv6 daddr", p)
	}
	if ng := exprs[2].(*expr.Numgen); ng.Modulus != 3 || ng.Type != unix.NFT_NG_RANDOM {
		t.Errorf("numgen %+v", ng)
	}
	if lk := exprs[4].(*expr.Lookup); lk.SetID != 7 || !lk.IsDestRegSet || lk.DestRegister != 1 {
		t.Errorf("lookup %+v", lk)
	}
	if n := exprs[5].(*expr.NAT); n.Family != unix.NFPROTO_IPV6 {
		t.Errorf("nat family %d", n.Family)
	}
}

func TestNFTSNATExprs(t *testing.T) {
	e := snatExprs("tailscale0")
	if e[0].(*expr.Meta).Key != expr.MetaKeyIIFNAME || e[1].(*expr.Cmp).Op != expr.CmpOpEq ||
		e[2].(*expr.Meta).Key != expr.MetaKeyOIFNAME || e[3].(*expr.Cmp).Op != expr.CmpOpNeq {
		t.Error("want in through the tunnel, out by another interface")
	}
	if ct := e[4].(*expr.Ct); ct.Key != expr.CtKeySTATUS {
		t.Errorf("ct key %v, want status", ct.Key)
	}
	if bw := e[5].(*expr.Bitwise); !bytes.Equal(bw.Mask, binaryutil.NativeEndian.PutUint32(0x20)) {
		t.Errorf("status mask %v, want IPS_DST_NAT", bw.Mask)
	}
	if _, ok := e[len(e)-1].(*expr.Masq); !ok {
		t.Errorf("last expression %T, want masquerade", e[len(e)-1])
	}
}

func TestNFTClampExprs(t *testing.T) {
	in, out := clampExprs(clampRule{ifName: "tailscale0", in: true}), clampExprs(clampRule{ifName: "tailscale0"})
	if in[0].(*expr.Meta).Key != expr.MetaKeyIIFNAME || out[0].(*expr.Meta).Key != expr.MetaKeyOIFNAME {
		t.Error("in matches iifname and out oifname")
	}
	if name := in[1].(*expr.Cmp).Data; len(name) != unix.IFNAMSIZ || !bytes.HasPrefix(name, []byte("tailscale0\x00")) {
		t.Errorf("interface name %q, want NUL-padded to IFNAMSIZ", name)
	}
	if bw := in[5].(*expr.Bitwise); !bytes.Equal(bw.Mask, []byte{tcpSYN | tcpRST}) || !bytes.Equal(in[6].(*expr.Cmp).Data, []byte{tcpSYN}) {
		t.Errorf("flags test %+v", bw)
	}
	if rt := in[7].(*expr.Rt); rt.Key != expr.RtTCPMSS {
		t.Errorf("rt key %v", rt.Key)
	}
	if ex := in[9].(*expr.Exthdr); ex.Op != expr.ExthdrOpTcpopt || ex.Type != tcpOptMaxSeg || ex.SourceRegister != 1 || ex.Len != 2 {
		t.Errorf("exthdr %+v, want a write of the MSS option", ex)
	}
}
