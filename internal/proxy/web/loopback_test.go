package web_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tailscale.com/client/tailscale/apitype"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/web"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// loopback is a web.Server listening on loopback ports instead of the tailnet: these tests are
// about routing and balancing, not about the tailnet.
type loopback struct {
	srv         *web.Server
	https, http string // host:port of the listeners for 443 and 80
	mu          sync.Mutex
	ports       map[string]string // host:port of the latest listener of each port (":8080")
}

// port is the host:port the server's latest listener of a port (":8080") took.
func (lb *loopback) port(p string) string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return lb.ports[p]
}

func startLoopback(t testing.TB, ws contract.WebService, log *slog.Logger) *loopback {
	t.Helper()
	return startLoopbackWith(t, ws, log, nil)
}

// startLoopbackWith starts a loopback server counting its requests in m.
func startLoopbackWith(t testing.TB, ws contract.WebService, log *slog.Logger, m *web.Metrics) *loopback {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lb := &loopback{ports: map[string]string{}}
	listen := func(network, addr string) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lb.mu.Lock()
		defer lb.mu.Unlock()
		lb.ports[addr] = ln.Addr().String()
		switch addr {
		case ":443":
			lb.https = ln.Addr().String()
		case ":80":
			lb.http = ln.Addr().String()
		}
		return ln, nil
	}
	noIdentity := func(context.Context, string) (*apitype.WhoIsResponse, error) {
		return nil, errors.New("not a tailnet peer")
	}
	lb.srv = web.NewServer(web.Config{Listen: listen, WhoIs: noIdentity, Logger: log, Metrics: m})
	if err := lb.srv.Apply(ws); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lb.srv.Shutdown(ctx)
	})
	return lb
}

// pods starts n echo pods of one Service on loopback ports.
func pods(t testing.TB, service string, n int) []*proxytest.EchoPod {
	t.Helper()
	var out []*proxytest.EchoPod
	for i := range n {
		p, err := proxytest.StartEchoPod(t, service, fmt.Sprintf("%s-%d", service, i), "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func addrs(ps []*proxytest.EchoPod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Addr)
	}
	return out
}

// clusterIP starts a kube-proxy stand-in in front of ps.
func clusterIP(t testing.TB, ps []*proxytest.EchoPod) *proxytest.ClusterIP {
	t.Helper()
	c, err := proxytest.StartClusterIP(t, "127.0.0.1:0", addrs(ps))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func balanced(url string, endpoints []string) contract.WebService {
	return contract.WebService{HTTP: contract.HTTPServe, Routes: []contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: url, Endpoints: endpoints}}}}
}

// send sends a request through the proxy's port 80 with a client that keeps its connection
// alive, and returns the echo reply (zero on a non-200 answer) and the status.
func send(t testing.TB, c *http.Client, method, url, body string) (proxytest.EchoReply, int, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return proxytest.EchoReply{}, 0, err
	}
	defer resp.Body.Close()
	var r proxytest.EchoReply
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &r); err != nil {
			return r, resp.StatusCode, fmt.Errorf("reply %q: %w", b, err)
		}
	}
	return r, resp.StatusCode, nil
}

// Requests are spread across the endpoints one by one, even over one kept-alive connection;
// through the ClusterIP alone, kube-proxy's per-connection balancing sends them all to one Pod.
func TestBalancesRequestsAcrossEndpoints(t *testing.T) {
	ps := pods(t, "echo", 5)
	cip := clusterIP(t, ps)
	c := &http.Client{}
	for _, tc := range []struct {
		name      string
		endpoints []string
		wantPods  int
	}{
		{"endpoints", addrs(ps), 5},
		{"clusterIP only", nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lb := startLoopback(t, balanced("http://"+cip.Addr, tc.endpoints), nil)
			perPod := map[string]int{}
			for range 50 {
				r, code, err := send(t, c, "GET", "http://"+lb.http+"/", "")
				if err != nil || code != 200 {
					t.Fatalf("GET: %d %v", code, err)
				}
				perPod[r.Pod]++
			}
			if len(perPod) != tc.wantPods {
				t.Errorf("requests per pod = %v, want %d pods", perPod, tc.wantPods)
			}
			if tc.wantPods == 5 {
				for pod, n := range perPod {
					if n != 10 {
						t.Errorf("pod %s got %d of 50 requests, want 10 (round robin)", pod, n)
					}
				}
			}
		})
	}
}

