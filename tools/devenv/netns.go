package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// netnsPrefix starts the name of every network namespace devenv makes, followed by its PID, so
// that namespaces left by a run that was killed can be told from those of a live one.
const netnsPrefix = "tsdev-"

// l3Unavailable says briefly why kernel proxies cannot run here, or "" when they can.
func l3Unavailable() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	for _, cmd := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Sprintf("no %s command: apt-get install iproute2 nftables", cmd)
		}
	}
	return ""
}

// podNet is what a node gives a kernel proxy Pod: a network namespace of its own for the TUN
// device and DNAT rules, and behind it the cluster network as a cluster has it. The node's
// namespace is the Pod's default gateway; it routes the service range to a third namespace, in
// which every ClusterIP of the range is a local address where the demo backend answers (there
// is no kube-proxy and no workload Pod). The backend's only route is its default gateway, the
// node, which knows nothing of the tailnet: replies reach tailnet clients only because the
// proxy masquerades, as in a real cluster.
type podNet struct {
	proxy, node, cluster string
	closers              []func() error
}

// newPodNet makes the three namespaces, numbered seq, for a Pod of a cluster whose Services take
// their ClusterIPs from serviceCIDR.
func newPodNet(seq int, serviceCIDR netip.Prefix) (n *podNet, err error) {
	n = &podNet{
		proxy:   fmt.Sprintf("%s%d-%d-p", netnsPrefix, os.Getpid(), seq),
		node:    fmt.Sprintf("%s%d-%d-n", netnsPrefix, os.Getpid(), seq),
		cluster: fmt.Sprintf("%s%d-%d-c", netnsPrefix, os.Getpid(), seq),
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.close())
		}
	}()
	cidr := serviceCIDR.String()
	for _, args := range [][]string{
		{"netns", "add", n.proxy},
		{"netns", "add", n.node},
		{"netns", "add", n.cluster},
		{"-n", n.proxy, "link", "set", "lo", "up"},
		{"-n", n.node, "link", "set", "lo", "up"},
		{"-n", n.cluster, "link", "set", "lo", "up"},
		{"-n", n.proxy, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", n.node},
		{"-n", n.node, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", n.cluster},
		{"-n", n.proxy, "addr", "add", "10.250.1.2/24", "dev", "eth0"},
		{"-n", n.node, "addr", "add", "10.250.1.1/24", "dev", "eth0"},
		{"-n", n.node, "addr", "add", "10.250.2.1/24", "dev", "eth1"},
		{"-n", n.cluster, "addr", "add", "10.250.2.2/24", "dev", "eth0"},
		{"-n", n.proxy, "link", "set", "eth0", "up"},
		{"-n", n.node, "link", "set", "eth0", "up"},
		{"-n", n.node, "link", "set", "eth1", "up"},
		{"-n", n.cluster, "link", "set", "eth0", "up"},
		{"-n", n.proxy, "route", "add", "default", "via", "10.250.1.1"},
		{"-n", n.node, "route", "add", cidr, "via", "10.250.2.2"},
		{"-n", n.cluster, "route", "add", "local", cidr, "dev", "lo"},
		{"-n", n.cluster, "route", "add", "default", "via", "10.250.2.1"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return n, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
		if args[0] == "netns" {
			n.closers = append(n.closers, deleteNetns(args[2]))
		}
	}
	// The node forwards, as every Kubernetes node does; the proxy turns its own forwarding on.
	err = netnamespace.Run(n.path(n.node), func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		return n, fmt.Errorf("forwarding in the node's network namespace: %w", err)
	}
	var ln net.Listener
	var pc net.PacketConn
	err = netnamespace.Run(n.path(n.cluster), func() (err error) {
		if ln, err = net.Listen("tcp", fmt.Sprintf(":%d", backendTCPPort)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", backendUDPPort))
		return err
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return n, fmt.Errorf("backend in the cluster network namespace: %w", err)
	}
	// Closed before the namespaces go.
	n.closers = append([]func() error{ln.Close, pc.Close}, n.closers...)
	go http.Serve(ln, backendHandler("hello (cluster network stand-in)")) //nolint:errcheck // ends with its listener
	go serveUDP(pc)
	return n, nil
}

func (n *podNet) path(ns string) string { return filepath.Join("/run/netns", ns) }

// proxyPath is the namespace file the proxy puts its TUN device and rules in.
func (n *podNet) proxyPath() string { return n.path(n.proxy) }

// close stops the backend and deletes the namespaces, and with them the veth pairs, the routes
// and whatever rules the proxy left.
func (n *podNet) close() error {
	var errs []error
	for _, c := range n.closers {
		if err := c(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	n.closers = nil
	return errors.Join(errs...)
}

func deleteNetns(name string) func() error {
	return func() error {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns del %s: %w: %s", name, err, out)
		}
		return nil
	}
}

// devenvNetns lists the namespaces of devenv runs, by the PID of the run that made them.
func devenvNetns() map[string]int {
	entries, _ := os.ReadDir("/run/netns")
	found := map[string]int{}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		if !ok {
			continue
		}
		if pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0]); err == nil {
			found[e.Name()] = pid
		}
	}
	return found
}

// removeStaleNetns deletes the namespaces of devenv runs that were killed before they could.
func removeStaleNetns() (removed int, err error) {
	var errs []error
	for name, pid := range devenvNetns() {
		if syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if err := deleteNetns(name)(); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}
