package web

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
)

func TestRouter(t *testing.T) {
	route := func(typ contract.PathType, p, backend string) contract.Route {
		return contract.Route{Path: p, PathType: typ, Backend: contract.Backend{URL: "http://" + backend}}
	}
	exact := func(p, b string) contract.Route { return route(contract.PathExact, p, b) }
	prefix := func(p, b string) contract.Route { return route(contract.PathPrefix, p, b) }

	cases := []struct {
		name   string
		routes []contract.Route
		want   map[string]string // request path → backend host; "" means 404
	}{
		{
			name:   "prefix matches whole elements",
			routes: []contract.Route{prefix("/foo", "foo")},
			want:   map[string]string{"/foo": "foo", "/foo/": "foo", "/foo/bar": "foo", "/foobar": "", "/": "", "/fo": ""},
		},
		{
			name:   "trailing slash on a prefix is ignored",
			routes: []contract.Route{prefix("/foo/", "foo")},
			want:   map[string]string{"/foo": "foo", "/foo/": "foo", "/foo/bar": "foo", "/foobar": ""},
		},
		{
			name:   "root prefix matches everything",
			routes: []contract.Route{prefix("/", "root")},
			want:   map[string]string{"/": "root", "/anything/at/all": "root", "": "root"},
		},
		{
			name:   "exact matches only the path",
			routes: []contract.Route{exact("/metrics", "m")},
			want:   map[string]string{"/metrics": "m", "/metrics/": "", "/metrics/x": "", "/metricsx": "", "/": ""},
		},
		{
			name:   "exact with a trailing slash",
			routes: []contract.Route{exact("/foo/", "f")},
			want:   map[string]string{"/foo/": "f", "/foo": ""},
		},
		{
			name:   "longest prefix wins, whatever the order",
			routes: []contract.Route{prefix("/", "root"), prefix("/a/b", "ab"), prefix("/a", "a")},
			want:   map[string]string{"/a/b/c": "ab", "/a/b": "ab", "/a/bc": "a", "/a": "a", "/ab": "root", "/": "root"},
		},
		{
			name:   "exact beats prefix of the same length",
			routes: []contract.Route{prefix("/api", "prefix"), exact("/api", "exact")},
			want:   map[string]string{"/api": "exact", "/api/": "prefix", "/api/v1": "prefix"},
		},
		{
			name:   "exact beats a prefix written with a trailing slash",
			routes: []contract.Route{prefix("/api/", "prefix"), exact("/api", "exact")},
			want:   map[string]string{"/api": "exact", "/api/x": "prefix"},
		},
		{
			name:   "a longer prefix beats a shorter exact",
			routes: []contract.Route{exact("/a", "exact"), prefix("/a/b", "prefix")},
			want:   map[string]string{"/a": "exact", "/a/b": "prefix", "/a/c": ""},
		},
		{
			name:   "paths are case-sensitive",
			routes: []contract.Route{prefix("/Foo", "foo")},
			want:   map[string]string{"/Foo/x": "foo", "/foo/x": ""},
		},
		{
			name:   "matching uses the path the backend will resolve",
			routes: []contract.Route{prefix("/public", "public"), exact("/admin", "admin")},
			want:   map[string]string{"/public/../admin": "admin", "//public//x": "public", "/public/./x": "public", "/x/../public": "public"},
		},
		{
			name:   "no routes",
			routes: nil,
			want:   map[string]string{"/": ""},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRouter(tc.routes)
			for p, want := range tc.want {
				got := ""
				if rt, ok := r.Match(request("", p)); ok {
					got = rt.Backend.URL[len("http://"):]
				}
				if got != want {
					t.Errorf("Match(%q) = %q, want %q", p, got, want)
				}
			}
		})
	}
}

// Routes with a host serve that host only, before the routes for every host; hosts compare as
// HostOf normalizes them.
func TestRouterHosts(t *testing.T) {
	route := func(host, p, backend string) contract.Route {
		return contract.Route{Host: host, Path: p, PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + backend}}
	}
	r := NewRouter([]contract.Route{
		route("", "/", "any"), route("", "/api/v1", "any-api"),
		route("App.Example.com", "/", "app"), route("app.example.com", "/api", "app-api"),
	})
	for _, tc := range []struct{ hostport, path, want string }{
		{"app.example.com", "/x", "app"},
		{"APP.example.COM:443", "/api/x", "app-api"},
		{"app.example.com.", "/api/v1/x", "app-api"}, // the host's routes come first, however long the others
		{"web.tailnet.test", "/x", "any"},
		{"web.tailnet.test:443", "/api/v1/x", "any-api"},
		{"[fd7a:115c:a1e0::1]:443", "/api", "any"},
		{"", "/", "any"},
	} {
		expectBackend(t, r, tc.hostport, tc.path, tc.want)
	}
	// Only the routes without a host are left for other hosts: none matches here.
	if rt, ok := NewRouter([]contract.Route{route("app.example.com", "/", "app")}).Match(request("other.example.com", "/")); ok {
		t.Errorf("a request for another host matched %+v", rt)
	}
}

