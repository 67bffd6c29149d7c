package firewall

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
)

// Addresses exist only inside the test's namespaces.
var (
	tailnet4  = netip.MustParseAddr("100.64.0.1")
	tailnet6  = netip.MustParseAddr("fd7a:115c:a1e0::1")
	ext4      = netip.MustParseAddr("100.64.0.2")
	ext6      = netip.MustParseAddr("fd7a:115c:a1e0::2")
	backendA4 = netip.MustParseAddr("10.96.0.10")
	backendB4 = netip.MustParseAddr("10.96.0.11")
	backendA6 = netip.MustParseAddr("fd00:96::10")
	backendB6 = netip.MustParseAddr("fd00:96::11")
)

const (
	tcpPort = 8080
	udpPort = 8081
	// pathMTU is the proxy's route MTU towards the backends; clamped SYNs carry MSS at most
	// pathMTU minus the IP and TCP headers, where the client's own would be 1460 or 1440.
	pathMTU = 1280
)

// topology is client <-> proxy <-> node <-> backend, as a cluster has it. The proxy's
// client-facing veth is called tailscale0 and holds the tailnet IPs, standing in for the tunnel;
// the client sends from a tailnet address, as tailnet clients do. Behind the proxy is the node
// (the proxy Pod's default gateway), which routes the "ClusterIPs" to the backend, holding them
// on its loopback, and knows nothing of the tailnet; the backend's only route is its default
// gateway, the node. So replies reach the client only when the proxy rewrote their destination
// to itself: no source NAT, no answer.
type topology struct {
	client, proxy, node, backend netnstest.NS
	hits                         *hitCounter
}

// Cluster-side addresses of the proxy: what the backend sees as the source of proxied traffic.
var (
	proxyCluster4 = netip.MustParseAddr("10.250.1.2")
	proxyCluster6 = netip.MustParseAddr("fd00:250:1::2")
	// The tailnet client's own address, the source of everything it sends.
	client4 = netip.MustParseAddr("100.64.0.100")
	client6 = netip.MustParseAddr("fd7a:115c:a1e0::100")
)

