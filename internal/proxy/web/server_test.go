package web_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"tailscale.com/ipn/store/mem"
	"tailscale.com/net/netns"
	"tailscale.com/tailcfg"
	"tailscale.com/tsnet"
	"tailscale.com/tstest/integration/testcontrol"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/web"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func TestMain(m *testing.M) {
	// In-process tailnet nodes run without privileges (no SO_MARK), as in tsnet's own tests.
	netns.SetEnabled(false)
	os.Exit(m.Run())
}

const domain = "tail.test"

// The tailnet of these tests runs on tailscale's testcontrol, because its devices belong to
// users (the local tailnet's are all tagged) and identity headers are about users. The local
// tailnet provides the DERP relay.
func startTailnet(t *testing.T) string {
	t.Helper()
	lt, _ := localtailnettest.Start(t, localtailnet.Options{})
	control := &testcontrol.Server{
		DERPMap:        lt.DERPMap,
		DNSConfig:      &tailcfg.DNSConfig{Proxied: true},
		MagicDNSDomain: domain,
		TagOwners:      map[string][]string{}, // honour requested tags
		Logf:           logger.Discard,
	}
	hs := httptest.NewServer(control)
	t.Cleanup(hs.Close)
	return hs.URL
}

func joinNode(t *testing.T, controlURL, hostname string, tags ...string) *tsnet.Server {
	t.Helper()
	s := &tsnet.Server{
		Dir: t.TempDir(), ControlURL: controlURL, Hostname: hostname, Store: new(mem.Store),
		Ephemeral: true, AdvertiseTags: tags, Logf: logger.Discard, UserLogf: logger.Discard,
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := s.Up(ctx); err != nil {
		t.Fatalf("%s: %v", hostname, err)
	}
	return s
}

// seen is what a backend received.
type seen struct {
	Backend, Path, Query, Host string
	Header                     http.Header
}

// backend is an HTTP server standing in for a Service's ClusterIP; it records each request.
type backend struct {
	name string
	srv  *httptest.Server
	mu   sync.Mutex
	last seen
}

func newBackend(t *testing.T, name string, tlsToo bool) *backend {
	b := &backend{name: name}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		b.last = seen{Backend: name, Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host, Header: r.Header.Clone()}
		b.mu.Unlock()
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	})
	if tlsToo {
		b.srv = httptest.NewTLSServer(h)
	} else {
		b.srv = httptest.NewServer(h)
	}
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) seen() seen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// client sends requests from a tailnet node to the proxy node's address, trusting the test CA.
func client(node *tsnet.Server, proxyIP netip.Addr, ca *proxytest.CA) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				_, port, _ := net.SplitHostPort(addr)
				return node.Dial(ctx, network, net.JoinHostPort(proxyIP.String(), port))
			},
			TLSClientConfig:   &tls.Config{RootCAs: ca.Pool()},
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func get(t *testing.T, c *http.Client, url string, header http.Header) (int, string, http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(body), res.Header
}

type logBuffer struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}