// An endpoint that refuses connections is skipped, with no error seen by the client, whatever
// the method and body; when every endpoint refuses, the ClusterIP serves.
func TestRefusingEndpointsAreSkipped(t *testing.T) {
	ps := pods(t, "echo", 2)
	cip := clusterIP(t, ps)
	dead := closedPort(t)
	var logs logBuffer
	lb := startLoopback(t, balanced("http://"+cip.Addr, []string{dead, ps[0].Addr, ps[1].Addr}),
		slog.New(slog.NewTextHandler(&logs, nil)))
	c := &http.Client{}
	for i := range 20 {
		method := []string{"GET", "POST", "PUT"}[i%3]
		body := fmt.Sprintf("body %d", i)
		r, code, err := send(t, c, method, "http://"+lb.http+"/x", body)
		if err != nil || code != 200 {
			t.Fatalf("%s: %d %v", method, code, err)
		}
		if want := body; method != "GET" && r.Body != want {
			t.Errorf("%s: backend got body %q, want %q", method, r.Body, want)
		}
	}
	if got := ps[0].Served.Load() + ps[1].Served.Load(); got != 20 {
		t.Errorf("pods served %d requests, want 20", got)
	}
	// Skipped after the first refusal, not tried on every request.
	if n := strings.Count(logs.String(), "backend endpoint refused"); n != 1 {
		t.Errorf("the dead endpoint was tried %d times, want once:\n%s", n, logs.String())
	}

	t.Run("all refuse", func(t *testing.T) {
		lb := startLoopback(t, balanced("http://"+cip.Addr, []string{closedPort(t), closedPort(t)}), nil)
		for range 3 {
			if _, code, err := send(t, c, "POST", "http://"+lb.http+"/", "x"); err != nil || code != 200 {
				t.Fatalf("POST with every endpoint refusing: %d %v, want the ClusterIP to answer", code, err)
			}
		}
	})
	t.Run("ClusterIP refuses too", func(t *testing.T) {
		lb := startLoopback(t, balanced("http://"+closedPort(t), []string{closedPort(t)}), nil)
		if _, code, err := send(t, c, "GET", "http://"+lb.http+"/", ""); err != nil || code != http.StatusBadGateway {
			t.Fatalf("GET: %d %v, want 502", code, err)
		}
	})
}

// closedPort is a loopback address that refuses connections.
func closedPort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A rolling update of the backend under load: each old Pod is replaced by a new one, and the
// config without the old one arrives a little after the Pod starts terminating, as the
// operator's would.
//
// A Pod that drains first (a preStop delay, as Kubernetes recommends) loses no request at all.
// A Pod that stops at once closes its idle kept-alive connections, and a request the proxy sends
// on one of them at that instant fails: the proxy resends GETs (idempotent) and requests that
// were not written at all, but, as RFC 9112 requires, not a POST that may have been received.
func TestRollingUpdateUnderLoad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		preStop bool
	}{{"pods drain before stopping", true}, {"pods stop at once", false}} {
		t.Run(tc.name, func(t *testing.T) {
			sent, failed, logs := rollout(t, tc.preStop)
			t.Logf("requests during the rollout: %v sent, %v failed", sent, failed)
			for _, m := range []string{"GET", "POST"} {
				if sent[m] < 100 {
					t.Errorf("only %d %s requests were sent during the rollout", sent[m], m)
				}
			}
			if failed["GET"] != 0 || (tc.preStop && failed["POST"] != 0) {
				t.Errorf("failed requests %v of %v; proxy log:\n%s", failed, sent, logs)
			}
		})
	}
}

