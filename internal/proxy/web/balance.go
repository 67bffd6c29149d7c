package web

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tsingress/tsingress/internal/proxy/backoff"
)

// Passive health of endpoints: one that refuses a connection is skipped for a while, longer
// each time it refuses again, and tried again after that.
const (
	endpointBackoffMin = 2 * time.Second
	endpointBackoffMax = 30 * time.Second
	// maxEndpointTries bounds the endpoints one request tries before the ClusterIP.
	maxEndpointTries = 3
)

// endpointHealth remembers the endpoints that refused connections. It outlives config reloads,
// which endpoint churn makes frequent.
type endpointHealth struct {
	mu    sync.Mutex
	down  map[string]*backoff.Backoff // by "ip:port"
	nDown atomic.Int32                // len(down), read without the lock on every request
}

func newEndpointHealth() *endpointHealth { return &endpointHealth{down: map[string]*backoff.Backoff{}} }

func (h *endpointHealth) usable(addr string, now time.Time) bool {
	if h.nDown.Load() == 0 {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d, ok := h.down[addr]
	return !ok || d.Due(now)
}

// refused marks addr down and returns for how long. Endpoints long past their time are
// forgotten: endpoints come and go with every rollout, and most are never tried again.
func (h *endpointHealth) refused(addr string, now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	for a, d := range h.down {
		if now.After(d.Next().Add(endpointBackoffMax)) {
			delete(h.down, a)
		}
	}
	d := h.down[addr]
	if d == nil {
		d = &backoff.Backoff{Min: endpointBackoffMin, Max: endpointBackoffMax}
		h.down[addr] = d
	}
	h.nDown.Store(int32(len(h.down)))
	return d.Fail(now)
}

func (h *endpointHealth) succeeded(addr string) {
	if h.nDown.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.down, addr)
	h.nDown.Store(int32(len(h.down)))
}

// balancer sends each request to the next of a Service's ready endpoints, round robin, so that
// requests rather than connections are spread (kube-proxy balances connections, and a proxy
// keeps its connections alive). An endpoint that refuses the connection is skipped and the
// request goes to the next one: nothing was sent, so any request may be retried. When no
// endpoint is usable the request goes to the ClusterIP, in case the endpoints the proxy knows
// are stale.
type balancer struct {
	transport http.RoundTripper
	endpoints []string // "ip:port"
	clusterIP string   // host:port of the backend URL
	health    *endpointHealth
	next      atomic.Uint64
	log       *slog.Logger
}

func (b *balancer) RoundTrip(req *http.Request) (*http.Response, error) {
	body := &unsentBody{ReadCloser: req.Body}
	var err error
	for _, addr := range b.attempts(time.Now()) {
		var resp *http.Response
		resp, err = b.transport.RoundTrip(withAddr(req, addr, body))
		if err == nil {
			if addr != b.clusterIP {
				b.health.succeeded(addr)
			}
			return resp, nil
		}
		if req.Context().Err() != nil || !connectFailed(err) || body.read.Load() {
			return nil, err
		}
		if addr != b.clusterIP {
			d := b.health.refused(addr, time.Now())
			b.log.Info("backend endpoint refused; skipping it", "endpoint", addr, "for", d, "err", err)
		}
	}
	return nil, err
}

// attempts lists where one request may go, in order: up to maxEndpointTries usable endpoints,
// from the next in turn, then the ClusterIP.
func (b *balancer) attempts(now time.Time) []string {
	out := make([]string, 0, maxEndpointTries+1)
	n := uint64(len(b.endpoints))
	start := b.next.Add(1) - 1
	for i := uint64(0); i < n && len(out) < maxEndpointTries; i++ {
		if addr := b.endpoints[(start+i)%n]; b.health.usable(addr, now) {
			out = append(out, addr)
		}
	}
	return append(out, b.clusterIP)
}

// withAddr is req sent to addr; the Host header stays as it is.
func withAddr(req *http.Request, addr string, body *unsentBody) *http.Request {
	out := new(http.Request)
	*out = *req
	u := *req.URL
	u.Host = addr
	out.URL = &u
	if req.Body != nil {
		out.Body = body
		// Lets the transport send the request again when the kept-alive connection it chose
		// turns out closed before any of the request was written.
		out.GetBody = func() (io.ReadCloser, error) {
			if body.read.Load() {
				return nil, errBodySent
			}
			return body, nil
		}
	}
	return out
}

var errBodySent = errors.New("the request body was already sent")

// connectFailed reports whether err is a failure to connect, before any of the request was
// sent.
func connectFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// unsentBody lets a request whose connection failed be sent again. The transport closes the
// body of a request that failed, so Close is left to the server, which closes the incoming body
// once the handler returns; read says whether any of it is gone.
type unsentBody struct {
	io.ReadCloser
	read atomic.Bool
}

func (b *unsentBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.ReadCloser.Read(p)
}

func (b *unsentBody) Close() error { return nil }
