// Package web serves a contract.WebService: routing with Kubernetes Ingress semantics, reverse
// proxying to the backends with the tailnet caller's identity, and the HTTPS and HTTP listeners.
package web

import (
	"path"
	"slices"
	"strings"

	"github.com/tsingress/tsingress/internal/contract"
)

// Router picks a route for a request path as networking.k8s.io/v1 Ingress does: Exact matches
// the path only; Prefix matches whole path elements, so /foo matches /foo, /foo/ and /foo/bar
// but not /foobar, and "/" matches everything. The longest match wins, and an Exact route
// beats a Prefix route of the same length.
type Router struct {
	routes []contract.Route // most specific first
}

// NewRouter orders the routes for matching. Routes of equal rank keep their order.
func NewRouter(routes []contract.Route) *Router {
	r := &Router{routes: slices.Clone(routes)}
	slices.SortStableFunc(r.routes, func(a, b contract.Route) int {
		if la, lb := matchLen(a), matchLen(b); la != lb {
			return lb - la
		}
		return exactRank(a) - exactRank(b)
	})
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

// Match returns the route for a request path. The path is cleaned (dot segments, doubled
// slashes) for matching only, so that the route chosen is the one the backend will resolve
// the path to; the request itself is forwarded unchanged.
func (r *Router) Match(reqPath string) (contract.Route, bool) {
	p := cleanPath(reqPath)
	for _, rt := range r.routes {
		if matches(rt, p) {
			return rt, true
		}
	}
	return contract.Route{}, false
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
