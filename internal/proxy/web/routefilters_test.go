package web

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tailscale.com/client/tailscale/apitype"

	"github.com/tsingress/tsingress/internal/contract"
)

// A redirecting route answers with the target its redirect names, the rest of it the request's
// own; a scheme's well-known port is left out.
func TestRedirect(t *testing.T) {
	full := func(v string) *contract.PathChange {
		return &contract.PathChange{Type: contract.PathChangeFull, Value: v}
	}
	prefix := func(v string) *contract.PathChange {
		return &contract.PathChange{Type: contract.PathChangePrefix, Value: v}
	}
	for _, tc := range []struct {
		name      string
		routePath string
		redirect  contract.Redirect
		tls       bool
		target    string
		want      string
	}{
		{"to https", "/", contract.Redirect{Scheme: "https", StatusCode: 301}, false, "http://web.tailnet.test/a?b=c", "https://web.tailnet.test/a?b=c"},
		{"to http, the listener's port dropped", "/", contract.Redirect{Scheme: "http", StatusCode: 302}, true, "https://web.tailnet.test:443/a", "http://web.tailnet.test/a"},
		{"a port of its own", "/", contract.Redirect{Scheme: "https", Port: 8443, StatusCode: 302}, false, "http://web.tailnet.test/a", "https://web.tailnet.test:8443/a"},
		{"scheme kept, port named", "/", contract.Redirect{Port: 8080, StatusCode: 302}, false, "http://web.tailnet.test/a", "http://web.tailnet.test:8080/a"},
		{"scheme kept, listener port", "/", contract.Redirect{Hostname: "other.example.com", StatusCode: 302}, true, "https://web.tailnet.test/a", "https://other.example.com/a"},
		{"full path", "/old", contract.Redirect{Path: full("/new"), StatusCode: 302}, true, "https://web.tailnet.test/old/x?q=1", "https://web.tailnet.test/new?q=1"},
		{"prefix", "/old", contract.Redirect{Path: prefix("/new"), StatusCode: 302}, true, "https://web.tailnet.test/old/x", "https://web.tailnet.test/new/x"},
		{"prefix by /", "/old/", contract.Redirect{Path: prefix("/"), StatusCode: 302}, true, "https://web.tailnet.test/old/x", "https://web.tailnet.test/x"},
		{"prefix, the path itself", "/old", contract.Redirect{Path: prefix("/"), StatusCode: 302}, true, "https://web.tailnet.test/old", "https://web.tailnet.test/"},
		{"an escaped path kept", "/", contract.Redirect{Scheme: "https", StatusCode: 302}, false, "http://web.tailnet.test/a%2Fb", "https://web.tailnet.test/a%2Fb"},
		{"IPv6 host", "/", contract.Redirect{Scheme: "https", StatusCode: 302}, false, "http://[fd7a:115c:a1e0::1]/a", "https://[fd7a:115c:a1e0::1]/a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rd := tc.redirect
			ws := contract.WebService{Routes: []contract.Route{{Path: tc.routePath, PathType: contract.PathPrefix, Redirect: &rd,
				ResponseHeaders: &contract.HeaderEdits{Set: []contract.NameValue{{Name: "X-Redirected-By", Value: "route"}}}}}}
			h := validHandler(t, ws)
			req := httptest.NewRequest(http.MethodGet, tc.target, nil)
			if tc.tls {
				req.TLS = &tls.ConnectionState{ServerName: "web.tailnet.test"}
			} else {
				req.TLS = nil
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != rd.StatusCode || rec.Header().Get("Location") != tc.want {
				t.Errorf("%d Location %q, want %d %q", rec.Code, rec.Header().Get("Location"), rd.StatusCode, tc.want)
			}
			if got := rec.Header().Get("X-Redirected-By"); got != "route" {
				t.Errorf("response edits not applied to the redirect: X-Redirected-By %q", got)
			}
		})
	}
}

