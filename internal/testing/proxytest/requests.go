package proxytest

import (
	"cmp"
	"net/http"
	"net/url"

	"github.com/tsingress/tsingress/internal/contract"
)

// RequestFor is a request for host that a route asks for: its path, method (GET if it names
// none), headers and query parameters, as a server hands it to a handler.
func RequestFor(host string, r contract.Route) *http.Request {
	req := &http.Request{Method: cmp.Or(r.Method, http.MethodGet), Host: host, URL: &url.URL{Path: r.Path}, Header: http.Header{}}
	for _, h := range r.Headers {
		req.Header.Add(h.Name, h.Value)
	}
	q := url.Values{}
	for _, p := range r.Query {
		q.Add(p.Name, p.Value)
	}
	req.URL.RawQuery = q.Encode()
	return req
}
