package l3

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailscale/wireguard-go/tun"
	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"golang.org/x/net/dns/dnsmessage"
	"tailscale.com/ipn/store/mem"
	tsnetns "tailscale.com/net/netns"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"
)

var verbose = flag.Bool("verbose-nodes", false, "log what the tsnet nodes log")

func TestMain(m *testing.M) {
	// The tsnet nodes' own sockets stay plain (no SO_MARK or bind-to-device), as in tsnet's tests.
	tsnetns.SetEnabled(false)
	os.Exit(m.Run())
}

var nsSeq atomic.Int32

// netNS is a network namespace made by a test with `ip netns add`, deleted when it ends.
type netNS struct {
	name string
	path string
}

// needRoot skips tests that need to create namespaces and devices.
func needRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("kernel test: needs root to create network namespaces and TUN devices")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("kernel test: needs the ip command (apt-get install iproute2)")
	}
}

func newNetNS(tb testing.TB, role string) netNS {
	tb.Helper()
	needRoot(tb)
	name := fmt.Sprintf("tsl3-%d-%d-%s", os.Getpid(), nsSeq.Add(1), role)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Skipf("kernel test: ip netns add failed: %v: %s", err, out)
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	ns := netNS{name: name, path: "/run/netns/" + name}
	// Without duplicate address detection, IPv6 addresses work as soon as a link is up.
	err := netnamespace.Run(ns.path, func() error {
		for _, f := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f+"/accept_dad", []byte("0"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("disable DAD in %s: %v", name, err)
	}
	ns.ip(tb, "link", "set", "lo", "up")
	return ns
}

func (ns netNS) ip(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns.name}, args...)...).CombinedOutput(); err != nil {
		tb.Fatalf("ip -n %s %s: %v: %s", ns.name, strings.Join(args, " "), err, out)
	}
}

// Addresses exist only inside the test's namespaces.
var (
	backendA4 = netip.MustParseAddr("10.96.0.10")
	backendB4 = netip.MustParseAddr("10.96.0.11")
	backendC4 = netip.MustParseAddr("10.96.0.20") // answers of the test's DNS server
	backendD4 = netip.MustParseAddr("10.96.0.21")
	backendA6 = netip.MustParseAddr("fd00:96::10")
	backendB6 = netip.MustParseAddr("fd00:96::11")
	backendC6 = netip.MustParseAddr("fd00:96::20")
	backendD6 = netip.MustParseAddr("fd00:96::21")
)

const (
	echoPort = 8080 // TCP: "<backend address>\n", then echoes
	udpPort  = 5353 // UDP: "<backend address> <datagram>"
	sinkPort = 9000 // TCP: reads to EOF, then answers the byte count
)

// topology is proxy <-> node <-> backend, as a cluster has it: the node is the proxy Pod's
// default gateway and routes the "ClusterIPs", which the backend holds on its loopback, to the
// backend; the backend's only route is its default gateway, the node, which knows nothing of
// the tailnet. Replies to tailnet clients come back only to a proxy that masquerades.
type topology struct {
	proxy, node, backend netNS
	hits                 atomic.Int64 // connections and datagrams the backends saw
}

// Cluster-side addresses of the proxy: what the backends see as the source of proxied traffic.
var (
	proxyCluster4 = netip.MustParseAddr("10.250.1.2")
	proxyCluster6 = netip.MustParseAddr("fd00:250:1::2")
)

