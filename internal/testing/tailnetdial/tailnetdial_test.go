package tailnetdial_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"testing"
	"time"

	"tailscale.com/net/netns"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/tailnetdial"
)

func TestMain(m *testing.M) {
	// Nodes run in-process without privileges, as in tsnet's own tests.
	netns.SetEnabled(false)
	os.Exit(m.Run())
}

// A client asks for a Tailscale Service before any host serves it, by MagicDNS name and by
// VIP, as a test may once the operator reports the service but before the control plane has
// routed it: each request fails with ErrNoRoute (tsnet's own Dial goes to the host's network),
// and the same keep-alive HTTP client reaches the host once one serves the service.
func TestNoRouteUntilServed(t *testing.T) {
	lt, api := localtailnettest.Start(t, localtailnet.Options{Logf: t.Logf})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc, err := api.PutService(ctx, tailnet.Service{Name: "svc:web", Ports: []string{"tcp:80"}, Tags: []string{"tag:k8s"}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := api.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	host := startNode(ctx, t, lt, "host", key.Secret.Reveal())
	client := startNode(ctx, t, lt, "laptop", lt.MintUserKey("alice@example.com", "Alice").Reveal())

	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: tailnetdial.For(client)}}
	defer hc.CloseIdleConnections()
	byName := "http://web." + lt.Domain + "/"
	byVIP := "http://" + netip.AddrPortFrom(svc.Addrs[0], 80).String() + "/"
	for _, url := range []string{byName, byVIP} {
		if _, err := get(ctx, hc, url); !errors.Is(err, tailnetdial.ErrNoRoute) {
			t.Fatalf("GET %s before any host serves it: %v, want ErrNoRoute", url, err)
		}
	}

	// The host's peer address is routed from the start.
	hostIP, _ := host.TailscaleIPs()
	ln, err := host.Listen("tcp", ":8080")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "peer") })) //nolint:errcheck // ends with the node
	c, err := tailnetdial.Dial(ctx, client, "tcp", netip.AddrPortFrom(hostIP, 8080).String())
	if err != nil {
		t.Fatalf("dialing the host's own address: %v", err)
	}
	if ip4, _ := client.TailscaleIPs(); c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap() != ip4 {
		t.Errorf("connected from %v, want the client's tailnet address %v", c.LocalAddr(), ip4)
	}
	c.Close()

	sl, err := host.ListenService("svc:web", tsnet.ServiceModeHTTP{Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	go http.Serve(sl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "web") })) //nolint:errcheck // ends with the listener
	for _, url := range []string{byName, byVIP} {
		var got string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if got, err = get(ctx, hc, url); err == nil && got == "web" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s once served: %q, %v", url, got, err)
			}
		}
	}
}

func startNode(ctx context.Context, t *testing.T, lt *localtailnet.LocalTailnet, hostname, authKey string) *tsnet.Server {
	t.Helper()
	s := &tsnet.Server{Dir: t.TempDir(), Hostname: hostname, ControlURL: lt.ControlURL, AuthKey: authKey, Ephemeral: true, Logf: func(string, ...any) {}}
	if _, err := s.Up(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func get(ctx context.Context, hc *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	res, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", res.Status, b)
	}
	return string(b), err
}