func newTopology(t *testing.T) *topology {
	t.Helper()
	top := &topology{client: netnstest.New(t, "c"), proxy: netnstest.New(t, "p"), node: netnstest.New(t, "n"), backend: netnstest.New(t, "b"), hits: &hitCounter{n: map[string]int{}}}
	c, p, n, b := top.client, top.proxy, top.node, top.backend
	c.IP(t, "link", "add", "eth0", "type", "veth", "peer", "name", "tailscale0", "netns", p.Name)
	p.IP(t, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", n.Name)
	n.IP(t, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", b.Name)
	addr := func(ns netnstest.NS, dev string, addrs ...string) {
		for _, a := range addrs {
			ns.IP(t, "addr", "add", a, "dev", dev)
		}
		ns.IP(t, "link", "set", dev, "up")
	}
	addr(c, "eth0", "10.250.0.2/24", "fd00:250::2/64", client4.String()+"/32", client6.String()+"/128")
	addr(p, "tailscale0", "10.250.0.1/24", "fd00:250::1/64", tailnet4.String()+"/32", tailnet6.String()+"/128")
	addr(p, "eth1", proxyCluster4.String()+"/24", proxyCluster6.String()+"/64")
	addr(n, "eth0", "10.250.1.1/24", "fd00:250:1::1/64")
	addr(n, "eth1", "10.250.2.1/24", "fd00:250:2::1/64")
	addr(b, "eth0", "10.250.2.2/24", "fd00:250:2::2/64")
	addr(b, "lo", backendA4.String()+"/32", backendB4.String()+"/32", backendA6.String()+"/128", backendB6.String()+"/128")
	c.IP(t, "route", "add", "100.64.0.0/10", "via", "10.250.0.1", "src", client4.String())
	c.IP(t, "-6", "route", "add", "fd7a:115c:a1e0::/48", "via", "fd00:250::1", "src", client6.String())
	// The proxy routes the tailnet client back into the "tunnel", as tailscaled does, and
	// everything else to its default gateway, whose path MTU clamped SYNs carry.
	mtu := strconv.Itoa(pathMTU)
	p.IP(t, "route", "add", client4.String()+"/32", "via", "10.250.0.2")
	p.IP(t, "-6", "route", "add", client6.String()+"/128", "via", "fd00:250::2")
	p.IP(t, "route", "add", "default", "via", "10.250.1.1", "mtu", mtu)
	p.IP(t, "-6", "route", "add", "default", "via", "fd00:250:1::1", "mtu", mtu)
	// Tailnet IPs without DNAT are refused at once (ICMP administratively prohibited) rather than
	// left to time out.
	p.IP(t, "route", "add", "prohibit", "100.64.0.0/10")
	p.IP(t, "-6", "route", "add", "prohibit", "fd7a:115c:a1e0::/48")
	n.IP(t, "route", "add", "10.96.0.0/24", "via", "10.250.2.2")
	n.IP(t, "-6", "route", "add", "fd00:96::/64", "via", "fd00:250:2::2")
	n.SetForwarding(t, true)
	b.IP(t, "route", "add", "default", "via", "10.250.2.1")
	b.IP(t, "-6", "route", "add", "default", "via", "fd00:250:2::1")

	// Whatever the host's switches, the proxy starts with forwarding off, so that the test
	// sees EnableForwarding turn it on.
	p.SetForwarding(t, false)
	if err := EnableForwarding(p.Path, true, true); err != nil {
		t.Fatalf("EnableForwarding: %v", err)
	}
	for _, f := range []string{netnstest.IPv4Forwarding, netnstest.IPv6Forwarding} {
		if got := p.Sysctl(t, f); got != "1" {
			t.Fatalf("after EnableForwarding %s = %q, want 1", f, got)
		}
	}
	b.WaitAddrs(t)
	for _, a := range []netip.Addr{backendA4, backendB4, backendA6, backendB6} {
		top.serve(t, a)
	}
	return top
}

// hitCounter counts what reached each backend address, per protocol.
type hitCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *hitCounter) add(key string) {
	h.mu.Lock()
	h.n[key]++
	h.mu.Unlock()
}

func (h *hitCounter) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	sum := 0
	for _, v := range h.n {
		sum += v
	}
	return sum
}

// serve runs a TCP and a UDP server on a backend address. TCP answers "<addr> mss=<n>
// from=<source>", with the MSS the accepted connection negotiated and the address it came
// from; UDP answers "<addr>".
func (top *topology) serve(t *testing.T, a netip.Addr) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := netnamespace.Run(top.backend.Path, func() error {
		var err error
		if ln, err = net.Listen("tcp", netip.AddrPortFrom(a, tcpPort).String()); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, udpPort).String())
		return err
	})
	if err != nil {
		t.Fatalf("backend listen on %s: %v", a, err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			top.hits.add("tcp " + a.String())
			from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			fmt.Fprintf(c, "%s mss=%d from=%s", a, tcpMSS(c), from)
			c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			top.hits.add("udp " + a.String())
			pc.WriteTo([]byte(a.String()), from) //nolint:errcheck // the client retries
		}
	}()
}

func tcpMSS(c net.Conn) int {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1
	}
	mss := -1
	raw.Control(func(fd uintptr) { //nolint:errcheck // mss stays -1
		mss, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	})
	return mss
}

// tcpProbe connects from the client to dst and returns the backend's answer.
func (top *topology) tcpProbe(dst netip.Addr, timeout time.Duration) (string, error) {
	var reply []byte
	err := netnamespace.Run(top.client.Path, func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(dst, tcpPort).String(), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		reply, err = io.ReadAll(c)
		return err
	})
	return string(reply), err
}