func TestServer(t *testing.T) {
	controlURL := startTailnet(t)
	proxyNode := joinNode(t, controlURL, "proxy")
	alice := joinNode(t, controlURL, "alice")
	bot := joinNode(t, controlURL, "bot", "tag:bot")
	proxyIP, _ := proxyNode.TailscaleIPs()
	aliceIP, _ := alice.TailscaleIPs()
	lc, err := proxyNode.LocalClient()
	if err != nil {
		t.Fatal(err)
	}

	a, b := newBackend(t, "a", false), newBackend(t, "b", false)
	secure := newBackend(t, "secure", true)
	ca := proxytest.NewCA(t)
	var logs logBuffer
	srv := web.NewServer(web.Config{
		Listen: proxyNode.Listen, WhoIs: lc.WhoIs,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	const fqdn = "proxy." + domain
	srv.SetName(fqdn)
	cert, err := ca.Certificate(t.Context(), fqdn)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetCertificate(cert)
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closed.Close() // nothing listens there any more
	ws := contract.WebService{HTTP: contract.HTTPRedirect, Routes: []contract.Route{
		{Path: "/app", PathType: contract.PathPrefix, Backend: contract.Backend{URL: a.srv.URL}},
		{Path: "/metrics", PathType: contract.PathExact, Backend: contract.Backend{URL: b.srv.URL}},
		{Path: "/api", PathType: contract.PathPrefix, Backend: contract.Backend{URL: b.srv.URL + "/"}},
		{Path: "/secure", PathType: contract.PathPrefix, Backend: contract.Backend{URL: secure.srv.URL, InsecureSkipVerify: true}},
		{Path: "/unverified", PathType: contract.PathPrefix, Backend: contract.Backend{URL: secure.srv.URL}},
		{Path: "/down", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + closed.Addr().String()}},
	}}
	if err := srv.Apply(ws); err != nil {
		t.Fatal(err)
	}
	c := client(alice, proxyIP, ca)
	base := "https://" + fqdn

	t.Run("routes", func(t *testing.T) {
		for _, tc := range []struct {
			path, backend, gotPath, query string
			status                        int
		}{
			{path: "/metrics", backend: "b", gotPath: "/metrics", status: 200},
			{path: "/metrics/", backend: "", status: 404},
			{path: "/app", backend: "a", gotPath: "/app", status: 200},
			{path: "/app/x/y?q=1&r=%2F", backend: "a", gotPath: "/app/x/y", query: "q=1&r=%2F", status: 200},
			{path: "/apix", backend: "", status: 404},
			{path: "/api/v1", backend: "b", gotPath: "/api/v1", status: 200},
			{path: "/", backend: "", status: 404},
			{path: "/secure/x", backend: "secure", gotPath: "/secure/x", status: 200},
			{path: "/unverified", backend: "", status: 502},
			{path: "/down", backend: "", status: 502},
		} {
			status, body, _ := get(t, c, base+tc.path, nil)
			if status != tc.status {
				t.Errorf("%s: status %d, want %d (%q)", tc.path, status, tc.status, body)
				continue
			}
			if tc.backend == "" {
				continue
			}
			if want := tc.backend + " " + tc.gotPath; body != want {
				t.Errorf("%s: answer %q, want %q", tc.path, body, want)
			}
			var got seen
			for _, bk := range []*backend{a, b, secure} {
				if bk.name == tc.backend {
					got = bk.seen()
				}
			}
			if got.Path != tc.gotPath || got.Query != tc.query {
				t.Errorf("%s: backend saw %q?%q, want %q?%q", tc.path, got.Path, got.Query, tc.gotPath, tc.query)
			}
		}
		if !strings.Contains(logs.String(), "backend request failed") {
			t.Errorf("a failed backend was not logged:\n%s", logs.String())
		}
	})

	t.Run("forwarding headers", func(t *testing.T) {
		get(t, c, base+"/app", http.Header{"X-Forwarded-For": {"6.6.6.6"}, "X-Forwarded-Host": {"evil"}, "X-Forwarded-Proto": {"gopher"}})
		got := a.seen()
		want := map[string]string{"X-Forwarded-For": aliceIP.String(), "X-Forwarded-Host": fqdn, "X-Forwarded-Proto": "https"}
		for k, v := range want {
			if g := strings.Join(got.Header.Values(k), ","); g != v {
				t.Errorf("%s = %q, want %q", k, g, v)
			}
		}
		if got.Host != fqdn {
			t.Errorf("Host = %q, want the requested %q", got.Host, fqdn)
		}
	})

	t.Run("identity", func(t *testing.T) {
		spoof := http.Header{"Tailscale-User-Login": {"mallory@example.com"}, "Tailscale-User-Name": {"Mallory"}, "Tailscale-User-Other": {"x"}}
		get(t, c, base+"/app", spoof)
		h := a.seen().Header
		login, name, pic := h.Get(web.HeaderUserLogin), h.Get(web.HeaderUserName), h.Get(web.HeaderUserProfilePic)
		if !strings.HasSuffix(login, "@fake-control.example.net") || !strings.HasPrefix(name, "User ") || !strings.HasPrefix(pic, "https://") {
			t.Errorf("alice's identity: login %q, name %q, pic %q", login, name, pic)
		}
		if h.Get("Tailscale-User-Other") != "" {
			t.Error("a client's Tailscale-User-* header reached the backend")
		}

		get(t, client(bot, proxyIP, ca), base+"/app", spoof)
		for k := range a.seen().Header {
			if strings.HasPrefix(k, "Tailscale-User-") {
				t.Errorf("a tagged device's request carries %s", k)
			}
		}
	})

	t.Run("upgrade", func(t *testing.T) {
		echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Upgrade") != "echo" {
				http.Error(w, "upgrade required", http.StatusUpgradeRequired)
				return
			}
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			fmt.Fprint(rw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			rw.Flush()
			line, _ := rw.ReadString('\n')
			fmt.Fprint(rw, "echo: "+line)
			rw.Flush()
		}))
		t.Cleanup(echo.Close)
		up := ws
		up.Routes = append(up.Routes, contract.Route{Path: "/ws", PathType: contract.PathExact, Backend: contract.Backend{URL: echo.URL}})
		if err := srv.Apply(up); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/ws", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("status %d", res.StatusCode)
		}
		rwc := res.Body.(io.ReadWriter)
		fmt.Fprint(rwc, "ping\n")
		line, err := bufio.NewReader(rwc).ReadString('\n')
		if err != nil || line != "echo: ping\n" {
			t.Errorf("over the upgraded connection: %q, %v", line, err)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		release := make(chan struct{})
		stream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprint(w, "data: second\n\n")
		}))
		t.Cleanup(stream.Close)
		up := ws
		up.Routes = append(up.Routes, contract.Route{Path: "/events", PathType: contract.PathExact, Backend: contract.Backend{URL: stream.URL}})
		if err := srv.Apply(up); err != nil {
			t.Fatal(err)
		}
		res, err := c.Get(base + "/events")
		if err != nil {
			close(release)
			t.Fatal(err)
		}
		defer res.Body.Close()
		line, err := bufio.NewReader(res.Body).ReadString('\n')
		close(release) // only after the first event arrived: it was not buffered
		if err != nil || line != "data: first\n" {
			t.Errorf("first event: %q, %v", line, err)
		}
	})

	t.Run("hosts", func(t *testing.T) {
		byo := proxytest.NewCA(t) // a bring-your-own certificate's CA, not the tailnet's
		app, err := byo.Certificate(t.Context(), "app.example.com")
		if err != nil {
			t.Fatal(err)
		}
		srv.SetHostCertificates(map[string]*tls.Certificate{"App.Example.com": app, "broken.example.com": nil})
		hosted := ws
		hosted.Routes = append(slices.Clone(ws.Routes),
			contract.Route{Host: "app.example.com", Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: b.srv.URL}})
		if err := srv.Apply(hosted); err != nil {
			t.Fatal(err)
		}
		// The client trusts only the bring-your-own CA: the handshake shows which certificate came.
		appClient := client(alice, proxyIP, byo)
		for _, url := range []string{"https://app.example.com/app", "https://APP.example.com:443/app"} {
			if status, body, _ := get(t, appClient, url, nil); status != 200 || body != "b /app" {
				t.Errorf("%s: %d %q, want the host's route to b", url, status, body)
			}
		}
		// The tailnet name keeps its certificate and its routes.
		if status, body, _ := get(t, c, base+"/app", nil); status != 200 || body != "a /app" {
			t.Errorf("the tailnet name: %d %q", status, body)
		}
		// Not even a client that accepts any certificate gets the tailnet name's for that host.
		anyCert := client(alice, proxyIP, ca)
		anyCert.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
		if res, err := anyCert.Get("https://broken.example.com/app"); err == nil {
			res.Body.Close()
			t.Errorf("a host without a usable certificate answered %d", res.StatusCode)
		} else if !strings.Contains(err.Error(), "tls") {
			t.Errorf("a host without a usable certificate: %v, want a failed handshake", err)
		}
		srv.SetHostCertificates(nil)
		if err := srv.Apply(ws); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("http modes", func(t *testing.T) {
		if err := srv.Apply(ws); err != nil { // redirect
			t.Fatal(err)
		}
		for _, host := range []string{fqdn, "proxy", proxyIP.String()} {
			status, _, h := get(t, c, "http://"+host+"/app/x?y=1", nil)
			if want := "https://" + fqdn + "/app/x?y=1"; status != http.StatusMovedPermanently || h.Get("Location") != want {
				t.Errorf("http://%s: %d to %q, want 301 to %q", host, status, h.Get("Location"), want)
			}
		}

		serve := ws
		serve.HTTP = contract.HTTPServe
		if err := srv.Apply(serve); err != nil {
			t.Fatal(err)
		}
		status, body, _ := get(t, c, "http://"+fqdn+"/metrics", nil)
		if status != 200 || body != "b /metrics" || b.seen().Header.Get("X-Forwarded-Proto") != "http" {
			t.Errorf("serve mode: %d %q, X-Forwarded-Proto %q", status, body, b.seen().Header.Get("X-Forwarded-Proto"))
		}
		if status, _, _ := get(t, c, "http://"+fqdn+"/nothing", nil); status != 404 {
			t.Errorf("serve mode, no route: %d", status)
		}

		off := ws
		off.HTTP = contract.HTTPOff
		if err := srv.Apply(off); err != nil {
			t.Fatal(err)
		}
		if res, err := c.Get("http://" + fqdn + "/app"); err == nil {
			res.Body.Close()
			t.Errorf("port 80 answers %d with the HTTP mode off", res.StatusCode)
		}
		if status, _, _ := get(t, c, base+"/app", nil); status != 200 {
			t.Errorf("HTTPS with port 80 off: %d", status)
		}

		if err := srv.Apply(ws); err != nil { // and back on
			t.Fatal(err)
		}
		if status, _, _ := get(t, c, "http://"+fqdn+"/", nil); status != http.StatusMovedPermanently {
			t.Errorf("port 80 reopened: %d", status)
		}
		// Closing port 80 is no listener failure: nothing may reach Errors, which stops a proxy.
		select {
		case err := <-srv.Errors():
			t.Errorf("turning port 80 off reported %v", err)
		default:
		}
	})

	t.Run("reload", func(t *testing.T) {
		next := contract.WebService{Routes: []contract.Route{
			{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: b.srv.URL}},
		}}
		if err := srv.Apply(next); err != nil {
			t.Fatal(err)
		}
		if _, body, _ := get(t, c, base+"/app", nil); body != "b /app" {
			t.Errorf("after the reload /app went to %q", body)
		}
	})

	t.Run("shutdown drains", func(t *testing.T) {
		arrived, release := make(chan struct{}), make(chan struct{})
		slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(arrived)
			<-release
			fmt.Fprint(w, "done")
		}))
		t.Cleanup(slow.Close)
		if err := srv.Apply(contract.WebService{Routes: []contract.Route{
			{Path: "/slow", PathType: contract.PathExact, Backend: contract.Backend{URL: slow.URL}},
		}}); err != nil {
			t.Fatal(err)
		}
		type result struct {
			status int
			body   string
		}
		done := make(chan result, 1)
		go func() {
			res, err := c.Get(base + "/slow")
			if err != nil {
				done <- result{body: err.Error()}
				return
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			done <- result{res.StatusCode, string(body)}
		}()
		<-arrived
		shut := make(chan error, 1)
		go func() { shut <- srv.Shutdown(t.Context()) }()
		// New connections are refused while the request in flight finishes.
		deadline := time.Now().Add(10 * time.Second)
		for {
			res, err := c.Get(base + "/slow")
			if err != nil {
				break
			}
			res.Body.Close()
			if time.Now().After(deadline) {
				t.Fatal("still accepting connections after Shutdown")
			}
			time.Sleep(10 * time.Millisecond)
		}
		close(release)
		if r := <-done; r.status != 200 || r.body != "done" {
			t.Errorf("request in flight during shutdown: %d %q", r.status, r.body)
		}
		if err := <-shut; err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
}