// A rewrite changes the Host and path the backend sees, and nothing the client sees; another
// route of the same backend is not rewritten.
func TestRewrite(t *testing.T) {
	type seen struct{ host, path, forwardedHost string }
	var got seen
	backend := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got = seen{r.Host, r.URL.RequestURI(), r.Header.Get("X-Forwarded-Host")}
	}))
	defer backend.Close()
	b := contract.Backend{URL: backend.URL}
	ws := contract.WebService{Routes: []contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: b},
		{Path: "/api/v1", PathType: contract.PathPrefix, Backend: b,
			Rewrite: &contract.Rewrite{Hostname: "internal.example.com", Path: &contract.PathChange{Type: contract.PathChangePrefix, Value: "/v1"}}},
		{Path: "/status", PathType: contract.PathExact, Backend: b, Rewrite: &contract.Rewrite{Path: &contract.PathChange{Type: contract.PathChangeFull, Value: "/healthz"}}},
	}}
	h := validHandler(t, ws)
	for _, tc := range []struct {
		target string
		want   seen
	}{
		{"https://web.tailnet.test/api/v1/users?page=2", seen{"internal.example.com", "/v1/users?page=2", "web.tailnet.test"}},
		{"https://web.tailnet.test/api/v1", seen{"internal.example.com", "/v1", "web.tailnet.test"}},
		{"https://web.tailnet.test/status", seen{"web.tailnet.test", "/healthz", "web.tailnet.test"}},
		{"https://web.tailnet.test/api/v10", seen{"web.tailnet.test", "/api/v10", "web.tailnet.test"}},
	} {
		got = seen{}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.target, nil))
		if rec.Code != http.StatusOK || got != tc.want {
			t.Errorf("%s: %d, backend saw %+v; want %+v", tc.target, rec.Code, got, tc.want)
		}
	}
}

// validHandler is the handler of a web service that must be valid, with no caller identities.
func validHandler(t *testing.T, ws contract.WebService) *handler {
	t.Helper()
	if err := ws.Validate(); err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(NewRouter(ws.Routes), ws.AcceptAppCaps, newTransports(), newIdentities(noWhoIs), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func noWhoIs(context.Context, string) (*apitype.WhoIsResponse, error) {
	return &apitype.WhoIsResponse{}, nil
}

// A split sends each backend its weight's share of the route's requests.
func TestSplit(t *testing.T) {
	var mu sync.Mutex
	counts := map[string]int{}
	backend := func(name string) contract.Backend {
		srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			mu.Lock()
			counts[name]++
			mu.Unlock()
		}))
		t.Cleanup(srv.Close)
		return contract.Backend{URL: srv.URL}
	}
	ws := contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backends: []contract.WeightedBackend{
		{Backend: backend("stable"), Weight: 80}, {Backend: backend("canary"), Weight: 15}, {Backend: backend("next"), Weight: 5},
	}}}}
	h := validHandler(t, ws)
	const n = 4000
	for range n {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "https://web.tailnet.test/", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("status %d", rec.Code)
		}
	}
	// Each share within 5 standard deviations of its weight (binomial: sqrt(n p (1-p))).
	for name, weight := range map[string]float64{"stable": 0.80, "canary": 0.15, "next": 0.05} {
		want, sd := n*weight, math.Sqrt(n*weight*(1-weight))
		if got := float64(counts[name]); math.Abs(got-want) > 5*sd {
			t.Errorf("%s got %v of %d requests, want %v ± %.0f", name, got, n, want, 5*sd)
		}
	}
}

