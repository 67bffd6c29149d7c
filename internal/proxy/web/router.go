// Package web serves a contract.WebService: routing with Kubernetes Ingress semantics, reverse
// proxying to the backends with the tailnet caller's identity, and the HTTPS and HTTP listeners.
package web

import (
	"net"
	"path"
	"slices"
	"strings"

	"github.com/tsingress/tsingress/internal/contract"
)

// Router picks a route for a request as networking.k8s.io/v1 Ingress does. A route with a host
// matches requests for that host only (case-insensitive), one without matches every host; the
// routes of the request's host are tried first, then those without a host. Among them, Exact
// matches the path only; Prefix matches whole path elements, so /foo matches /foo, /foo/ and
// /foo/bar but not /foobar, and "/" matches everything. The longest match wins, and an Exact
// route beats a Prefix route of the same length.
type Router struct {
	hosts map[string][]contract.Route // by lower-case host, most specific first
	any   []contract.Route            // routes without a host, most specific first
}

// NewRouter orders the routes for matching. Routes of equal rank keep their order.
func NewRouter(routes []contract.Route) *Router {
	r := &Router{hosts: map[string][]contract.Route{}}
	for _, rt := range routes {
		if rt.Host == "" {
			r.any = append(r.any, rt)
		} else {
			h := strings.ToLower(rt.Host)
			r.hosts[h] = append(r.hosts[h], rt)
		}
	}
	bySpecificity := func(a, b contract.Route) int {
		if la, lb := matchLen(a), matchLen(b); la != lb {
			return lb - la
		}
		return exactRank(a) - exactRank(b)
	}
	slices.SortStableFunc(r.any, bySpecificity)
	for _, rs := range r.hosts {
		slices.SortStableFunc(rs, bySpecificity)
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

func exactRank(r contract.Route) int {
	if r.PathType == contract.PathExact {
		return 0
	}
	return 1
}

// Match returns the route for a request's host (as HostOf gives it) and path. The path is
// cleaned (dot segments, doubled slashes) for matching only, so that the route chosen is the
// one the backend will resolve the path to; the request itself is forwarded unchanged.
func (r *Router) Match(host, reqPath string) (contract.Route, bool) {
	p := cleanPath(reqPath)
	for _, routes := range [][]contract.Route{r.hosts[host], r.any} {
		for _, rt := range routes {
			if matches(rt, p) {
				return rt, true
			}
		}
	}
	return contract.Route{}, false
}

// HostOf normalizes a Host header or a TLS server name for matching: lower case, without a
// port or a trailing dot.
func HostOf(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
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
