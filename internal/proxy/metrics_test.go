package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// scrape reads the proxy's /metrics: its status, and the families when it serves them.
func scrape(t *testing.T, health string) (int, map[string]*dto.MetricFamily) {
	t.Helper()
	res, err := http.Get(health + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, res.Body) // drained for the connection's reuse; the status is the answer
		return res.StatusCode, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, families
}

// value is the value of the metric of a family whose labels include want; -1 when none has.
func value(families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := families[name]
	if f == nil {
		return -1
	}
metrics:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue metrics
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// The proxy serves /metrics on its health address only while its config enables them, turned
// on without a restart: its requests by Ingress, route and code, latency, certificate expiry and
// issuance, config generations, and the tailnet client's own metrics, all named as Prometheus's
// lint wants.
func TestMetrics(t *testing.T) {
	w := newWorld(t)
	dir, stateDir := t.TempDir(), t.TempDir()
	ws := contract.WebService{Routes: w.routes(), Ingress: "shop/store"}
	proxytest.WriteConfig(t, dir, w.config(w.mintKey(t).Secret.Reveal(), ws))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	health, done := w.startFromDir(t, ctx, dir, stateDir)
	if code, _ := scrape(t, health); code != http.StatusNotFound {
		t.Fatalf("/metrics answers %d while the config does not enable them; want 404", code)
	}

	cfg := w.config("", ws)
	cfg.Metrics = true
	proxytest.WriteConfig(t, dir, cfg)
	eventually(t, "metrics enabled", func() bool { code, _ := scrape(t, health); return code == http.StatusOK })
	base := "https://web.tailnet.test"
	for range 2 {
		if r := w.get(t, base+"/api/x", nil); r.body != "b /api/x" {
			t.Fatalf("/api/x: %q", r.body)
		}
	}
	w.get(t, base+"/", nil)

	_, families := scrape(t, health)
	for _, c := range []struct {
		name   string
		labels map[string]string
		check  func(float64) bool
		want   string
	}{
		{"tsingress_proxy_http_requests_total", map[string]string{"ingress": "shop/store", "route": "/api", "code": "200"}, func(v float64) bool { return v == 2 }, "2"},
		{"tsingress_proxy_http_requests_total", map[string]string{"ingress": "shop/store", "route": "/", "code": "200"}, func(v float64) bool { return v == 1 }, "1"},
		{"tsingress_proxy_http_request_duration_seconds", map[string]string{"ingress": "shop/store", "route": "/api"}, func(v float64) bool { return v == 2 }, "2 observations"},
		{"tsingress_proxy_certificate_expiry_timestamp_seconds", map[string]string{"name": "web.tailnet.test", "source": "acme"},
			func(v float64) bool { return v > float64(time.Now().Unix()) }, "a time in the future"},
		{"tsingress_proxy_certificate_issuance_attempts_total", map[string]string{"name": "web.tailnet.test"}, func(v float64) bool { return v >= 1 }, "at least 1"},
		{"tsingress_proxy_config_generation", map[string]string{"document": "proxy-config"}, func(v float64) bool { return v == 2 }, "2 (the first config and the one enabling metrics)"},
		{"tsingress_proxy_config_last_applied_timestamp_seconds", map[string]string{"document": "proxy-config"}, func(v float64) bool { return v > 0 }, "set"},
		{"tailscaled_inbound_packets_total", nil, func(v float64) bool { return v > 0 }, "the tailnet client's own packets"},
		{"go_goroutines", nil, func(v float64) bool { return v > 0 }, "the Go runtime's"},
	} {
		if v := value(families, c.name, c.labels); !c.check(v) {
			t.Errorf("%s%v = %v, want %s", c.name, c.labels, v, c.want)
		}
	}
	var ours []*dto.MetricFamily
	for name, f := range families {
		if strings.HasPrefix(name, "tsingress_") {
			ours = append(ours, f)
		}
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	cfg.Metrics = false
	proxytest.WriteConfig(t, dir, cfg)
	eventually(t, "metrics disabled", func() bool { code, _ := scrape(t, health); return code == http.StatusNotFound })
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Errorf("Run: %v", err)
	}
}
