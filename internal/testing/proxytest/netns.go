// Kernel test helpers: network namespaces, a proxy/node/backend Topology as a cluster has it,
// echo backends and probes over the tailnet, and a check for rules left behind.

package proxytest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// Ports the backends answer on; the proxy forwards every port, these are just the ones probed.
const (
	EchoTCPPort = 5432
	EchoUDPPort = 5353
)

// NeedRoot skips kernel tests for users who cannot create namespaces and devices; CI runs as
// root.
func NeedRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root to create network namespaces, TUN devices and DNAT rules")
	}
	for _, cmd := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("kernel test: needs %s (apt-get install iproute2 nftables)", cmd)
		}
	}
}

// NetNS is a network namespace a test made, deleted when the test ends.
type NetNS struct{ Name, Path string }

var netNSSeq atomic.Int32

func NewNetNS(t *testing.T, role string) NetNS {
	t.Helper()
	name := fmt.Sprintf("tsp-%d-%d-%s", os.Getpid(), netNSSeq.Add(1), role)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	ns := NetNS{Name: name, Path: "/run/netns/" + name}
	ns.IP(t, "link", "set", "lo", "up")
	return ns
}

func (ns NetNS) IP(t *testing.T, args ...string) string {
	t.Helper()
	return run(t, "ip", append([]string{"-n", ns.Name}, args...)...)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Sysctls writes /proc/sys/<key> values inside the namespace.
func (ns NetNS) Sysctls(t *testing.T, kv map[string]string) {
	t.Helper()
	err := netnamespace.Run(ns.Path, func() error {
		for k, v := range kv {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("sysctls in %s: %v", ns.Name, err)
	}
}

// DisableIPv6 turns IPv6 off in the namespace, as Docker and some CNIs do in containers.
func (ns NetNS) DisableIPv6(t *testing.T) {
	t.Helper()
	ns.Sysctls(t, map[string]string{"net/ipv6/conf/all/disable_ipv6": "1", "net/ipv6/conf/default/disable_ipv6": "1"})
}

// Topology is a proxy Pod's network namespace, the node it runs on and a backend, as a cluster
// has them, IPv4 and IPv6: the node is the proxy's default gateway and routes the ClusterIPs,
// which the backend holds on its loopback, to the backend (kube-proxy's part); the backend's
// only route is its default gateway, the node, which knows nothing of the tailnet. So replies
// to tailnet clients come back only to a proxy that masquerades. The proxy's forwarding starts
// off, whatever the host's: the proxy turns it on.
type Topology struct{ Proxy, Node, Backend NetNS }

// Cluster-side addresses of the proxy: what backends see as the source of proxied traffic.
var (
	ProxyCluster4 = netip.MustParseAddr("10.250.1.2")
	ProxyCluster6 = netip.MustParseAddr("fd00:250:1::2")
)

// NewTopology makes the three namespaces, with an echo backend (ServeEcho) on each ClusterIP.
func NewTopology(t *testing.T, clusterIPs ...netip.Addr) Topology {
	t.Helper()
	top := Topology{Proxy: NewNetNS(t, "p"), Node: NewNetNS(t, "n"), Backend: NewNetNS(t, "b")}
	p, n, b := top.Proxy, top.Node, top.Backend
	p.IP(t, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", n.Name)
	n.IP(t, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", b.Name)
	for _, x := range []struct {
		ns       NetNS
		dev      string
		ip4, ip6 string
	}{
		{p, "eth0", ProxyCluster4.String() + "/24", ProxyCluster6.String() + "/64"},
		{n, "eth0", "10.250.1.1/24", "fd00:250:1::1/64"},
		{n, "eth1", "10.250.2.1/24", "fd00:250:2::1/64"},
		{b, "eth0", "10.250.2.2/24", "fd00:250:2::2/64"},
	} {
		x.ns.IP(t, "addr", "add", x.ip4, "dev", x.dev)
		x.ns.IP(t, "addr", "add", x.ip6, "dev", x.dev, "nodad")
		x.ns.IP(t, "link", "set", x.dev, "up")
	}
	p.IP(t, "route", "add", "default", "via", "10.250.1.1")
	p.IP(t, "-6", "route", "add", "default", "via", "fd00:250:1::1")
	b.IP(t, "route", "add", "default", "via", "10.250.2.1")
	b.IP(t, "-6", "route", "add", "default", "via", "fd00:250:2::1")
	n.Sysctls(t, map[string]string{"net/ipv4/ip_forward": "1", "net/ipv6/conf/all/forwarding": "1"})
	p.Sysctls(t, map[string]string{"net/ipv4/ip_forward": "0", "net/ipv6/conf/all/forwarding": "0"})
	for _, a := range clusterIPs {
		top.AddClusterIP(t, a)
		ServeEcho(t, b, a)
	}
	return top
}

// WaitAddrs waits until no IPv6 address of the namespace is tentative: the kernel clears the
// flag from a work queue even without duplicate address detection, and until then binding to
// the address fails with "cannot assign requested address".
func (ns NetNS) WaitAddrs(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, err := exec.Command("ip", "-n", ns.Name, "-6", "addr", "show", "tentative").CombinedOutput()
		if err == nil && len(strings.TrimSpace(string(out))) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("IPv6 addresses in %s still tentative: %s (%v)", ns.Name, out, err)
		}
	}
}

// AddClusterIP gives the backend the address a and routes it there from the node; once it
// returns, the backend can listen on a.
func (top Topology) AddClusterIP(t *testing.T, a netip.Addr) {
	t.Helper()
	prefix, via := netip.PrefixFrom(a, a.BitLen()).String(), "10.250.2.2"
	if a.Is6() {
		via = "fd00:250:2::2"
	}
	top.Backend.IP(t, "addr", "add", prefix, "dev", "lo")
	top.Node.IP(t, "route", "add", prefix, "via", via)
	top.Backend.WaitAddrs(t)
}

// ServeEcho answers on a in ns, naming a first: over TCP "<a> " and then the echo of the
// stream, over UDP "<a> <datagram>".
func ServeEcho(t *testing.T, ns NetNS, a netip.Addr) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := netnamespace.Run(ns.Path, func() (err error) {
		if ln, err = net.Listen("tcp", netip.AddrPortFrom(a, EchoTCPPort).String()); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, EchoUDPPort).String())
		return err
	})
	if err != nil {
		t.Fatalf("backend listening on %s: %v", a, err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s ", a)
				io.Copy(c, c) //nolint:errcheck // the client checks what comes back
			}()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(fmt.Appendf(nil, "%s %s", a, buf[:n]), from) //nolint:errcheck // the client retries
		}
	}()
}