// udpProbe sends up to tries datagrams from the client to dst and returns the first answer.
func (top *topology) udpProbe(dst netip.Addr, tries int, timeout time.Duration) (string, error) {
	var reply string
	err := netnamespace.Run(top.client.Path, func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(dst, udpPort).String())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for range tries {
			if _, err = c.Write([]byte("ping")); err != nil {
				continue // e.g. ECONNREFUSED from an earlier ICMP error
			}
			c.SetReadDeadline(time.Now().Add(timeout))
			var n int
			if n, err = c.Read(buf); err == nil {
				reply = string(buf[:n])
				return nil
			}
		}
		return err
	})
	return reply, err
}

// expectBackend checks that TCP and UDP to tailnet IP dst reach backend want, from the
// proxy's cluster address (source NAT), with the MSS clamped to the proxy's route MTU.
func (top *topology) expectBackend(t *testing.T, dst, want netip.Addr) {
	t.Helper()
	got, err := top.tcpProbe(dst, 3*time.Second)
	if err != nil {
		t.Fatalf("TCP to %s: %v", dst, err)
	}
	name, rest, _ := strings.Cut(got, " mss=")
	mssText, from, _ := strings.Cut(rest, " from=")
	if name != want.String() {
		t.Fatalf("TCP to %s reached %q, want %s", dst, got, want)
	}
	wantFrom := proxyCluster4
	if dst.Is6() {
		wantFrom = proxyCluster6
	}
	if from != wantFrom.String() {
		t.Errorf("TCP to %s came to the backend from %s, want the proxy's cluster address %s", dst, from, wantFrom)
	}
	maxMSS := pathMTU - 40
	if dst.Is6() {
		maxMSS = pathMTU - 60
	}
	if mss, _ := strconv.Atoi(mssText); mss <= 0 || mss > maxMSS {
		t.Errorf("TCP to %s: backend's MSS is %s, want clamped to at most %d", dst, mssText, maxMSS)
	}
	if got, err := top.udpProbe(dst, 3, time.Second); err != nil || got != want.String() {
		t.Fatalf("UDP to %s: got %q, %v; want %s", dst, got, err, want)
	}
}

// expectNoBackend checks that neither TCP nor UDP to dst reaches any backend.
func (top *topology) expectNoBackend(t *testing.T, dst netip.Addr) {
	t.Helper()
	before := top.hits.total()
	// Answers take about a millisecond here, so a short wait is plenty.
	if got, err := top.tcpProbe(dst, 300*time.Millisecond); err == nil {
		t.Errorf("TCP to %s still answered %q", dst, got)
	}
	if got, err := top.udpProbe(dst, 1, 300*time.Millisecond); err == nil {
		t.Errorf("UDP to %s still answered %q", dst, got)
	}
	if after := top.hits.total(); after != before {
		t.Errorf("backends saw %d new connections or datagrams for %s, want none", after-before, dst)
	}
}

