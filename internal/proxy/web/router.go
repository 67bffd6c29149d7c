// Package web serves a contract.WebService: routing with Kubernetes Ingress semantics, reverse
// proxying to the backends with the tailnet caller's identity, and the HTTPS and HTTP listeners.
package web

import (
	"cmp"
	"net"
	"net/http"
	"net/url"
	"path"
	"regexp"
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
// A RegularExpression path must match the whole (cleaned) path; it ranks as a Prefix path of
// its literal prefix would ("/api/v[0-9]+" as "/api/v"), after one of equal length. Header and
// query values may be matched by regular expressions too, each matching the whole value.
//
// A Gateway router (NewGatewayRouter) differs in one point: a wildcard host covers one label or
// more, as a Gateway API hostname does, and the wildcard of the longest suffix is tried first.
type Router struct {
	// deepWildcards: a wildcard covers one label or more, not exactly one.
	deepWildcards bool
	routes        []contract.Route
	clean         []contract.Route // routes with their paths cleaned, as they are matched
	exprs         []routeExprs     // their regular expressions, compiled
	hosts         map[string][]int // route indexes by lower-case host, most specific first
	wild          map[string][]int // by the lower-case suffix of a wildcard host ("example.com")
	any           []int            // routes without a host, most specific first
}

// NewGatewayRouter orders the routes of a Gateway's port for matching (see Router).
func NewGatewayRouter(routes []contract.Route) *Router {
	r := NewRouter(routes)
	r.deepWildcards = true
	return r
}

// NewRouter orders the routes for matching. Routes of equal rank keep their order.
// Routes are validated (contract.Route.Validate): an expression that does not compile matches
// nothing.
func NewRouter(routes []contract.Route) *Router {
	r := &Router{routes: routes, clean: make([]contract.Route, len(routes)), exprs: make([]routeExprs, len(routes)),
		hosts: map[string][]int{}, wild: map[string][]int{}}
	for i, rt := range routes {
		r.clean[i] = cleanRoute(rt)
		r.exprs[i] = compileRoute(rt)
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
			r.matchLen(b)-r.matchLen(a),
			pathRank(ra)-pathRank(rb),
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

// routeExprs are a route's regular expressions, compiled: its path's (nil: not one), and its
// header and query matches' (nil where a match is exact).
type routeExprs struct {
	path *regexp.Regexp
	// literal is the length of the literal every path the expression matches begins with.
	literal        int
	headers, query []*regexp.Regexp
}

// never matches nothing: what an expression that does not compile is replaced by.
var never = regexp.MustCompile(`[^\x00-\x{10FFFF}]`)

func compileRoute(rt contract.Route) routeExprs {
	compile := func(expr string) *regexp.Regexp {
		re, err := contract.CompileMatch(expr)
		if err != nil {
			return never
		}
		return re
	}
	var e routeExprs
	if rt.PathType == contract.PathRegularExpression {
		e.path = compile(rt.Path)
		if unanchored, err := regexp.Compile(rt.Path); err == nil { // CompileMatch's anchor hides it
			prefix, _ := unanchored.LiteralPrefix()
			e.literal = len(prefix)
		}
	}
	for _, m := range []struct {
		nvs []contract.NameValue
		to  *[]*regexp.Regexp
	}{{rt.Headers, &e.headers}, {rt.Query, &e.query}} {
		if !slices.ContainsFunc(m.nvs, func(nv contract.NameValue) bool { return nv.Type != "" }) {
			continue
		}
		*m.to = make([]*regexp.Regexp, len(m.nvs))
		for j, nv := range m.nvs {
			if nv.Type != "" {
				(*m.to)[j] = compile(nv.Value)
			}
		}
	}
	return e
}

// matchLen is the length route i is ranked by: a RegularExpression's is its literal prefix's.
func (r *Router) matchLen(i int) int {
	if e := r.exprs[i]; e.path != nil {
		return e.literal
	}
	return matchLen(r.clean[i])
}

// matchLen is the length an Exact or Prefix route is ranked by: a Prefix route's trailing slash
// does not count, since /foo/ and /foo match the same paths.
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

// pathRank orders routes of equal match length: Exact, then Prefix, then RegularExpression.
func pathRank(r contract.Route) int {
	switch r.PathType {
	case contract.PathExact:
		return 0
	case contract.PathPrefix:
		return 1
	}
	return 2
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
	var query url.Values // parsed once, if a route asks
	for _, routes := range slices.Concat([][]int{r.hosts[host]}, r.wildcardsOf(host), [][]int{r.any}) {
		for _, i := range routes {
			rt, e := &r.clean[i], &r.exprs[i]
			if !matches(*rt, e.path, p) || (rt.Method != "" && rt.Method != req.Method) || !headersMatch(rt.Headers, e.headers, req.Header) {
				continue
			}
			if len(rt.Query) > 0 && query == nil {
				query = req.URL.Query()
			}
			if queryMatches(rt.Query, e.query, query) {
				return i
			}
		}
	}
	return -1
}

// wildcardsOf lists the routes of the wildcards covering host, the longest suffix first.
func (r *Router) wildcardsOf(host string) [][]int {
	var out [][]int
	for rest := host; ; {
		_, parent, ok := strings.Cut(rest, ".")
		if !ok {
			return out
		}
		if routes := r.wild[parent]; len(routes) > 0 {
			out = append(out, routes)
		}
		if !r.deepWildcards {
			return out
		}
		rest = parent
	}
}

// headersMatch reports whether the request has each header with exactly the value asked, or
// one its expression (exprs[i], when there are any) matches; of a header sent several times,
// any value may match.
func headersMatch(want []contract.NameValue, exprs []*regexp.Regexp, h http.Header) bool {
	for i, m := range want {
		if !slices.ContainsFunc(h.Values(m.Name), func(v string) bool { return valueMatches(m, exprs, i, v) }) {
			return false
		}
	}
	return true
}

// queryMatches reports whether the query has each parameter asked, its first value the value
// asked or one its expression matches.
func queryMatches(want []contract.NameValue, exprs []*regexp.Regexp, q url.Values) bool {
	for i, m := range want {
		if vs, ok := q[m.Name]; !ok || !valueMatches(m, exprs, i, vs[0]) {
			return false
		}
	}
	return true
}

// valueMatches compares a value with match i of a route: by its expression where it has one.
func valueMatches(m contract.NameValue, exprs []*regexp.Regexp, i int, v string) bool {
	if exprs != nil && exprs[i] != nil {
		return exprs[i].MatchString(v)
	}
	return v == m.Value
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

func matches(rt contract.Route, expr *regexp.Regexp, p string) bool {
	switch rt.PathType {
	case contract.PathExact:
		return p == rt.Path
	case contract.PathRegularExpression:
		return expr.MatchString(p)
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
	if r.PathType != contract.PathRegularExpression {
		r.Path = cleanPath(r.Path)
	}
	return r
}
