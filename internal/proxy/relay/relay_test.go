package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/testing/proxyprotoecho"
)

func TestHeader(t *testing.T) {
	ap := netip.MustParseAddrPort
	sig := "\r\n\r\n\x00\r\nQUIT\n"
	for name, tc := range map[string]struct {
		v        int
		network  string
		src, dst netip.AddrPort
		want     string
		wantErr  bool
	}{
		// The byte layouts of the PROXY protocol specification (haproxy.org, proxy-protocol.txt).
		"v1 TCP4": {1, "tcp", ap("100.64.0.7:40000"), ap("100.64.0.2:5432"), "PROXY TCP4 100.64.0.7 100.64.0.2 40000 5432\r\n", false},
		"v1 TCP6": {1, "tcp", ap("[fd7a:115c:a1e0::7]:40000"), ap("[fd7a:115c:a1e0::2]:5432"),
			"PROXY TCP6 fd7a:115c:a1e0::7 fd7a:115c:a1e0::2 40000 5432\r\n", false},
		"v1 mapped": {1, "tcp", ap("[::ffff:100.64.0.7]:1"), ap("100.64.0.2:2"), "PROXY TCP4 100.64.0.7 100.64.0.2 1 2\r\n", false},
		"v2 TCP4": {2, "tcp", ap("100.64.0.7:40000"), ap("100.64.0.2:5432"),
			sig + "\x21\x11\x00\x0c" + "\x64\x40\x00\x07" + "\x64\x40\x00\x02" + "\x9c\x40" + "\x15\x38", false},
		"v2 UDP4": {2, "udp", ap("100.64.0.7:40000"), ap("100.64.0.2:53"),
			sig + "\x21\x12\x00\x0c" + "\x64\x40\x00\x07" + "\x64\x40\x00\x02" + "\x9c\x40" + "\x00\x35", false},
		"v1 UDP":         {1, "udp", ap("100.64.0.7:1"), ap("100.64.0.2:2"), "", true},
		"mixed families": {2, "tcp", ap("100.64.0.7:1"), ap("[fd7a:115c:a1e0::2]:2"), "", true},
		"version 3":      {3, "tcp", ap("100.64.0.7:1"), ap("100.64.0.2:2"), "", true},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Header(tc.v, tc.network, tc.src, tc.dst)
			if (err != nil) != tc.wantErr || string(got) != tc.want {
				t.Errorf("Header = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestHost(t *testing.T) {
	hosts := []string{"10.96.0.5", "fd00::5"}
	if got := host(hosts, netip.MustParseAddr("100.64.0.2")); got != "10.96.0.5" {
		t.Errorf("IPv4 client to %s, want the IPv4 ClusterIP", got)
	}
	if got := host(hosts, netip.MustParseAddr("fd7a:115c:a1e0::2")); got != "fd00::5" {
		t.Errorf("IPv6 client to %s, want the IPv6 ClusterIP", got)
	}
	if got := host([]string{"db.example.com"}, netip.MustParseAddr("fd7a:115c:a1e0::2")); got != "db.example.com" {
		t.Errorf("a DNS name's client to %s", got)
	}
}

// proxyBackend answers the PROXY protocol headers it reads (package proxyprotoecho) on a port
// of its own.
func proxyBackend(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go proxyprotoecho.ServeTCP(ln)
	return ln
}

func TestServeTCP(t *testing.T) {
	backend := proxyBackend(t)
	// The proxy listens on the backend's port, as a relayed Service port does.
	front, err := net.Listen("tcp", "127.0.0.2:"+fmt.Sprint(backend.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := New(1, []string{"127.0.0.1"}, nil, slog.Default())
	served := make(chan error, 1)
	go func() { served <- r.ServeTCP(ctx, front) }()
	for _, v := range []int{1, 2} {
		// A changed version applies to the next connection, on the same listener.
		r.Set(v, []string{"127.0.0.1"})
		c, err := net.Dial("tcp", front.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		// The client's half-close reaches the backend, whose answer still comes back.
		_ = c.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(c)
		want := fmt.Sprintf("v%d %s %s hello", v, c.LocalAddr(), front.Addr())
		if err != nil || string(got) != want {
			t.Errorf("answer %q, %v; want %q", got, err, want)
		}
		c.Close()
	}
	cancel()
	front.Close()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("ServeTCP = %v after its context ended", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("ServeTCP still running 5 s after its context ended")
	}
}

func TestServeUDP(t *testing.T) {
	backend, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go proxyprotoecho.ServeUDP(backend)
	port := backend.LocalAddr().(*net.UDPAddr).Port
	front, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.2:%d", port))
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	local := netip.MustParseAddrPort(front.LocalAddr().String())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := New(2, []string{"127.0.0.1"}, nil, slog.Default())
	served := make(chan error, 1)
	go func() { served <- r.ServeUDP(ctx, front, local) }()

	c, err := net.Dial("udp", front.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for i := range 3 {
		// Each datagram carries its own header; the flow's socket is reused.
		payload := fmt.Sprintf("ping%d", i)
		if _, err := c.Write([]byte(payload)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		want := fmt.Sprintf("v2 %s %s %s", c.LocalAddr(), local, payload)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("answer %q, %v; want %q", buf[:n], err, want)
		}
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("ServeUDP = %v after its context ended", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("ServeUDP still running 5 s after its context ended")
	}
}
