package web

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// FuzzRouter reads routes as the proxy gets them (a web service of a Serve document, validated
// by the contract) and matches a request against them: it must pick the most specific matching
// route of the most specific host group, and every route must be reachable at its own path.
func FuzzRouter(f *testing.F) {
	seed := func(ws contract.WebService, host, path string) {
		b, err := json.Marshal(ws)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, host, path)
	}
	r := func(host, path string, typ contract.PathType) contract.Route {
		return contract.Route{Host: host, Path: path, PathType: typ, Backend: contract.Backend{URL: "http://10.0.0.1:80"}}
	}
	seed(contract.WebService{Routes: []contract.Route{r("", "/", contract.PathPrefix), r("", "/api", contract.PathExact)}}, "web.tailnet.test", "/api")
	seed(contract.WebService{Routes: []contract.Route{r("app.example.com", "/a/", contract.PathPrefix), r("*.example.com", "/a/b", contract.PathPrefix)}}, "app.example.com", "/a/b/c")
	seed(contract.WebService{Routes: []contract.Route{r("", "/a//b", contract.PathPrefix), r("", "/x/../y", contract.PathExact)}}, "h", "/a/./b")
	seed(contract.WebService{Routes: []contract.Route{r("", "/%2e%2e/", contract.PathPrefix)}}, "", "")
	narrowed := r("", "/api", contract.PathPrefix)
	narrowed.Method, narrowed.Headers = "POST", []contract.NameValue{{Name: "X-Env", Value: "canary"}}
	seed(contract.WebService{Routes: []contract.Route{r("", "/", contract.PathPrefix), narrowed}}, "h", "/api")
	f.Fuzz(func(t *testing.T, doc []byte, host, reqPath string) {
		var ws contract.WebService
		if json.Unmarshal(doc, &ws) != nil || ws.Validate() != nil {
			return
		}
		rt := NewRouter(ws.Routes)
		checkMatch(t, rt, ws.Routes, request(HostOf(host), reqPath))
		for _, route := range ws.Routes {
			h := strings.ToLower(route.Host)
			switch {
			case h == "":
				h = "any.example"
			case contract.IsWildcard(h):
				h = "x" + h[1:]
			}
			if got := checkMatch(t, rt, ws.Routes, proxytest.RequestFor(h, route)); got < 0 {
				t.Fatalf("route %+v is unreachable: a request for %s%s matches nothing", route, h, route.Path)
			}
		}
	})
}

// checkMatch matches a request and compares the result with a plain reading of the rules: the
// first host group (the host's own routes, those of the wildcard covering it, those for every
// host) with a matching route decides, and in it the longest match wins, Exact before Prefix,
// then a route with a method, then the one with more header matches, then more query matches.
func checkMatch(t *testing.T, rt *Router, routes []contract.Route, req *http.Request) int {
	t.Helper()
	got := rt.match(req)
	host, reqPath := req.Host, req.URL.Path
	p := cleanPath(reqPath)
	asked := func(r contract.Route) bool {
		if r.Method != "" && r.Method != req.Method {
			return false
		}
		for _, h := range r.Headers {
			if !slices.Contains(req.Header.Values(h.Name), h.Value) {
				return false
			}
		}
		for _, q := range r.Query {
			if vs := req.URL.Query()[q.Name]; len(vs) == 0 || vs[0] != q.Value {
				return false
			}
		}
		return true
	}
	groups := []func(contract.Route) bool{
		func(r contract.Route) bool {
			return r.Host != "" && !contract.IsWildcard(r.Host) && strings.EqualFold(r.Host, host)
		},
		func(r contract.Route) bool {
			_, parent, ok := strings.Cut(host, ".")
			return ok && contract.IsWildcard(r.Host) && strings.EqualFold(r.Host[2:], parent)
		},
		func(r contract.Route) bool { return r.Host == "" },
	}
	for _, inGroup := range groups {
		best := -1
		for i, r := range routes {
			if !inGroup(r) || !matches(cleanRoute(r), nil, p) || !asked(r) {
				continue
			}
			if best < 0 || rank(r) > rank(routes[best]) {
				best = i
			}
		}
		if best < 0 {
			continue
		}
		if got < 0 {
			t.Fatalf("request %s%s matched nothing; route %+v matches it", host, reqPath, routes[best])
		}
		if !inGroup(routes[got]) || !matches(cleanRoute(routes[got]), nil, p) || !asked(routes[got]) || rank(routes[got]) != rank(routes[best]) {
			t.Fatalf("request %s%s matched %+v; the most specific match is %+v", host, reqPath, routes[got], routes[best])
		}
		return got
	}
	if got >= 0 {
		t.Fatalf("request %s%s matched %+v, which does not match it", host, reqPath, routes[got])
	}
	return got
}

// rank orders routes by path length, Exact, method, header matches and query matches, each
// deciding only where those before it are equal (a route has far fewer than 1000 of each).
func rank(r contract.Route) int {
	return (((2*matchLen(cleanRoute(r))+1-pathRank(r))*2+boolRank(r.Method != ""))*1000+len(r.Headers))*1000 + len(r.Query)
}
