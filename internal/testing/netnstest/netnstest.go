// Package netnstest makes network namespaces for kernel tests, deleted when the test ends, and
// the proxy/node/backend topology of a cluster in them. Such tests need root and the ip command;
// without them they skip with a message saying so.
package netnstest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// aptPackages names the Debian package of the commands kernel tests use, for the skip message.
var aptPackages = map[string]string{
	"ip": "iproute2", "nft": "nftables", "unshare": "util-linux", "mount": "mount",
	"iptables": "iptables", "ip6tables": "iptables", "iptables-legacy": "iptables", "ip6tables-legacy": "iptables",
}

// NeedRoot skips a kernel test unless it runs as root with the ip command and cmds at hand; CI
// runs as root with all of them.
func NeedRoot(tb testing.TB, cmds ...string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("kernel test: needs root to create network namespaces, TUN devices and DNAT rules")
	}
	for _, cmd := range append([]string{"ip"}, cmds...) {
		if _, err := exec.LookPath(cmd); err != nil {
			pkg := aptPackages[cmd]
			if pkg == "" {
				pkg = cmd
			}
			tb.Skipf("kernel test: needs %s (apt-get install %s)", cmd, pkg)
		}
	}
}

// NS is a network namespace a test made.
type NS struct{ Name, Path string }

var seq atomic.Int32

// New makes a namespace, with its loopback up and IPv6 duplicate address detection off,
// deleted when the test ends; role ends its name, to tell a test's namespaces apart. Where
// namespaces cannot be made, the test skips.
func New(tb testing.TB, role string) NS {
	tb.Helper()
	NeedRoot(tb)
	name := fmt.Sprintf("tstest-%d-%d-%s", os.Getpid(), seq.Add(1), role)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Skipf("kernel test: ip netns add failed: %v: %s", err, out)
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	ns := NS{Name: name, Path: "/run/netns/" + name}
	// Without duplicate address detection, IPv6 addresses (link-local ones too, and so neighbor
	// discovery) work as soon as a link is up.
	ns.Sysctls(tb, map[string]string{"net/ipv6/conf/all/accept_dad": "0", "net/ipv6/conf/default/accept_dad": "0"})
	ns.IP(tb, "link", "set", "lo", "up")
	return ns
}

// IP runs the ip command on the namespace (`ip -n`, much quicker than `ip netns exec`) and
// returns its output, failing the test on error.
func (ns NS) IP(tb testing.TB, args ...string) string {
	tb.Helper()
	return run(tb, "ip", append([]string{"-n", ns.Name}, args...)...)
}

// Exec runs a command inside the namespace and returns its output, failing the test on error.
func (ns NS) Exec(tb testing.TB, args ...string) string {
	tb.Helper()
	return run(tb, "ip", append([]string{"netns", "exec", ns.Name}, args...)...)
}

func run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Sysctls writes /proc/sys/<key> values inside the namespace.
func (ns NS) Sysctls(tb testing.TB, kv map[string]string) {
	tb.Helper()
	err := netnamespace.Run(ns.Path, func() error {
		for k, v := range kv {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("sysctls in %s: %v", ns.Name, err)
	}
}

// Sysctl reads /proc/sys/<key> as seen from inside the namespace.
func (ns NS) Sysctl(tb testing.TB, key string) string {
	tb.Helper()
	var b []byte
	err := netnamespace.Run(ns.Path, func() (err error) {
		b, err = os.ReadFile("/proc/sys/" + key)
		return err
	})
	if err != nil {
		tb.Fatalf("sysctl %s in %s: %v", key, ns.Name, err)
	}
	return strings.TrimSpace(string(b))
}

// Forwarding keys: IPv4 and IPv6 forwarding, which the proxy turns on.
const (
	IPv4Forwarding = "net/ipv4/ip_forward"
	IPv6Forwarding = "net/ipv6/conf/all/forwarding"
)

// SetForwarding turns IPv4 and IPv6 forwarding on or off in the namespace.
func (ns NS) SetForwarding(tb testing.TB, on bool) {
	tb.Helper()
	v := "0"
	if on {
		v = "1"
	}
	ns.Sysctls(tb, map[string]string{IPv4Forwarding: v, IPv6Forwarding: v})
}

// DisableIPv6 turns IPv6 off in the namespace, as Docker and some CNIs do in containers.
func (ns NS) DisableIPv6(tb testing.TB) {
	tb.Helper()
	ns.Sysctls(tb, map[string]string{"net/ipv6/conf/all/disable_ipv6": "1", "net/ipv6/conf/default/disable_ipv6": "1"})
}

// WaitAddrs waits until no IPv6 address of the namespace is tentative: the kernel clears the
// flag from a work queue even without duplicate address detection, and until then binding to
// the address fails with "cannot assign requested address".
func (ns NS) WaitAddrs(tb testing.TB) {
	tb.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, err := exec.Command("ip", "-n", ns.Name, "-6", "addr", "show", "tentative").CombinedOutput()
		if err == nil && len(strings.TrimSpace(string(out))) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("IPv6 addresses in %s still tentative: %s (%v)", ns.Name, out, err)
		}
	}
}