// A wildcard host covers one label: its routes come after those of the exact host and before
// those without a host.
func TestRouterWildcardHosts(t *testing.T) {
	route := func(host, p, backend string) contract.Route {
		return contract.Route{Host: host, Path: p, PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + backend}}
	}
	r := NewRouter([]contract.Route{
		route("", "/", "any"),
		route("*.Foo.com", "/", "wild"), route("*.foo.com", "/api", "wild-api"),
		route("exact.foo.com", "/exact", "exact"),
	})
	for _, tc := range []struct{ host, path, want string }{
		{"bar.foo.com", "/", "wild"},
		{"BAR.foo.com.", "/api/x", "wild-api"},
		{"exact.foo.com", "/exact", "exact"},
		{"exact.foo.com", "/other", "wild"}, // the exact host's routes first, then the wildcard's
		{"baz.bar.foo.com", "/", "any"},     // two labels: not covered
		{"foo.com", "/", "any"},             // none: not covered
		{"barfoo.com", "/", "any"},
	} {
		expectBackend(t, r, tc.host, tc.path, tc.want)
	}
}

// A Gateway router's wildcard covers labels at any depth, the longest suffix first.
func TestGatewayRouterWildcardHosts(t *testing.T) {
	route := func(host, p, backend string) contract.Route {
		return contract.Route{Host: host, Path: p, PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + backend}}
	}
	r := NewGatewayRouter([]contract.Route{
		route("", "/", "any"),
		route("*.foo.com", "/", "wild"), route("*.bar.foo.com", "/", "deeper"), route("*.bar.foo.com", "/x", "deeper-x"),
	})
	for _, tc := range []struct{ host, path, want string }{
		{"a.foo.com", "/", "wild"},
		{"a.b.foo.com", "/", "wild"}, // two labels: covered
		{"a.bar.foo.com", "/", "deeper"},
		{"a.b.bar.foo.com", "/x/y", "deeper-x"},
		{"bar.foo.com", "/", "wild"}, // *.bar.foo.com covers no bar.foo.com
		{"foo.com", "/", "any"},
	} {
		expectBackend(t, r, tc.host, tc.path, tc.want)
	}
}

// expectBackend checks that a GET of path on hostport matches the route to http://want ("":
// none).
func expectBackend(t *testing.T, r *Router, hostport, path, want string) {
	t.Helper()
	got := ""
	if rt, ok := r.Match(request(hostport, path)); ok {
		got = rt.Backend.URL[len("http://"):]
	}
	if got != want {
		t.Errorf("Match(%q, %q) = %q, want %q", hostport, path, got, want)
	}
}

// request is a GET of path on hostport, as a server hands it to a handler.
func request(hostport, path string) *http.Request {
	return &http.Request{Method: http.MethodGet, Host: hostport, URL: &url.URL{Path: path}, Header: http.Header{}}
}

