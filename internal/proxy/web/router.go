// Package web serves a contract.WebService: routing with Kubernetes Ingress semantics, reverse
// proxying to the backends with the tailnet caller's identity, and the HTTPS and HTTP listeners.
package web

import (
	"cmp"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/tsingress/tsingress/internal/contract"
)

// Router picks a route for a request as networking.k8s.io/v1 Ingress does. A route with a host
// matches requests for that host only (case-insensitive); a wildcard host, "*.example.com",
// matches one label in place of the "*" (a.example.com, not example.com or a.b.example.com);
// a route without a host matches every host. The routes of the request's host are tried first,
// then those of the wildcard covering it, then those without a host. Among them, Exact matches
// the path only; Prefix matches whole path elements, so /foo matches /foo, /foo/ and /foo/bar
// but not /foobar, and "/" matches everything. The longest match wins, and an Exact route beats
// a Prefix route of the same length. Route paths are cleaned as request paths are, for
// matching only. A route may also ask for a method, headers and query parameters (an HTTPRoute's
// matches); among routes of equal paths, one with a method goes first, then the one with more
// header matches, then with more query matches, as the Gateway API's precedence orders them.
type Router struct {
	routes []contract.Route
	clean  []contract.Route // routes with their paths cleaned, as they are matched
	hosts  map[string][]int // route indexes by lower-case host, most specific first
	wild   map[string][]int // by the lower-case suffix of a wildcard host ("example.com")
	any    []int            // routes without a host, most specific first
}

// NewRouter orders the routes for matching. Routes of equal rank keep their order.
func NewRouter(routes []contract.Route) *Router {
	r := &Router{routes: routes, clean: make([]contract.Route, len(routes)), hosts: map[string][]int{}, wild: map[string][]int{}}
	for i, rt := range routes {
		r.clean[i] = cleanRoute(rt)
		h := strings.ToLower(rt.Host)
		switch {
		case h == "":
			r.any = append(r.any, i)
		case contract.IsWildcard(h):
			r.wild[h[2:]] = append(r.wild[h[2:]], i)
		default:
			r.hosts[h] = append(r.hosts[h], i)
		}
	}
	bySpecificity := func(a, b int) int {
		ra, rb := r.clean[a], r.clean[b]
		return cmp.Or(
			matchLen(rb)-matchLen(ra),
			exactRank(ra)-exactRank(rb),
			boolRank(rb.Method != "")-boolRank(ra.Method != ""),
			len(rb.Headers)-len(ra.Headers),
			len(rb.Query)-len(ra.Query))
	}
	slices.SortStableFunc(r.any, bySpecificity)
	for _, m := range []map[string][]int{r.hosts, r.wild} {
		for _, rs := range m {
			slices.SortStableFunc(rs, bySpecificity)
		}
	}
	return r
}

// matchLen is the length a route is ranked by: a Prefix route's trailing slash does not count,
// since /foo/ and /foo match the same paths.
func matchLen(r contract.Route) int {
	if r.PathType == contract.PathPrefix {
		return len(strings.TrimSuffix(r.Path, "/"))
	}
	return len(r.Path)
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

func exactRank(r contract.Route) int {
	if r.PathType == contract.PathExact {
		return 0
	}
	return 1
}

// Match returns the route for a request: its host (Host, else the TLS server name, as HostOf
// normalizes it), path, method, headers and query. The path is cleaned (dot segments, doubled
// slashes) for matching only, so that the route chosen is the one the backend will resolve the
// path to; the request itself is forwarded unchanged.
func (r *Router) Match(req *http.Request) (contract.Route, bool) {
	i := r.match(req)
	if i < 0 {
		return contract.Route{}, false
	}
	return r.routes[i], true
}

// match returns the index of the matching route, or -1.
func (r *Router) match(req *http.Request) int {
	hostport := req.Host
	if hostport == "" && req.TLS != nil { // HTTP/1.0 sends no Host
		hostport = req.TLS.ServerName
	}
	host := HostOf(hostport)
	p := cleanPath(req.URL.Path)
	var wild []int
	if _, parent, ok := strings.Cut(host, "."); ok {
		wild = r.wild[parent]
	}
	var query url.Values // parsed once, if a route asks
	for _, routes := range [][]int{r.hosts[host], wild, r.any} {
		for _, i := range routes {
			rt := &r.clean[i]
			if !matches(*rt, p) || (rt.Method != "" && rt.Method != req.Method) || !headersMatch(rt.Headers, req.Header) {
				continue
			}
			if len(rt.Query) > 0 && query == nil {
				query = req.URL.Query()
			}
			if queryMatches(rt.Query, query) {
				return i
			}
		}
	}
	return -1
}

// headersMatch reports whether the request has each header with exactly the value asked; of a
// header sent several times, any value may match.
func headersMatch(want []contract.NameValue, h http.Header) bool {
	for _, m := range want {
		if !slices.Contains(h.Values(m.Name), m.Value) {
			return false
		}
	}
	return true
}

// queryMatches reports whether the query has each parameter asked, its first value exactly the
// value asked.
func queryMatches(want []contract.NameValue, q url.Values) bool {
	for _, m := range want {
		if vs, ok := q[m.Name]; !ok || vs[0] != m.Value {
			return false
		}
	}
	return true
}

// HostOf normalizes a Host header or a TLS server name for matching: lower case, without a
// port, the brackets of an IPv6 literal or a trailing dot.
func HostOf(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

func matches(rt contract.Route, p string) bool {
	if rt.PathType == contract.PathExact {
		return p == rt.Path
	}
	prefix := strings.TrimSuffix(rt.Path, "/")
	return prefix == "" || p == prefix || strings.HasPrefix(p, prefix+"/")
}

// cleanPath is path.Clean that keeps a trailing slash, as the trailing slash is significant
// to Exact routes.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

// cleanRoute is a route as it is matched: its path cleaned as request paths are, so that a
// path written with doubled slashes or dot segments (ImplementationSpecific paths may have
// them) matches the requests for it instead of none.
func cleanRoute(r contract.Route) contract.Route {
	r.Path = cleanPath(r.Path)
	return r
}
