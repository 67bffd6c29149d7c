package web_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/web"
)

// Requests are counted by Ingress, route and status code, timed, and a backend that cannot be
// reached counts as an upstream error; the names pass Prometheus's lint.
func TestRequestMetrics(t *testing.T) {
	echo := pods(t, "web", 1)[0]
	// A port that refuses connections: listened on, then closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	reg := prometheus.NewPedanticRegistry()
	m := web.NewMetrics(reg)
	ws := contract.WebService{HTTP: contract.HTTPServe, Ingress: "shop/store", Routes: []contract.Route{
		{Path: "/api", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + echo.Addr}},
		{Host: "app.example.com", Path: "/down", PathType: contract.PathExact, Backend: contract.Backend{URL: "http://" + dead}},
	}}
	lb := startLoopbackWith(t, ws, nil, m)
	c := &http.Client{}
	get := func(host, path string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+lb.http+path, nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 3 {
		if code := get("x", "/api/v1"); code != 200 {
			t.Fatalf("GET /api/v1 = %d", code)
		}
	}
	if code := get("x", "/nothing"); code != 404 {
		t.Fatalf("GET /nothing = %d", code)
	}
	if code := get("app.example.com", "/down"); code != 502 {
		t.Fatalf("GET app.example.com/down = %d", code)
	}

	want := `
# HELP tsingress_proxy_http_requests_total HTTP requests served, by Ingress (namespace/name), route (host and path as configured; empty when none matched) and status code.
# TYPE tsingress_proxy_http_requests_total counter
tsingress_proxy_http_requests_total{code="200",ingress="shop/store",route="/api"} 3
tsingress_proxy_http_requests_total{code="404",ingress="shop/store",route=""} 1
tsingress_proxy_http_requests_total{code="502",ingress="shop/store",route="app.example.com/down"} 1
# HELP tsingress_proxy_upstream_errors_total Requests whose backend could not be reached or failed before answering (answered 502), by Ingress and route.
# TYPE tsingress_proxy_upstream_errors_total counter
tsingress_proxy_upstream_errors_total{ingress="shop/store",route="app.example.com/down"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tsingress_proxy_http_requests_total", "tsingress_proxy_upstream_errors_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "tsingress_proxy_http_request_duration_seconds"); n != 3 {
		t.Errorf("%d latency histograms, want one per Ingress and route (3)", n)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
