package l3

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tailscale/wireguard-go/tun"
	"golang.org/x/net/dns/dnsmessage"
	"tailscale.com/ipn/store/mem"
	tsnetns "tailscale.com/net/netns"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/poll"
)

var verbose = flag.Bool("verbose-nodes", false, "log what the tsnet nodes log")

func TestMain(m *testing.M) {
	// The tsnet nodes' own sockets stay plain (no SO_MARK or bind-to-device), as in tsnet's tests.
	tsnetns.SetEnabled(false)
	os.Exit(m.Run())
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

// topology is a netnstest.Topology whose backend holds the backend addresses above, with an
// echo, a UDP and a sink server on each.
type topology struct {
	netnstest.Topology
	hits atomic.Int64 // connections and datagrams the backends saw
}

func newTopology(tb testing.TB) *topology {
	tb.Helper()
	top := &topology{Topology: netnstest.NewTopology(tb)}
	for _, a := range []netip.Addr{backendA4, backendB4, backendC4, backendD4, backendA6, backendB6, backendC6, backendD6} {
		top.AddClusterIP(tb, a)
		top.serve(tb, a)
	}
	return top
}

// serve runs the echo, UDP and sink servers on backend address a.
func (top *topology) serve(tb testing.TB, a netip.Addr) {
	tb.Helper()
	var echo, sink net.Listener
	var pc net.PacketConn
	err := netnamespace.Run(top.Backend.Path, func() (err error) {
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
		c.SetDeadline(d)
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
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
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
