package web

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"time"
)

// Mirrored requests are sent off the request's path: each within mirrorTimeout, at most
// maxMirrorsInFlight at once per web service (one more is dropped rather than queued, so that a
// slow mirror never holds up the route), and only with a body of at most maxMirrorBody bytes,
// which the route's backend then gets from memory.
const (
	mirrorTimeout      = 30 * time.Second
	maxMirrorsInFlight = 64
	maxMirrorBody      = 1 << 20
)

// mirror is a route's mirror: the proxy to its server and its share of the route's requests.
type mirror struct {
	to                     http.Handler
	numerator, denominator int
}

// mirrors sends a copy of r to each of ms that draws it, and returns r to serve: its body, if it
// had one, read into memory for the copies (unless larger than maxMirrorBody: then no copy is
// sent and the request goes on as it came).
func (h *handler) mirrors(r *http.Request, ms []mirror) *http.Request {
	var chosen []mirror
	for _, m := range ms {
		if rand.IntN(m.denominator) < m.numerator {
			chosen = append(chosen, m)
		}
	}
	if len(chosen) == 0 {
		return r
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		buf, err := io.ReadAll(io.LimitReader(r.Body, maxMirrorBody+1))
		if err != nil || len(buf) > maxMirrorBody {
			r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
			h.log.Debug("request not mirrored: its body is larger than the mirrors take, or failed", "bytes", len(buf), "error", err)
			return r
		}
		body = buf
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	for _, m := range chosen {
		select {
		case h.mirroring <- struct{}{}:
		default:
			h.log.Debug("request not mirrored: too many mirrored requests in flight", "inFlight", maxMirrorsInFlight)
			continue
		}
		// Detached from the client: a mirror's answer is never waited for, nor cut by it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), mirrorTimeout)
		c := r.Clone(ctx)
		c.Body = http.NoBody
		if body != nil {
			c.Body = io.NopCloser(bytes.NewReader(body))
		}
		go func() {
			defer func() { <-h.mirroring }()
			defer cancel()
			m.to.ServeHTTP(discard{header: http.Header{}}, c)
		}()
	}
	return r
}

// readCloser reads from one reader and closes another: a body partly read into memory.
type readCloser struct {
	io.Reader
	io.Closer
}

// discard is the response writer of a mirrored request: its response is dropped.
type discard struct{ header http.Header }

func (d discard) Header() http.Header         { return d.header }
func (d discard) Write(b []byte) (int, error) { return len(b), nil }
func (d discard) WriteHeader(int)             {}