// A mirror gets a copy of each request of its share, body included, while the backend's answer
// is the client's; a body larger than mirrors take reaches the backend whole, unmirrored.
func TestMirror(t *testing.T) {
	type seen struct{ method, path, body string }
	record := func(ch chan seen, status int) contract.Backend {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			ch <- seen{r.Method, r.URL.Path, string(b)}
			w.WriteHeader(status)
		}))
		t.Cleanup(srv.Close)
		return contract.Backend{URL: srv.URL}
	}
	primary, copies, never := make(chan seen, 10), make(chan seen, 10), make(chan seen, 10)
	ws := contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: record(primary, http.StatusCreated),
		Mirrors: []contract.Mirror{
			{Backend: record(copies, http.StatusTeapot), Numerator: 1, Denominator: 1},
			{Backend: record(never, http.StatusOK), Numerator: 0, Denominator: 1},
		}}}}
	h := validHandler(t, ws)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "https://web.tailnet.test/orders", strings.NewReader("one order")))
	if rec.Code != http.StatusCreated {
		t.Fatalf("status %d, want the backend's 201", rec.Code)
	}
	want := seen{http.MethodPost, "/orders", "one order"}
	if got := <-primary; got != want {
		t.Errorf("backend got %+v, want %+v", got, want)
	}
	select {
	case got := <-copies:
		if got != want {
			t.Errorf("mirror got %+v, want %+v", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the mirror got no copy")
	}

	big := strings.Repeat("x", maxMirrorBody+10)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "https://web.tailnet.test/bulk", strings.NewReader(big)))
	if got := <-primary; got.body != big {
		t.Errorf("backend got %d bytes of a body of %d", len(got.body), len(big))
	}
	select {
	case got := <-copies:
		t.Errorf("a body over the mirrors' limit was mirrored: %s %s", got.method, got.path)
	case got := <-never:
		t.Errorf("a mirror of share 0 got %s %s", got.method, got.path)
	case <-time.After(200 * time.Millisecond):
	}
}

// A backend with a fixed status answers it as the proxy, alone or as a share of a split, and
// reaches no server.
func TestFixedStatus(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }))
	t.Cleanup(srv.Close)
	ws := contract.WebService{Routes: []contract.Route{
		{Path: "/gone", PathType: contract.PathPrefix, Backend: contract.Backend{Status: http.StatusInternalServerError}},
		{Path: "/half", PathType: contract.PathPrefix, Backends: []contract.WeightedBackend{
			{Backend: contract.Backend{URL: srv.URL}, Weight: 1}, {Backend: contract.Backend{Status: http.StatusServiceUnavailable}, Weight: 1}}},
	}}
	h := validHandler(t, ws)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "https://web.tailnet.test/gone/x", nil))
	if rec.Code != http.StatusInternalServerError || rec.Header().Get("Server") != ServerHeader || served.Load() != 0 {
		t.Fatalf("/gone: status %d, Server %q, %d requests at the server", rec.Code, rec.Header().Get("Server"), served.Load())
	}
	codes := map[int]int{}
	for range 200 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "https://web.tailnet.test/half", nil))
		codes[rec.Code]++
	}
	// Each half within 5 standard deviations (binomial: sqrt(200/4) ≈ 7).
	if codes[http.StatusOK] < 65 || codes[http.StatusServiceUnavailable] < 65 || int(served.Load()) != codes[http.StatusOK] {
		t.Errorf("a split of a server and a fixed 503: %v, %d at the server", codes, served.Load())
	}
}

// A route's timeout answers 504 once the backend has not answered in time; a route without one
// waits.
func TestRouteTimeout(t *testing.T) {
	release := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer backend.Close()
	defer close(release)
	b := contract.Backend{URL: backend.URL}
	ws := contract.WebService{Routes: []contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: b},
		{Path: "/bounded", PathType: contract.PathPrefix, Backend: b, TimeoutMillis: 200},
	}}
	h := validHandler(t, ws)
	start := time.Now()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "https://web.tailnet.test/bounded", nil))
	if took := time.Since(start); rec.Code != http.StatusGatewayTimeout || took < 200*time.Millisecond {
		t.Errorf("bounded: %d after %v, want 504 after 200ms", rec.Code, took)
	}

	done := make(chan int)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "https://web.tailnet.test/unbounded", nil))
		done <- rec.Code
	}()
	select {
	case code := <-done:
		t.Fatalf("unbounded: answered %d before the backend", code)
	case <-time.After(500 * time.Millisecond):
	}
	release <- struct{}{}
	if code := <-done; code != http.StatusOK {
		t.Errorf("unbounded: %d, want 200", code)
	}
}