// Topology is a proxy Pod's network namespace, the node it runs on and a backend, as a cluster
// has them, IPv4 and IPv6: the node is the proxy's default gateway and routes the ClusterIPs,
// which the backend holds on its loopback, to the backend (kube-proxy's part); the backend's
// only route is its default gateway, the node, which knows nothing of the tailnet. So replies
// to tailnet clients come back only to a proxy that masquerades.
type Topology struct{ Proxy, Node, Backend NS }

// Cluster-side addresses of the proxy: what backends see as the source of proxied traffic.
var (
	ProxyCluster4 = netip.MustParseAddr("10.250.1.2")
	ProxyCluster6 = netip.MustParseAddr("fd00:250:1::2")
)

// NewTopology makes the three namespaces, without ClusterIPs (AddClusterIP adds them). The
// proxy's forwarding starts off, whatever the host's: the proxy turns it on.
func NewTopology(tb testing.TB) Topology {
	tb.Helper()
	top := Topology{Proxy: New(tb, "p"), Node: New(tb, "n"), Backend: New(tb, "b")}
	p, n, b := top.Proxy, top.Node, top.Backend
	p.IP(tb, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", n.Name)
	n.IP(tb, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", b.Name)
	for _, x := range []struct {
		ns       NS
		dev      string
		ip4, ip6 string
	}{
		{p, "eth0", ProxyCluster4.String() + "/24", ProxyCluster6.String() + "/64"},
		{n, "eth0", "10.250.1.1/24", "fd00:250:1::1/64"},
		{n, "eth1", "10.250.2.1/24", "fd00:250:2::1/64"},
		{b, "eth0", "10.250.2.2/24", "fd00:250:2::2/64"},
	} {
		x.ns.IP(tb, "addr", "add", x.ip4, "dev", x.dev)
		x.ns.IP(tb, "addr", "add", x.ip6, "dev", x.dev, "nodad")
		x.ns.IP(tb, "link", "set", x.dev, "up")
	}
	p.IP(tb, "route", "add", "default", "via", "10.250.1.1")
	p.IP(tb, "-6", "route", "add", "default", "via", "fd00:250:1::1")
	b.IP(tb, "route", "add", "default", "via", "10.250.2.1")
	b.IP(tb, "-6", "route", "add", "default", "via", "fd00:250:2::1")
	n.SetForwarding(tb, true)
	p.SetForwarding(tb, false)
	return top
}

// AddClusterIP gives the backend the address a and routes it there from the node; once it
// returns, the backend can listen on a.
func (top Topology) AddClusterIP(tb testing.TB, a netip.Addr) {
	tb.Helper()
	prefix, via := netip.PrefixFrom(a, a.BitLen()).String(), "10.250.2.2"
	if a.Is6() {
		via = "fd00:250:2::2"
	}
	top.Backend.IP(tb, "addr", "add", prefix, "dev", "lo")
	top.Node.IP(tb, "route", "add", prefix, "via", via)
	top.Backend.WaitAddrs(tb)
}