// rollout replaces 3 Pods one by one under GET and POST load and counts requests by method.
func rollout(t *testing.T, preStop bool) (sent, failed map[string]int64, logs string) {
	old := pods(t, "echo", 3)
	cip := clusterIP(t, old)
	var log logBuffer
	lb := startLoopback(t, balanced("http://"+cip.Addr, addrs(old)), slog.New(slog.NewTextHandler(&log, nil)))

	ctx, stop := context.WithCancel(t.Context())
	var mu sync.Mutex
	sent, failed = map[string]int64{}, map[string]int64{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			c := &http.Client{Timeout: 10 * time.Second}
			for i := 0; ctx.Err() == nil && i < 100000; i++ {
				method, body := "GET", ""
				if w%2 == 1 {
					method, body = "POST", fmt.Sprintf("w%d-%d", w, i)
				}
				r, code, err := send(t, c, method, "http://"+lb.http+"/", body)
				mu.Lock()
				sent[method]++
				if err != nil || code != 200 || r.Body != body {
					failed[method]++
				}
				mu.Unlock()
			}
		})
	}

	current := append([]*proxytest.EchoPod(nil), old...)
	apply := func() {
		cip.SetPods(addrs(current))
		if err := lb.srv.Apply(balanced("http://"+cip.Addr, addrs(current))); err != nil {
			t.Error(err)
		}
	}
	for i, o := range old {
		time.Sleep(150 * time.Millisecond)
		current = append(current, pods(t, fmt.Sprintf("new%d", i), 1)[0])
		apply()
		time.Sleep(150 * time.Millisecond)
		// Terminating: the endpoints catch up 100ms later.
		current = current[1:]
		if preStop {
			time.AfterFunc(300*time.Millisecond, func() { o.Shutdown(context.Background()) })
		} else {
			go o.Shutdown(context.Background())
		}
		time.Sleep(100 * time.Millisecond)
		apply()
	}
	time.Sleep(400 * time.Millisecond)
	stop()
	wg.Wait()
	for _, p := range current {
		if p.Served.Load() == 0 {
			t.Errorf("new pod %s served nothing", p.Name)
		}
	}
	return sent, failed, log.String()
}

// Port 80 redirects a bring-your-own host (or one its wildcard covers) to itself, keeping its
// routes, and anything else to the tailnet name; methods other than GET and HEAD get a 308 so
// that they keep their method and body.
func TestRedirectKeepsServedHosts(t *testing.T) {
	ca := proxytest.NewCA(t)
	cert := func(name string) *tls.Certificate {
		c, err := ca.Certificate(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	lb := startLoopback(t, contract.WebService{HTTP: contract.HTTPRedirect, Routes: []contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + closedPort(t)}}}}, nil)
	lb.srv.SetName("web.tail.test")
	lb.srv.SetHostCertificates(map[string]*tls.Certificate{
		"app.example.com": cert("app.example.com"),
		"*.foo.com":       cert("*.foo.com"),
		"broken.example":  nil,
	})
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		method, host, want string
		code               int
	}{
		{"GET", "app.example.com", "https://app.example.com/p?q=1", 301},
		{"GET", "APP.example.com:80", "https://app.example.com/p?q=1", 301},
		{"POST", "bar.foo.com", "https://bar.foo.com/p?q=1", 308},
		{"PUT", "baz.bar.foo.com", "https://web.tail.test/p?q=1", 308},
		{"HEAD", "web", "https://web.tail.test/p?q=1", 301},
		{"GET", "broken.example", "https://web.tail.test/p?q=1", 301}, // no usable certificate
		{"DELETE", "127.0.0.1", "https://web.tail.test/p?q=1", 308},
	} {
		req, _ := http.NewRequest(tc.method, "http://"+lb.http+"/p?q=1", nil)
		req.Host = tc.host
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code || resp.Header.Get("Location") != tc.want || resp.Header.Get("Server") != web.ServerHeader {
			t.Errorf("%s %s: %d Location %q Server %q, want %d %q %q", tc.method, tc.host, resp.StatusCode,
				resp.Header.Get("Location"), resp.Header.Get("Server"), tc.code, tc.want, web.ServerHeader)
		}
	}
}