func newTopology(tb testing.TB) *topology {
	tb.Helper()
	top := &topology{proxy: newNetNS(tb, "p"), node: newNetNS(tb, "n"), backend: newNetNS(tb, "b")}
	p, n, b := top.proxy, top.node, top.backend
	p.ip(tb, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", n.name)
	n.ip(tb, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", b.name)
	for _, x := range []struct {
		ns    netNS
		dev   string
		addrs []string
	}{
		{p, "eth0", []string{proxyCluster4.String() + "/24", proxyCluster6.String() + "/64"}},
		{n, "eth0", []string{"10.250.1.1/24", "fd00:250:1::1/64"}},
		{n, "eth1", []string{"10.250.2.1/24", "fd00:250:2::1/64"}},
		{b, "eth0", []string{"10.250.2.2/24", "fd00:250:2::2/64"}},
	} {
		for _, a := range x.addrs {
			x.ns.ip(tb, "addr", "add", a, "dev", x.dev)
		}
		x.ns.ip(tb, "link", "set", x.dev, "up")
	}
	backends := []netip.Addr{backendA4, backendB4, backendC4, backendD4, backendA6, backendB6, backendC6, backendD6}
	for _, a := range backends {
		b.ip(tb, "addr", "add", netip.PrefixFrom(a, a.BitLen()).String(), "dev", "lo")
	}
	p.ip(tb, "route", "add", "default", "via", "10.250.1.1")
	p.ip(tb, "-6", "route", "add", "default", "via", "fd00:250:1::1")
	n.ip(tb, "route", "add", "10.96.0.0/24", "via", "10.250.2.2")
	n.ip(tb, "-6", "route", "add", "fd00:96::/64", "via", "fd00:250:2::2")
	n.sysctls(tb, map[string]string{"net/ipv4/ip_forward": "1", "net/ipv6/conf/all/forwarding": "1"})
	b.ip(tb, "route", "add", "default", "via", "10.250.2.1")
	b.ip(tb, "-6", "route", "add", "default", "via", "fd00:250:2::1")
	b.waitAddrs(tb)
	for _, a := range backends {
		top.serve(tb, a)
	}
	return top
}

// waitAddrs waits until no IPv6 address of the namespace is tentative: the kernel clears the
// flag from a work queue even without duplicate address detection, and until then binding to
// the address fails with "cannot assign requested address".
func (ns netNS) waitAddrs(tb testing.TB) {
	tb.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		out, err := exec.Command("ip", "-n", ns.name, "-6", "addr", "show", "tentative").CombinedOutput()
		if err == nil && len(bytes.TrimSpace(out)) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("IPv6 addresses in %s still tentative: %s (%v)", ns.name, out, err)
		}
	}
}

// sysctls writes /proc/sys/<key> values in the namespace.
func (ns netNS) sysctls(tb testing.TB, kv map[string]string) {
	tb.Helper()
	err := netnamespace.Run(ns.path, func() error {
		for k, v := range kv {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("sysctls in %s: %v", ns.name, err)
	}
}

// disableIPv6 turns IPv6 off in the namespace, as Docker and some CNIs do in containers.
func (ns netNS) disableIPv6(tb testing.TB) {
	tb.Helper()
	ns.sysctls(tb, map[string]string{"net/ipv6/conf/all/disable_ipv6": "1", "net/ipv6/conf/default/disable_ipv6": "1"})
}

// serve runs the echo, UDP and sink servers on backend address a.
func (top *topology) serve(tb testing.TB, a netip.Addr) {
	tb.Helper()
	var echo, sink net.Listener
	var pc net.PacketConn
	err := netnamespace.Run(top.backend.path, func() (err error) {
		if echo, err = net.Listen("tcp", netip.AddrPortFrom(a, echoPort).String()); err != nil {
			return err
		}
		if sink, err = net.Listen("tcp", netip.AddrPortFrom(a, sinkPort).String()); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, udpPort).String())
		return err
	})
	if err != nil {
		tb.Fatalf("backend listen on %s: %v", a, err)
	}
	tb.Cleanup(func() { echo.Close(); sink.Close(); pc.Close() })
	accept := func(ln net.Listener, handle func(net.Conn)) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			top.hits.Add(1)
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}
	go accept(echo, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", a)
		io.Copy(c, c) //nolint:errcheck // the client checks what comes back
	})
	go accept(sink, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d", n)
	})
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			top.hits.Add(1)
			pc.WriteTo(fmt.Appendf(nil, "%s %s", a, buf[:n]), from) //nolint:errcheck // the client retries
		}
	}()
}

// tailnetEnv is a local tailnet and a way to mint auth keys for it.
type tailnetEnv struct {
	lt  *localtailnet.LocalTailnet
	api *tailnet.APIClient
}

func startTailnet(tb testing.TB) *tailnetEnv {
	tb.Helper()
	lt, api := localtailnettest.Start(tb, localtailnet.Options{})
	return &tailnetEnv{lt: lt, api: api}
}

