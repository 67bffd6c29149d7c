package web

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tsingress/tsingress/internal/contract"
)

// Metrics count the requests of every Server of a proxy. Their labels are bounded by the
// config: the Ingress, the route (its host and path as configured, "" when none matched) and
// the status code.
type Metrics struct {
	requests       *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	upstreamErrors *prometheus.CounterVec
}

// NewMetrics registers the request metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tsingress_proxy_http_requests_total",
			Help: "HTTP requests served, by Ingress (namespace/name), route (host and path as configured; empty when none matched) and status code.",
		}, []string{"ingress", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tsingress_proxy_http_request_duration_seconds",
			Help:    "Time from a request's headers to the end of its response, by Ingress and route.",
			Buckets: prometheus.DefBuckets,
		}, []string{"ingress", "route"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tsingress_proxy_upstream_errors_total",
			Help: "Requests whose backend could not be reached or failed before answering (answered 502), by Ingress and route.",
		}, []string{"ingress", "route"}),
	}
	reg.MustRegister(m.requests, m.duration, m.upstreamErrors)
	return m
}

// RouteLabel is a route's value of the route label: its host (if any) and path.
func RouteLabel(r contract.Route) string { return r.Host + r.Path }

// requestInfo is what the handlers learn about a request that its metrics need.
type requestInfo struct {
	route         string
	upstreamError bool
}

type requestInfoKey struct{}

func infoOf(ctx context.Context) *requestInfo {
	info, _ := ctx.Value(requestInfoKey{}).(*requestInfo)
	return info
}

// instrument serves r with serve and counts it under ingress.
func (m *Metrics) instrument(ingress string, w http.ResponseWriter, r *http.Request, serve http.HandlerFunc) {
	if m == nil {
		serve(w, r)
		return
	}
	info := &requestInfo{}
	rec := &statusRecorder{ResponseWriter: w}
	start := time.Now()
	serve(rec, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
	code := rec.code
	switch {
	case code == 0 && r.Header.Get("Upgrade") != "":
		code = http.StatusSwitchingProtocols // written on the hijacked connection
	case code == 0: // nothing written: net/http answers 200
		code = http.StatusOK
	}
	m.requests.WithLabelValues(ingress, info.route, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(ingress, info.route).Observe(time.Since(start).Seconds())
	if info.upstreamError {
		m.upstreamErrors.WithLabelValues(ingress, info.route).Inc()
	}
}

// statusRecorder notes a response's final status code. Unwrap lets http.ResponseController
// (which the reverse proxy uses to flush and to hijack upgraded connections) reach the
// connection's writer.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	// Informational answers (100, 103) come before the final one; 101 is final.
	if s.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