// Method, header and query matches narrow a route; among routes of one path the one with a
// method goes first, then the one with more header matches, then more query matches, whatever
// their order in the config; a request matching none of a path's narrowed routes falls through
// to a shorter path.
func TestRouterMatches(t *testing.T) {
	route := func(backend string, edit func(*contract.Route)) contract.Route {
		rt := contract.Route{Path: "/api", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + backend}}
		edit(&rt)
		return rt
	}
	hdr := func(kv ...string) []contract.NameValue {
		var out []contract.NameValue
		for i := 0; i < len(kv); i += 2 {
			out = append(out, contract.NameValue{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	r := NewRouter([]contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://root"}},
		route("plain", func(*contract.Route) {}),
		route("query", func(rt *contract.Route) { rt.Query = hdr("v", "2") }),
		route("one-header", func(rt *contract.Route) { rt.Headers = hdr("X-Env", "canary") }),
		route("two-headers", func(rt *contract.Route) { rt.Headers = hdr("X-Env", "canary", "X-Team", "a") }),
		route("post", func(rt *contract.Route) { rt.Method = http.MethodPost }),
		route("post-header", func(rt *contract.Route) { rt.Method, rt.Headers = http.MethodPost, hdr("X-Env", "canary") }),
		{Path: "/exact", PathType: contract.PathExact, Method: http.MethodDelete, Backend: contract.Backend{URL: "http://delete-only"}},
	})
	for _, tc := range []struct {
		name, method, target string
		header               http.Header
		want                 string
	}{
		{"no narrowing asked", "GET", "/api/x", nil, "plain"},
		{"query", "GET", "/api/x?v=2", nil, "query"},
		{"query, first value", "GET", "/api/x?v=1&v=2", nil, "plain"},
		{"query names are case-sensitive", "GET", "/api/x?V=2", nil, "plain"},
		{"header, name in any case", "GET", "/api/x", http.Header{"X-Env": {"canary"}}, "one-header"},
		{"header value exact", "GET", "/api/x", http.Header{"X-Env": {"Canary"}}, "plain"},
		{"more headers first", "GET", "/api/x?v=2", http.Header{"X-Env": {"canary"}, "X-Team": {"a"}}, "two-headers"},
		{"headers before query", "GET", "/api/x?v=2", http.Header{"X-Env": {"canary"}}, "one-header"},
		{"method first", "POST", "/api/x", http.Header{"X-Env": {"canary"}, "X-Team": {"a"}}, "post-header"},
		{"method alone", "POST", "/api/x?v=2", nil, "post"},
		{"a longer path still wins", "POST", "/api", nil, "post"},
		{"none of the path's routes: a shorter path", "DELETE", "/exact", nil, "delete-only"},
		{"the method does not match: a shorter path", "GET", "/exact", nil, "root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := routedTo(t, r, tc.method, tc.target, tc.header); got != tc.want {
				t.Errorf("%s %s %v: %q, want %q", tc.method, tc.target, tc.header, got, tc.want)
			}
		})
	}
}

// Regular expressions match whole paths and values; a RegularExpression path ranks as a Prefix
// path of its literal prefix, after one of the same length.
func TestRouterRegularExpressions(t *testing.T) {
	re := contract.MatchRegularExpression
	r := NewRouter([]contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://root"}},
		{Path: "/api/v[0-9]+/.*", PathType: contract.PathRegularExpression, Backend: contract.Backend{URL: "http://versioned"}},
		{Path: "/api/v2", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://v2"}},
		{Path: "/api/v", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://v-prefix"}},
		{Path: "/img/[^/]+\\.(png|jpg)", PathType: contract.PathRegularExpression, Backend: contract.Backend{URL: "http://images"}},
		{Path: "/env", PathType: contract.PathPrefix, Headers: []contract.NameValue{{Name: "X-Env", Value: "canary|beta", Type: re}},
			Backend: contract.Backend{URL: "http://env-re"}},
		{Path: "/q", PathType: contract.PathPrefix, Query: []contract.NameValue{{Name: "id", Value: "[0-9]+", Type: re}},
			Backend: contract.Backend{URL: "http://numeric"}},
		{Path: "(", PathType: contract.PathRegularExpression, Backend: contract.Backend{URL: "http://broken"}},
	})
	for _, tc := range []struct {
		target string
		header http.Header
		want   string
	}{
		{"/api/v1/users", nil, "versioned"},
		{"/api/v2/users", nil, "v2"}, // Prefix /api/v2 is longer than the literal /api/v
		{"/api/v/users", nil, "v-prefix"},
		{"/api/vx/users", nil, "root"},
		{"/api/v1", nil, "root"}, // the expression matches whole paths only
		{"/img/cat.png", nil, "images"},
		{"/img/cat.png/x", nil, "root"},
		{"/img/a/cat.png", nil, "root"},
		{"/env", http.Header{"X-Env": {"beta"}}, "env-re"},
		{"/env", http.Header{"X-Env": {"prod", "canary"}}, "env-re"},
		{"/env", http.Header{"X-Env": {"canary-2"}}, "root"},
		{"/q?id=42", nil, "numeric"},
		{"/q?id=4x", nil, "root"},
		{"/q?id=x&id=42", nil, "root"}, // the first value counts
	} {
		if got := routedTo(t, r, http.MethodGet, tc.target, tc.header); got != tc.want {
			t.Errorf("%s %v: %q, want %q", tc.target, tc.header, got, tc.want)
		}
	}
}

// routedTo is the host of the backend r routes a request for web.tailnet.test to ("": none).
func routedTo(t *testing.T, r *Router, method, target string, header http.Header) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	req := request("web.tailnet.test", u.Path)
	req.Method, req.URL.RawQuery = method, u.RawQuery
	if header != nil {
		req.Header = header
	}
	if rt, ok := r.Match(req); ok {
		return rt.Backend.URL[len("http://"):]
	}
	return ""
}
