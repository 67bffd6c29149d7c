package l3

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-iptables/iptables"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
)

const dbName = "db.example.test."

// A client node reaches, over the tailnet, the proxy node's tailnet IPs; the proxy's kernel
// TUN hands the packets to its namespace, whose DNAT sends them, masqueraded, through the
// node to a backend namespace whose only route is the node: TCP and UDP, IPv4 and IPv6, first
// to fixed IPs, then to a changed one, then to the answers of a DNS name as they change. With
// IPv6 disabled in the proxy's namespace, IPv4 works all the same and the status says why IPv6
// does not. Close leaves nothing behind.
func TestForwarder(t *testing.T) {
	netnstest.NeedRoot(t)
	t.Parallel()
	env := startTailnet(t)
	for _, mode := range []contract.FirewallMode{contract.FirewallNFTables, contract.FirewallIPTables} {
		for _, ipv6Off := range []bool{false, true} {
			name := string(mode)
			if ipv6Off {
				name += "/ipv6-disabled"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				if mode == contract.FirewallIPTables {
					netnstest.NeedRoot(t, "iptables")
				}
				testForwarder(t, env, mode, ipv6Off)
			})
		}
	}
}

func testForwarder(t *testing.T, env *tailnetEnv, mode contract.FirewallMode, ipv6Off bool) {
	ctx := t.Context()
	top := newTopology(t)
	if ipv6Off {
		top.Proxy.DisableIPv6(t)
	}
	dns := startDNS(t)
	dns.set(dbName, backendC4, backendC6)
	fwd, err := New(ctx, Options{NetNS: top.Proxy.Path, FirewallMode: mode, Logf: t.Logf,
		Resolver: dns.resolver(), ResolveInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { fwd.Close(context.Background()) })
	if got := fwd.Status().Mode; got != mode {
		t.Fatalf("status mode %q, want %q", got, mode)
	}
	// Asked from a thread outside the TUN's namespace, as wireguard-go does.
	if mtu, err := fwd.TUN().MTU(); err != nil || mtu != 1280 {
		t.Errorf("TUN MTU = %d, %v; want 1280", mtu, err)
	}
	host := strings.ReplaceAll(name(t), "/", "-")
	proxy := env.join(t, "proxy-"+host, fwd.TUN())
	client := env.join(t, "client-"+host, nil)

	ip4, ip6 := proxy.TailscaleIPs()
	tailnetIPs := []netip.Addr{ip4, ip6}
	forwarded := tailnetIPs // what the status reports as forwarded
	err = fwd.SetTailnetIPs(tailnetIPs)
	if ipv6Off {
		// The IPv6 address cannot be added; the IPv4 one is, and the status says why.
		forwarded = tailnetIPs[:1]
		if fam := fwd.Status().Families[contract.FamilyIPv6]; fam.Reason != contract.FamilyDisabled || !strings.Contains(fam.Message, "disable_ipv6=1") {
			t.Errorf("IPv6 family status %+v, want %s naming disable_ipv6", fam, contract.FamilyDisabled)
		}
	} else if err != nil {
		t.Fatalf("SetTailnetIPs: %v", err)
	}
	if fam, ok := fwd.Status().Families[contract.FamilyIPv4]; ok {
		t.Errorf("IPv4 family status %+v, want none: forwarding was turned on", fam)
	}
	checkLink(t, top.Proxy, forwarded)

	apply := func(dst contract.Destination, wantDst ...netip.Addr) {
		t.Helper()
		drain(fwd.Changed())
		err := fwd.SetMappings(ctx, []Mapping{{Name: contract.StandaloneMapping, TailnetIPs: tailnetIPs, Destination: dst}})
		switch {
		case ipv6Off && (err == nil || !strings.Contains(err.Error(), "ipv6: IPv6 is disabled")):
			t.Fatalf("SetMappings(%+v) = %v, want an error for IPv6", dst, err)
		case !ipv6Off && err != nil:
			t.Fatalf("SetMappings(%+v): %v", dst, err)
		}
		if ipv6Off {
			wantDst = slices.DeleteFunc(slices.Clone(wantDst), netip.Addr.Is6)
		}
		waitStatus(t, fwd, forwarded, wantDst, ipv6Off)
	}
	expect := func(want4, want6 netip.Addr) {
		t.Helper()
		cases := []struct {
			dst, want netip.Addr
		}{{ip4, want4}, {ip6, want6}}
		if ipv6Off {
			cases = cases[:1]
		}
		for _, c := range cases {
			eventually(t, fmt.Sprintf("TCP to %s", c.dst), 10*time.Second, c.want.String(), func(ctx context.Context) (string, error) {
				return tcpEcho(ctx, client, c.dst, "hello over tcp to "+c.dst.String())
			})
			eventually(t, fmt.Sprintf("UDP to %s", c.dst), 10*time.Second, c.want.String(), func(ctx context.Context) (string, error) {
				return udpEcho(ctx, client, c.dst, "hello over udp to "+c.dst.String())
			})
		}
	}

	apply(contract.Destination{IPs: []string{backendA4.String(), backendA6.String()}}, backendA4, backendA6)
	expect(backendA4, backendA6)

	apply(contract.Destination{IPs: []string{backendB4.String(), backendB6.String()}}, backendB4, backendB6)
	expect(backendB4, backendB6)

	apply(contract.Destination{DNSName: dbName}, backendC4, backendC6)
	expect(backendC4, backendC6)

	// A changed answer moves the rules at the next lookup; the same answer again changes
	// nothing.
	drain(fwd.Changed())
	dns.set(dbName, backendD4, backendD6)
	select {
	case <-fwd.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("no status change after the DNS answer changed")
	}
	wantD := []netip.Addr{backendD4, backendD6}
	if ipv6Off {
		wantD = wantD[:1]
	}
	waitStatus(t, fwd, forwarded, wantD, ipv6Off)
	expect(backendD4, backendD6)
	drain(fwd.Changed())
	for seen, deadline := dns.queries.Load(), time.Now().Add(5*time.Second); dns.queries.Load() < seen+4; { // two lookups, A and AAAA
		if time.Now().After(deadline) {
			t.Fatal("the forwarder stopped resolving")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-fwd.Changed():
		t.Errorf("status changed after the same DNS answer: %+v", fwd.Status())
	default:
	}

	if err := fwd.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if st := fwd.Status(); len(st.Mappings) != 0 {
		t.Errorf("status after Close: %+v, want no mappings", st)
	}
	if left := leftovers(t, top.Proxy, mode, "tailscale0"); len(left) > 0 {
		t.Errorf("after Close, still there:\n%s", strings.Join(left, "\n"))
	}
	expectUnreachable(t, top, client, ip4, ip6)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// name is the test's name below its top-level test.
func name(t *testing.T) string {
	_, sub, _ := strings.Cut(t.Name(), "/")
	return sub
}

func drain(c <-chan struct{}) {
	select {
	case <-c:
	default:
	}
}

// waitStatus waits until the standalone mapping reports tailnetIPs forwarded to dst, and an
// IPv6 error exactly when ipv6Failed.
func waitStatus(t *testing.T, fwd *Forwarder, tailnetIPs, dst []netip.Addr, ipv6Failed bool) {
	t.Helper()
	want := contract.AppliedDNAT{TailnetIPs: addrStrings(tailnetIPs), Destinations: addrStrings(dst)}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := fwd.Status().Mappings[contract.StandaloneMapping]
		_, v6err := got.FamilyErrors[contract.FamilyIPv6]
		if slices.Equal(got.TailnetIPs, want.TailnetIPs) && slices.Equal(got.Destinations, want.Destinations) &&
			(got.Error == "") != ipv6Failed && v6err == ipv6Failed && len(got.FamilyErrors) == len(want.FamilyErrors)+btoi(ipv6Failed) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, want %+v", got, want)
		}
		select {
		case <-fwd.Changed():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// checkLink checks that the TUN holds the tailnet IPs and that the tailnet ranges route to it.
func checkLink(t *testing.T, ns netnstest.NS, ips []netip.Addr) {
	t.Helper()
	h, err := netlinkHandle(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName("tailscale0")
	if err != nil {
		t.Fatalf("TUN in the proxy namespace: %v", err)
	}
	if link.Type() != "tuntap" || link.Attrs().Flags&unix.IFF_UP == 0 {
		t.Errorf("TUN is %s with flags %v, want an up tuntap", link.Type(), link.Attrs().Flags)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			got = append(got, a.IPNet.String())
		}
	}
	var want []string
	for _, ip := range ips {
		want = append(want, netip.PrefixFrom(ip, ip.BitLen()).String())
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("TUN addresses %v, want %v", got, want)
	}
	// Other nodes' addresses, at the far ends of the ranges.
	peers := []string{"100.127.255.254", "fd7a:115c:a1e0:ffff::1"}
	if len(ips) == 1 {
		peers = peers[:1]
	}
	for _, peer := range peers {
		routes, err := h.RouteGet(netip.MustParseAddr(peer).AsSlice())
		if err != nil || len(routes) == 0 || routes[0].LinkIndex != link.Attrs().Index {
			t.Errorf("route to %s: %+v, %v; want through the TUN", peer, routes, err)
		}
	}
}

// leftovers lists what of ours is still in the namespace: the TUN, nftables tables or chains
// (iptables-nft keeps its chains there too), iptables chains.
func leftovers(t *testing.T, ns netnstest.NS, mode contract.FirewallMode, tunName string) []string {
	t.Helper()
	var left []string
	h, err := netlinkHandle(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if l, err := h.LinkByName(tunName); err == nil {
		left = append(left, "link "+l.Attrs().Name)
	}
	f, err := os.Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if strings.Contains(strings.ToLower(ch.Table.Name+" "+ch.Name), "tsingress") {
			left = append(left, fmt.Sprintf("nftables chain %s %s", ch.Table.Name, ch.Name))
		}
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if strings.Contains(tb.Name, "tsingress") {
			left = append(left, "nftables table "+tb.Name)
		}
	}
	if mode != contract.FirewallIPTables {
		return left
	}
	err = netnamespace.Run(ns.Path, func() error {
		for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
			ipt, err := iptables.New(iptables.IPFamily(proto))
			if err != nil {
				return err
			}
			for _, table := range []string{"nat", "mangle"} {
				chains, err := ipt.ListChains(table)
				if err != nil {
					return err
				}
				for _, ch := range chains {
					rules, err := ipt.List(table, ch)
					if err != nil {
						return err
					}
					for _, r := range rules {
						if strings.Contains(strings.ToLower(r), "tsingress") {
							left = append(left, fmt.Sprintf("iptables %v %s: %s", proto, table, r))
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("iptables listing: %v", err)
	}
	return left
}

// expectUnreachable checks that neither TCP nor UDP to the proxy's tailnet IPs reaches a
// backend any more.
func expectUnreachable(t *testing.T, top *topology, client *tsnet.Server, ips ...netip.Addr) {
	t.Helper()
	before := top.hits.Load()
	for _, ip := range ips {
		for proto, probe := range map[string]func(context.Context, *tsnet.Server, netip.Addr, string) (string, error){"TCP": tcpEcho, "UDP": udpEcho} {
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			if got, err := probe(ctx, client, ip, "anyone?"); err == nil {
				t.Errorf("%s to %s still reached %s", proto, ip, got)
			}
			cancel()
		}
	}
	if after := top.hits.Load(); after != before {
		t.Errorf("backends saw %d connections or datagrams after Close, want none", after-before)
	}
}

// Without a tailnet: what each mapping reports, per family and on failure, and the TUN's
// addresses following SetTailnetIPs.
func TestForwarderStatus(t *testing.T) {
	netnstest.NeedRoot(t)
	t.Parallel()
	ns := netnstest.New(t, "s")
	dns := startDNS(t)
	dns.set(dbName, backendC4)
	ctx := t.Context()
	fwd, err := New(ctx, Options{NetNS: ns.Path, TunName: "ts-test0", Logf: t.Logf, Resolver: dns.resolver()})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { fwd.Close(context.Background()) })

	self := addrs("100.64.0.1", "fd7a:115c:a1e0::1")
	vip := addrs("100.100.0.1", "fd7a:115c:a1e0:ab12::1")
	err = fwd.SetMappings(ctx, []Mapping{
		{Name: contract.StandaloneMapping, TailnetIPs: self, Destination: contract.Destination{IPs: []string{"10.96.0.10"}}},
		{Name: "svc:v6only", TailnetIPs: vip[:1], Destination: contract.Destination{IPs: []string{"fd00:96::10"}}},
		{Name: "svc:dns", TailnetIPs: vip[1:], Destination: contract.Destination{DNSName: dbName}},
		{Name: "svc:nxdomain", TailnetIPs: addrs("100.100.0.2"), Destination: contract.Destination{DNSName: "nowhere.example.test"}},
	})
	if err == nil || !strings.Contains(err.Error(), "svc:v6only") || !strings.Contains(err.Error(), "svc:nxdomain") {
		t.Errorf("SetMappings error %v, want one naming svc:v6only and svc:nxdomain", err)
	}
	st := fwd.Status()
	if st.Mode != contract.FirewallNFTables {
		t.Errorf("mode %q in an empty namespace, want nftables", st.Mode)
	}
	for name, want := range map[string]contract.AppliedDNAT{
		// Only the family the destination has is forwarded.
		contract.StandaloneMapping: {TailnetIPs: []string{"100.64.0.1"}, Destinations: []string{"10.96.0.10"}},
		"svc:v6only":               {Error: "no tailnet IP has a destination of its address family"},
		// An IPv6 VIP with only an IPv4 answer: nothing to forward either.
		"svc:dns":      {Error: "no tailnet IP has a destination of its address family"},
		"svc:nxdomain": {Error: "resolve nowhere.example.test: "},
	} {
		got := st.Mappings[name]
		if !slices.Equal(got.TailnetIPs, want.TailnetIPs) || !slices.Equal(got.Destinations, want.Destinations) ||
			!strings.Contains(got.Error, want.Error) || (got.Error == "") != (want.Error == "") {
			t.Errorf("status of %s = %+v, want %+v", name, got, want)
		}
	}
	if err := fwd.SetMappings(ctx, []Mapping{{Name: "a"}, {Name: "a"}}); err == nil {
		t.Error("SetMappings took two mappings of the same name")
	}

	h, err := netlinkHandle(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	tunAddrs := func() []string {
		l, err := h.LinkByName("ts-test0")
		if err != nil {
			t.Fatal(err)
		}
		as, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range as {
			if !a.IP.IsLinkLocalUnicast() {
				out = append(out, a.IPNet.String())
			}
		}
		slices.Sort(out)
		return out
	}
	if err := fwd.SetTailnetIPs([]netip.Addr{{}}); err == nil {
		t.Error("SetTailnetIPs took the zero address")
	}
	if err := fwd.SetTailnetIPs(self); err != nil {
		t.Fatalf("SetTailnetIPs: %v", err)
	}
	if got, want := tunAddrs(), []string{"100.64.0.1/32", "fd7a:115c:a1e0::1/128"}; !slices.Equal(got, want) {
		t.Errorf("TUN addresses %v, want %v", got, want)
	}
	// A new IPv4 address replaces the old one; without an IPv6 address the IPv6 range still
	// routes into the TUN, as both do from the start: tailnet traffic never takes the default
	// route.
	if err := fwd.SetTailnetIPs(addrs("100.64.0.9")); err != nil {
		t.Fatalf("SetTailnetIPs: %v", err)
	}
	if got, want := tunAddrs(), []string{"100.64.0.9/32"}; !slices.Equal(got, want) {
		t.Errorf("TUN addresses %v, want %v", got, want)
	}
	tun, err := h.LinkByName("ts-test0")
	if err != nil {
		t.Fatal(err)
	}
	for _, peer := range []string{"100.64.0.2", "fd7a:115c:a1e0::2"} {
		if routes, err := h.RouteGet(net.ParseIP(peer)); err != nil || len(routes) == 0 || routes[0].LinkIndex != tun.Attrs().Index {
			t.Errorf("route to %s: %+v, %v; want through the TUN", peer, routes, err)
		}
	}

	// As tsnet does when it shuts down first. Its error can be a benign EPIPE (see remove);
	// what counts is checked below.
	fwd.TUN().Close()
	if err := fwd.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := fwd.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := fwd.SetTailnetIPs(self); err == nil {
		t.Error("SetTailnetIPs after Close succeeded")
	}
	if err := fwd.SetMappings(ctx, nil); err == nil {
		t.Error("SetMappings after Close succeeded")
	}
	if left := leftovers(t, ns, contract.FirewallNFTables, "ts-test0"); len(left) > 0 {
		t.Errorf("after Close, still there:\n%s", strings.Join(left, "\n"))
	}
}