// Every response names a server: the backend's when it names one, else the proxy.
func TestServerHeader(t *testing.T) {
	named := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "backend/1.0")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = named.Serve(ln) }() // returns ErrServerClosed once closed
	t.Cleanup(func() { named.Close() })
	ps := pods(t, "echo", 1)
	lb := startLoopback(t, contract.WebService{HTTP: contract.HTTPServe, Routes: []contract.Route{
		{Path: "/echo", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + ps[0].Addr}},
		{Path: "/named", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + ln.Addr().String()}},
		{Path: "/down", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + closedPort(t)}},
	}}, nil)
	for path, want := range map[string][]string{
		"/echo":  {web.ServerHeader},
		"/named": {"backend/1.0"},
		"/down":  {web.ServerHeader}, // 502
		"/none":  {web.ServerHeader}, // 404
	} {
		resp, err := http.Get("http://" + lb.http + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Values("Server"); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s (%d): Server %q, want %q", path, resp.StatusCode, got, want)
		}
	}
}

// A wildcard bring-your-own certificate is presented for the hosts it covers, one label deep.
func TestWildcardCertificateBySNI(t *testing.T) {
	ca := proxytest.NewCA(t)
	wild, err := ca.Certificate(t.Context(), "*.foo.com")
	if err != nil {
		t.Fatal(err)
	}
	tailnet, err := ca.Certificate(t.Context(), "web.tail.test")
	if err != nil {
		t.Fatal(err)
	}
	ps := pods(t, "wild", 1)
	lb := startLoopback(t, contract.WebService{Routes: []contract.Route{
		{Host: "*.foo.com", Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + ps[0].Addr}}}}, nil)
	lb.srv.SetName("web.tail.test")
	lb.srv.SetCertificate(tailnet)
	lb.srv.SetHostCertificates(map[string]*tls.Certificate{"*.foo.com": wild})
	for _, tc := range []struct {
		sni      string
		wantCert string // the name the presented certificate is for
		wantCode int
	}{
		{"bar.foo.com", "*.foo.com", 200},
		{"baz.bar.foo.com", "web.tail.test", 404},
		{"web.tail.test", "web.tail.test", 404},
	} {
		var presented string
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			ServerName: tc.sni, InsecureSkipVerify: true, // what is presented is the point
			VerifyConnection: func(cs tls.ConnectionState) error {
				presented = cs.PeerCertificates[0].DNSNames[0]
				return nil
			},
		}}}
		req, _ := http.NewRequest("GET", "https://"+lb.https+"/", nil)
		req.Host = tc.sni
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.sni, err)
		}
		resp.Body.Close()
		if presented != tc.wantCert || resp.StatusCode != tc.wantCode {
			t.Errorf("SNI %s: certificate for %q, status %d; want %q, %d", tc.sni, presented, resp.StatusCode, tc.wantCert, tc.wantCode)
		}
	}
}

// After StopKeepAlives the server still answers, but a kept-alive connection is not reused: the
// client's next request opens a new one, which a leaving replica's clients need.
func TestStopKeepAlives(t *testing.T) {
	ps := pods(t, "echo", 1)
	lb := startLoopback(t, balanced("http://"+ps[0].Addr, nil), nil)
	var dials atomic.Int32
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}}
	for range 3 {
		if _, code, err := send(t, c, "GET", "http://"+lb.http+"/", ""); err != nil || code != 200 {
			t.Fatalf("GET: %d %v", code, err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections for 3 requests before, want 1 kept alive", n)
	}
	lb.srv.StopKeepAlives()
	for range 3 {
		if _, code, err := send(t, c, "GET", "http://"+lb.http+"/", ""); err != nil || code != 200 {
			t.Fatalf("GET after StopKeepAlives: %d %v", code, err)
		}
	}
	if n := dials.Load(); n != 4 {
		t.Errorf("%d connections after 3 more requests, want 4 (a new one for each)", n)
	}
}