// echo sends a payload through client to dst over network (tcp or udp), checks that it comes
// back, and returns the address of the backend that answered.
func Echo(ctx context.Context, client *tsnet.Server, network string, dst netip.AddrPort) (string, error) {
	c, err := client.Dial(ctx, network, dst.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d) //nolint:errcheck // a read error follows
	}
	payload := "hello over " + network
	buf := make([]byte, 1500)
	if network == "udp" {
		// Datagrams get lost until the path is up: send again after a silence.
		for {
			if _, err := io.WriteString(c, payload); err != nil {
				return "", err
			}
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond)) //nolint:errcheck // a read error follows
			n, err := c.Read(buf)
			if err == nil {
				return CheckEcho(string(buf[:n]), payload)
			}
			if ctx.Err() != nil {
				return "", fmt.Errorf("no UDP answer from %s: %w", dst, err)
			}
		}
	}
	if _, err := io.WriteString(c, payload); err != nil {
		return "", err
	}
	var got []byte
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if _, echoed, ok := strings.Cut(string(got), " "); ok && len(echoed) >= len(payload) {
			return CheckEcho(string(got), payload)
		}
		if err != nil {
			return "", fmt.Errorf("TCP answer from %s after %q: %w", dst, got, err)
		}
	}
}

// CheckEcho splits an answer "<backend> <echo>" and checks the echo.
func CheckEcho(answer, payload string) (string, error) {
	backend, echoed, _ := strings.Cut(answer, " ")
	if echoed != payload {
		return backend, fmt.Errorf("echo from %s: got %q, want %q", backend, echoed, payload)
	}
	return backend, nil
}

// ExpectBackend waits until TCP and UDP to dst reach the backend want.
func ExpectBackend(t *testing.T, client *tsnet.Server, dst netip.Addr, want netip.Addr) {
	t.Helper()
	for _, network := range []string{"tcp", "udp"} {
		port := map[string]uint16{"tcp": EchoTCPPort, "udp": EchoUDPPort}[network]
		var got string
		var err error
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			got, err = Echo(ctx, client, network, netip.AddrPortFrom(dst, port))
			cancel()
			if err == nil && got == want.String() {
				break
			}
		}
		if err != nil || got != want.String() {
			t.Fatalf("%s to %s reached %q (%v), want %s", network, dst, got, err, want)
		}
	}
}

// Leftovers lists what of the proxy's is still in ns: its TUN, and nftables tables, chains or
// rules (iptables-nft keeps its chains there too) or legacy iptables rules of tsingress.
func Leftovers(t *testing.T, ns NetNS) []string {
	t.Helper()
	var left []string
	if out, err := exec.Command("ip", "-n", ns.Name, "link", "show", "tailscale0").CombinedOutput(); err == nil {
		left = append(left, strings.TrimSpace(string(out)))
	}
	dumps := [][]string{{"nft", "list", "ruleset"}}
	for _, save := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(save); err == nil {
			dumps = append(dumps, []string{save})
		}
	}
	for _, d := range dumps {
		for _, line := range strings.Split(run(t, "ip", append([]string{"netns", "exec", ns.Name}, d...)...), "\n") {
			if strings.Contains(strings.ToLower(line), "tsingress") {
				left = append(left, d[0]+": "+strings.TrimSpace(line))
			}
		}
	}
	return left
}
