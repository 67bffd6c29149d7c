package serviceconn

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/ipn/store/mem"
	"tailscale.com/net/netns"
	"tailscale.com/tailcfg"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
)

// A service's connections reach its listener straight from the node's network stack, with the
// client's tailnet address, once the Serve config names the port with no handler of its own;
// a closed listener's port leaves the Serve config, and its connections are refused.
func TestConns(t *testing.T) {
	netns.SetEnabled(false)
	lt, api := localtailnettest.Start(t, localtailnet.Options{})
	join := func(name string) (*tsnet.Server, *local.Client) {
		k, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Description: name, Expiry: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		n := &tsnet.Server{Dir: t.TempDir(), ControlURL: lt.ControlURL, Hostname: name, Store: new(mem.Store), Ephemeral: true,
			AuthKey: k.Secret.Reveal(), Logf: logger.Discard, UserLogf: logger.Discard}
		t.Cleanup(func() { n.Close() })
		if _, err := n.Up(t.Context()); err != nil {
			t.Fatal(err)
		}
		lc, _ := n.LocalClient()
		return n, lc
	}
	host, hostLC := join("host")
	client, _ := join("client")
	var vips [2]netip.Addr
	for i, name := range []string{"svc:a", "svc:b"} {
		svc, err := api.PutService(t.Context(), tailnet.Service{Name: name, Ports: []string{"tcp:80", "tcp:443"}, Tags: []string{"tag:k8s"}})
		if err != nil {
			t.Fatal(err)
		}
		vips[i] = svc.Addrs[0]
	}

	conns := New(host, hostLC, slog.New(slog.DiscardHandler))
	if conns.Named("svc:a") {
		t.Fatal("svc:a named before any sync")
	}
	a443, b443 := conns.Listen("svc:a", 443), conns.Listen("svc:b", 443)
	serveEcho(a443, "a")
	serveEcho(b443, "b")
	if err := conns.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !conns.Named("svc:a") || !conns.Named("svc:b") {
		t.Fatal("the services are not named after sync")
	}
	sc, err := hostLC.GetServeConfig(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []tailcfg.ServiceName{"svc:a", "svc:b"} {
		h := sc.Services[name].TCP[443]
		if h == nil || h.TCPForward != "" || h.HTTPS || h.HTTP || len(sc.Services[name].TCP) != 1 {
			t.Errorf("%s in the Serve config: %+v; want port 443 alone, with no handler", name, sc.Services[name])
		}
	}
	if _, err := hostLC.EditPrefs(t.Context(), &ipn.MaskedPrefs{AdvertiseServicesSet: true,
		Prefs: ipn.Prefs{AdvertiseServices: []string{"svc:a", "svc:b"}}}); err != nil {
		t.Fatal(err)
	}

	ip4, _ := client.TailscaleIPs()
	want := map[string]string{"a": "a " + ip4.String(), "b": "b " + ip4.String()}
	for i, name := range []string{"a", "b"} {
		dst := netip.AddrPortFrom(vips[i], 443).String()
		got := waitFor(t, dst, func() (string, error) { return echoVia(t, client, dst) })
		if got != want[name] {
			t.Errorf("%s: %q, want %q (the service's listener, the client's address)", dst, got, want[name])
		}
	}

	// The node's own address reaches no service's listener, though services listen on the port.
	hostIP, _ := host.TailscaleIPs()
	if got, err := echoVia(t, client, netip.AddrPortFrom(hostIP, 443).String()); err == nil {
		t.Errorf("the node's own address on port 443 answered %q", got)
	}

	// Closed: the port leaves the Serve config and its connections go nowhere.
	a443.Close()
	if err := conns.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if conns.Named("svc:a") || !conns.Named("svc:b") {
		t.Error("after svc:a closed: named", conns.Named("svc:a"), conns.Named("svc:b"))
	}
	if sc, err = hostLC.GetServeConfig(t.Context()); err != nil || sc.Services["svc:a"] != nil {
		t.Errorf("svc:a still in the Serve config: %+v (%v)", sc.Services, err)
	}
	if got, err := echoVia(t, client, netip.AddrPortFrom(vips[0], 443).String()); err == nil {
		t.Errorf("svc:a answered %q after its listener closed", got)
	}
	if got, err := echoVia(t, client, netip.AddrPortFrom(vips[1], 443).String()); got != want["b"] {
		t.Errorf("svc:b after svc:a closed: %q, %v", got, err)
	}
}

// serveEcho answers each connection with "<name> <the remote address's IP>".
func serveEcho(ln net.Listener, name string) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
			io.WriteString(c, name+" "+ap.Addr().String())
			c.Close()
		}
	}()
}

func echoVia(t *testing.T, node *tsnet.Server, dst string) (string, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	c, err := node.Dial(ctx, "tcp", dst)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	if err == nil && len(b) == 0 {
		err = io.ErrUnexpectedEOF
	}
	return string(b), err
}

// waitFor retries f until it succeeds (the client learns of the advertisement through control).
func waitFor(t *testing.T, what string, f func() (string, error)) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := f()
		if err == nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
