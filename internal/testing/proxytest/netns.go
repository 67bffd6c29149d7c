// Kernel test helpers on top of netnstest: a cluster's topology with echo backends on its
// ClusterIPs, probes over the tailnet, and a check for rules left behind.

package proxytest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/tailnetdial"
)

// Ports the backends answer on; the proxy forwards every port, these are just the ones probed.
const (
	EchoTCPPort = 5432
	EchoUDPPort = 5353
)

// echoConnTimeout bounds a backend's TCP connection, longer than the stalls WireGuard's
// handshake retries can cause.
const echoConnTimeout = 15 * time.Second

// NewTopology makes a netnstest.Topology with an echo backend (AddBackend) on each ClusterIP,
// named by its address.
func NewTopology(t testing.TB, clusterIPs ...netip.Addr) netnstest.Topology {
	t.Helper()
	top := netnstest.NewTopology(t)
	for _, a := range clusterIPs {
		AddBackend(t, top, a, a.String())
	}
	return top
}

// AddBackend gives the topology's backend the ClusterIP a and answers on it as name: over TCP a
// line with "<name> <line>", after which it closes, over UDP "<name> <datagram>". Closing first
// leaves the closed connections' TIME_WAIT here, not in the client's netstack, which a
// tsnet.Server with hundreds of them cannot Close (its netstack blocks aborting them).
func AddBackend(t testing.TB, top netnstest.Topology, a netip.Addr, name string) {
	t.Helper()
	top.AddClusterIP(t, a)
	ln, pc := listenInBackend(t, top, netip.AddrPortFrom(a, EchoTCPPort), netip.AddrPortFrom(a, EchoUDPPort))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(echoConnTimeout)) //nolint:errcheck // a read error follows
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%s %s", name, strings.TrimSuffix(line, "\n"))
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
			pc.WriteTo(fmt.Appendf(nil, "%s %s", name, buf[:n]), from) //nolint:errcheck // the client retries
		}
	}()
}

// listenInBackend listens in the topology's backend namespace on tcp for TCP and udp for UDP
// until the test ends.
func listenInBackend(t testing.TB, top netnstest.Topology, tcp, udp netip.AddrPort) (net.Listener, net.PacketConn) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := netnamespace.Run(top.Backend.Path, func() (err error) {
		if ln, err = net.Listen("tcp", tcp.String()); err != nil {
			return err
		}
		if pc, err = net.ListenPacket("udp", udp.String()); err != nil {
			ln.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("backend listening on %s: %v", tcp.Addr(), err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	return ln, pc
}

// Echo sends a payload to addr (host:port) over network (tcp or udp) through client, on a new
// connection over the tailnet only, checks that it comes back, and returns the name of the
// backend that answered.
func Echo(ctx context.Context, client *tsnet.Server, network, addr string) (string, error) {
	c, err := tailnetdial.Dial(ctx, client, network, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d) //nolint:errcheck // a read error follows
	}
	payload := "hello over " + network
	if network == "udp" {
		// Datagrams get lost until the path is up: send again after a silence.
		buf := make([]byte, 1500)
		for {
			if _, err := io.WriteString(c, payload); err != nil {
				return "", err
			}
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond)) //nolint:errcheck // a read error follows
			n, err := c.Read(buf)
			if err == nil {
				return checkEcho(string(buf[:n]), payload)
			}
			if ctx.Err() != nil {
				return "", fmt.Errorf("no UDP answer from %s: %w", addr, err)
			}
		}
	}
	if _, err := io.WriteString(c, payload+"\n"); err != nil {
		return "", err
	}
	got, err := io.ReadAll(c)
	if err != nil {
		return "", fmt.Errorf("TCP answer from %s after %q: %w", addr, got, err)
	}
	return checkEcho(string(got), payload)
}

// checkEcho splits an answer "<backend> <echo>" and checks the echo.
func checkEcho(answer, payload string) (string, error) {
	backend, echoed, _ := strings.Cut(answer, " ")
	if echoed != payload {
		return backend, fmt.Errorf("echo from %s: got %q, want %q", backend, echoed, payload)
	}
	return backend, nil
}

// ExpectBackend waits until TCP and UDP to dst reach the backend want, of NewTopology.
func ExpectBackend(t testing.TB, client *tsnet.Server, dst netip.Addr, want netip.Addr) {
	t.Helper()
	for _, network := range []string{"tcp", "udp"} {
		port := map[string]uint16{"tcp": EchoTCPPort, "udp": EchoUDPPort}[network]
		var got string
		var err error
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			got, err = Echo(ctx, client, network, netip.AddrPortFrom(dst, port).String())
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
func Leftovers(t testing.TB, ns netnstest.NS) []string {
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
		for _, line := range strings.Split(ns.Exec(t, d...), "\n") {
			if strings.Contains(strings.ToLower(line), "tsingress") {
				left = append(left, d[0]+": "+strings.TrimSpace(line))
			}
		}
	}
	return left
}