func TestTraffic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode Mode
		// legacy puts an unrelated rule in legacy x_tables first, so detection picks iptables-legacy.
		legacy bool
	}{
		{name: "nftables", mode: ModeNFTables},
		{name: "iptables", mode: ModeIPTables},
		{name: "iptables-legacy", mode: ModeIPTables, legacy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			top := newTopology(t)
			if tc.mode == ModeIPTables {
				netnstest.NeedRoot(t, "iptables", "ip6tables")
			}
			if tc.legacy {
				netnstest.NeedRoot(t, "iptables-legacy", "ip6tables-legacy")
				top.proxy.Exec(t, "iptables-legacy", "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT")
			}
			ctx := context.Background()
			r, err := New(ctx, Options{Mode: tc.mode, NetNS: top.proxy.Path})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if r.Mode() != tc.mode {
				t.Fatalf("Mode() = %s, want %s", r.Mode(), tc.mode)
			}
			standalone := func(to4, to6 netip.Addr) Mapping {
				return Mapping{Name: "standalone", TailnetIPs: []netip.Addr{tailnet4, tailnet6}, Destinations: []netip.Addr{to4, to6}}
			}
			ext := Mapping{Name: "svc:ext", TailnetIPs: []netip.Addr{ext4, ext6},
				Destinations: []netip.Addr{backendA4, backendB4, backendA6, backendB6}}
			apply := func(ms ...Mapping) {
				t.Helper()
				st, err := r.Apply(ctx, ms)
				if err != nil {
					t.Fatalf("Apply: %v", err)
				}
				for _, m := range ms {
					if s, ok := st.Mappings[m.Name]; !ok || s.Error != "" || len(s.TailnetIPs) != 2 {
						t.Fatalf("status of %s = %+v, want both tailnet IPs applied", m.Name, s)
					}
				}
			}

			apply(standalone(backendA4, backendA6), ext)
			checkBackendUsed(t, top.proxy, tc.mode, tc.legacy)
			top.expectBackend(t, tailnet4, backendA4)
			top.expectBackend(t, tailnet6, backendA6)

			// Each ExternalName destination gets connections.
			for _, dst := range []netip.Addr{ext4, ext6} {
				seen := map[string]int{}
				for range 16 {
					got, err := top.tcpProbe(dst, 3*time.Second)
					if err != nil {
						t.Fatalf("TCP to %s: %v", dst, err)
					}
					name, _, _ := strings.Cut(got, " ")
					seen[name]++
				}
				if len(seen) != 2 {
					t.Errorf("16 connections to %s reached %v, want both destinations", dst, seen)
				}
			}

			apply(standalone(backendB4, backendB6), ext)
			top.expectBackend(t, tailnet4, backendB4)
			top.expectBackend(t, tailnet6, backendB6)

			if err := r.Cleanup(ctx); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if left := leftovers(t, top.proxy, tc.mode, tc.legacy); len(left) > 0 {
				t.Errorf("after Cleanup, still installed:\n%s", strings.Join(left, "\n"))
			}
			for _, dst := range []netip.Addr{tailnet4, tailnet6, ext4, ext6} {
				top.expectNoBackend(t, dst)
			}
		})
	}
}

// checkBackendUsed checks that the rules went where the mode says: our nftables tables, or
// our iptables chains in nf_tables (iptables-nft) or only in legacy x_tables.
func checkBackendUsed(t *testing.T, ns netnstest.NS, mode Mode, legacy bool) {
	t.Helper()
	nft := strings.Join(nftDump(t, ns), "\n")
	var want, notWant []string
	switch {
	case mode == ModeNFTables:
		want = []string{"table ip tsingress", "table ip6 tsingress"}
		notWant = []string{iptPrefix}
	case legacy:
		notWant = []string{iptPrefix, "tsingress"}
		ipt := strings.Join(iptDump(t, ns, true), "\n")
		for _, s := range []string{"ipv4 nat: -N " + iptNATChain, "ipv6 mangle: -N " + iptFwdChain} {
			if !strings.Contains(ipt, s) {
				t.Errorf("iptables-legacy listing lacks %q:\n%s", s, ipt)
			}
		}
	default:
		want = []string{"chain ip nat " + iptNATChain, "chain ip6 mangle " + iptFwdChain}
		notWant = []string{"tsingress"}
	}
	for _, s := range want {
		if !strings.Contains(nft, s) {
			t.Errorf("nftables listing lacks %q:\n%s", s, nft)
		}
	}
	for _, s := range notWant {
		if strings.Contains(nft, s) {
			t.Errorf("nftables listing has %q:\n%s", s, nft)
		}
	}
}

// leftovers lists whatever of ours is still in the namespace, looking through the libraries.
func leftovers(t *testing.T, ns netnstest.NS, mode Mode, legacy bool) []string {
	t.Helper()
	var left []string
	for _, l := range nftDump(t, ns) {
		if strings.Contains(l, nftTable) || strings.Contains(l, iptPrefix) {
			left = append(left, "nftables: "+l)
		}
	}
	if mode == ModeIPTables {
		for _, l := range iptDump(t, ns, legacy) {
			if strings.Contains(strings.ToLower(l), "tsingress") {
				left = append(left, "iptables: "+l)
			}
		}
	}
	return left
}
