package firewall

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

var nsSeq atomic.Int32

// netNS is a network namespace made by a test with `ip netns add`, deleted when it ends.
type netNS struct {
	name string
	path string
}

// newNetNS creates a namespace, or skips the test where that is impossible.
func newNetNS(t *testing.T, role string) netNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("kernel test: needs the ip command (apt-get install iproute2)")
	}
	name := fmt.Sprintf("tsi%d-%d-%s", os.Getpid(), nsSeq.Add(1), role)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("kernel test: ip netns add failed: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	ns := netNS{name: name, path: "/run/netns/" + name}
	// Without duplicate address detection, IPv6 link-local addresses (and so neighbour
	// discovery) work as soon as a link is up.
	err := netnamespace.Run(ns.path, func() error {
		for _, f := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f+"/accept_dad", []byte("0"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("disable DAD in %s: %v", name, err)
	}
	ns.ip(t, "link", "set", "lo", "up")
	return ns
}

// run runs a command inside the namespace and fails the test on error.
func (ns netNS) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns.name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %s: %v: %s", ns.name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ip runs the ip command on the namespace; `ip -n` is much quicker than `ip netns exec`.
func (ns netNS) ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns.name}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", ns.name, strings.Join(args, " "), err, out)
	}
}

// sysctl reads a /proc/sys file as seen from inside the namespace.
func (ns netNS) sysctl(t *testing.T, path string) string {
	t.Helper()
	var b []byte
	err := netnamespace.Run(ns.path, func() (err error) {
		b, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// setForwarding sets IPv4 and IPv6 forwarding in the namespace to v ("0" or "1").
func (ns netNS) setForwarding(t *testing.T, v string) {
	t.Helper()
	err := netnamespace.Run(ns.path, func() error {
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("forwarding %s in %s: %v", v, ns.name, err)
	}
}

// waitAddrs waits until no IPv6 address of the namespace is tentative: the kernel clears the
// flag from a work queue even without duplicate address detection, and until then binding to
// the address fails with "cannot assign requested address".
func (ns netNS) waitAddrs(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, err := exec.Command("ip", "-n", ns.name, "-6", "addr", "show", "tentative").CombinedOutput()
		if err == nil && len(strings.TrimSpace(string(out))) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("IPv6 addresses in %s still tentative: %s (%v)", ns.name, out, err)
		}
	}
}

// needTool skips the test when a command it prepares state with is missing.
func needTool(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			t.Skipf("kernel test: needs %s (apt-get install nftables iptables)", n)
		}
	}
}