// join starts a tsnet node on dev (nil: tsnet's userspace stack alone) and waits until it
// runs.
func (env *tailnetEnv) join(tb testing.TB, hostname string, dev tun.Device) *tsnet.Server {
	tb.Helper()
	k, err := env.api.CreateAuthKey(tb.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Description: hostname, Expiry: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	logf := logger.Discard
	if *verbose {
		logf = logger.WithPrefix(tb.Logf, hostname+": ")
	}
	s := &tsnet.Server{
		Dir:        tb.TempDir(),
		ControlURL: env.lt.ControlURL,
		Hostname:   hostname,
		Store:      new(mem.Store),
		Ephemeral:  true,
		AuthKey:    k.Secret.Reveal(),
		Tun:        dev,
		Logf:       logf,
		UserLogf:   logf,
	}
	tb.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(tb.Context(), 20*time.Second)
	defer cancel()
	if _, err := s.Up(ctx); err != nil {
		tb.Fatalf("%s: %v", hostname, err)
	}
	return s
}

// tcpEcho connects through client to dst's echo port, checks that payload comes back, and
// returns the backend that answered.
func tcpEcho(ctx context.Context, client *tsnet.Server, dst netip.Addr, payload string) (string, error) {
	c, err := client.Dial(ctx, "tcp", netip.AddrPortFrom(dst, echoPort).String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d) //nolint:errcheck // a read error follows
	}
	if _, err := io.WriteString(c, payload); err != nil {
		return "", err
	}
	buf := make([]byte, 0, 256)
	for want := len(payload); ; {
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if name, echoed, ok := strings.Cut(string(buf), "\n"); ok && len(echoed) >= want {
			if echoed != payload {
				return name, fmt.Errorf("echo from %s: got %q, want %q", name, echoed, payload)
			}
			return name, nil
		}
		if err != nil {
			return "", fmt.Errorf("read after %q: %w", buf, err)
		}
	}
}

// udpEcho sends payload through client to dst's UDP port until an answer comes back, and
// returns the backend that answered.
func udpEcho(ctx context.Context, client *tsnet.Server, dst netip.Addr, payload string) (string, error) {
	c, err := client.Dial(ctx, "udp", netip.AddrPortFrom(dst, udpPort).String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 1500)
	for {
		if _, err := io.WriteString(c, payload); err != nil {
			return "", err
		}
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond)) //nolint:errcheck // a read error follows
		n, err := c.Read(buf)
		if err == nil {
			name, echoed, _ := strings.Cut(string(buf[:n]), " ")
			if echoed != payload {
				return name, fmt.Errorf("UDP answer from %s: got %q, want %q", name, echoed, payload)
			}
			return name, nil
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("no UDP answer: %w", err)
		}
	}
}

// eventually retries probe until it reports want or timeout passes, and fails the test with
// the last outcome otherwise.
func eventually(tb testing.TB, what string, timeout time.Duration, want string, probe func(context.Context) (string, error)) {
	tb.Helper()
	poll.Eventually(tb, timeout, what, func() error {
		ctx, cancel := context.WithTimeout(tb.Context(), time.Second)
		defer cancel()
		got, err := probe(ctx)
		if err == nil && got != want {
			err = fmt.Errorf("reached %q, want %s", got, want)
		}
		return err
	})
}

// dnsServer answers A and AAAA queries for the names it knows on 127.0.0.1; other names do not
// exist.
type dnsServer struct {
	pc      net.PacketConn
	mu      sync.Mutex
	records map[string][]netip.Addr // by fully qualified name
	queries atomic.Int64
}

func startDNS(tb testing.TB) *dnsServer {
	tb.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &dnsServer{pc: pc, records: map[string][]netip.Addr{}}
	tb.Cleanup(func() { pc.Close() })
	go s.serve()
	return s
}

func (s *dnsServer) set(name string, addrs ...netip.Addr) {
	s.mu.Lock()
	s.records[name] = addrs
	s.mu.Unlock()
}

// resolver sends every query to s.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.pc.LocalAddr().String())
	}}
}

func (s *dnsServer) serve() {
	buf := make([]byte, 512)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if reply, err := s.answer(buf[:n]); err == nil {
			s.pc.WriteTo(reply, from) //nolint:errcheck // the resolver retries
		}
	}
}

func (s *dnsServer) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	s.queries.Add(1)
	s.mu.Lock()
	addrs, known := s.records[strings.ToLower(q.Name.String())]
	s.mu.Unlock()
	rcode := dnsmessage.RCodeSuccess
	if !known {
		rcode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RCode: rcode})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
	for _, a := range addrs {
		switch {
		case a.Is4() && q.Type == dnsmessage.TypeA:
			err = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
		case a.Is6() && q.Type == dnsmessage.TypeAAAA:
			err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	return b.Finish()
}
