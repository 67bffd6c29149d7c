package proxy

import (
	"bytes"
	"context"
	"crypto/x509"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"tailscale.com/client/local"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/web"
)

// Config documents whose applications the metrics count.
const (
	docProxyConfig = "proxy-config"
	docServeConfig = "serve-config"
	docDNATConfig  = "dnat-config"
)

// proxyMetrics are a proxy's Prometheus metrics, served at /metrics on the health address while
// the config enables them (a ProxyClass's metrics.enable). Each proxy process has its own
// registry; the tailnet client's user metrics are gathered from it at each scrape.
type proxyMetrics struct {
	reg     *prometheus.Registry
	enabled atomic.Bool
	tailnet atomic.Pointer[local.Client]

	web              *web.Metrics
	certExpiry       *prometheus.GaugeVec
	issuanceAttempts *prometheus.CounterVec
	issuanceFailures *prometheus.CounterVec
	advertised       *prometheus.GaugeVec
	dnatMappings     *prometheus.GaugeVec
	dnatErrors       prometheus.Gauge
	configGeneration *prometheus.GaugeVec
	configApplied    *prometheus.GaugeVec
	configErrors     *prometheus.CounterVec
}

func newProxyMetrics() *proxyMetrics {
	reg := prometheus.NewRegistry()
	m := &proxyMetrics{
		reg: reg,
		web: web.NewMetrics(reg),
		certExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tsingress_proxy_certificate_expiry_timestamp_seconds",
			Help: "When the certificate served for a name expires (Unix time), by name and source (acme or secret).",
		}, []string{"name", "source"}),
		issuanceAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tsingress_proxy_certificate_issuance_attempts_total",
			Help: "Attempts to obtain the certificate of a tailnet name through the tailnet's ACME flow (which may answer from its cache), by name.",
		}, []string{"name"}),
		issuanceFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tsingress_proxy_certificate_issuance_failures_total",
			Help: "Attempts to obtain a certificate that failed (the CA or the control plane refused, or could not be reached), by name.",
		}, []string{"name"}),
		advertised: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tsingress_proxy_service_advertised",
			Help: "1 for each Tailscale Service this ProxyGroup replica advertises now.",
		}, []string{"service"}),
		dnatMappings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tsingress_proxy_dnat_mappings",
			Help: "DNAT mappings whose kernel rules are installed, by address family (ipv4, ipv6).",
		}, []string{"family"}),
		dnatErrors: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tsingress_proxy_dnat_mapping_errors",
			Help: "DNAT mappings asked for that are not installed, wholly or for one family.",
		}),
		configGeneration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tsingress_proxy_config_generation",
			Help: "How many versions of a config document (proxy-config, serve-config, dnat-config) this proxy has applied since it started.",
		}, []string{"document"}),
		configApplied: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tsingress_proxy_config_last_applied_timestamp_seconds",
			Help: "When a config document was last applied (Unix time), by document.",
		}, []string{"document"}),
		configErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tsingress_proxy_config_errors_total",
			Help: "Changed config documents that could not be read and were not applied (the last good one stays in force), by document.",
		}, []string{"document"}),
	}
	reg.MustRegister(m.certExpiry, m.issuanceAttempts, m.issuanceFailures, m.advertised, m.dnatMappings, m.dnatErrors,
		m.configGeneration, m.configApplied, m.configErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// handler serves the metrics while they are enabled, and 404 otherwise.
func (m *proxyMetrics) handler() http.Handler {
	h := promhttp.HandlerFor(prometheus.Gatherers{m.reg, tailnetGatherer{m}}, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.enabled.Load() {
			http.Error(w, "metrics are not enabled: set metrics.enable in the proxy's ProxyClass", http.StatusNotFound)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// setTailnet adds the tailnet client's user metrics to what is served.
func (m *proxyMetrics) setTailnet(lc *local.Client) { m.tailnet.Store(lc) }

// tailnetGatherer gathers the tailnet client's user metrics (tailscaled_*) at each scrape.
type tailnetGatherer struct{ m *proxyMetrics }

func (g tailnetGatherer) Gather() ([]*dto.MetricFamily, error) {
	lc := g.m.tailnet.Load()
	if lc == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	text, err := lc.UserMetrics(ctx)
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(families))
	for _, f := range families {
		out = append(out, f)
	}
	return out, nil
}

// applied records a config document applied; the proxy config also turns the metrics on or off.
func (m *proxyMetrics) applied(doc string) {
	m.configGeneration.WithLabelValues(doc).Inc()
	m.configApplied.WithLabelValues(doc).SetToCurrentTime()
}

func (m *proxyMetrics) rejected(doc string) { m.configErrors.WithLabelValues(doc).Inc() }

// observe sets the gauges that follow the proxy's state: certificates, advertisements and DNAT.
func (m *proxyMetrics) observe(st *contract.ProxyState) {
	m.certExpiry.Reset()
	for name, c := range st.Certificates {
		if c.Serial != "" && !c.NotAfter.IsZero() {
			m.certExpiry.WithLabelValues(name, c.Source).Set(float64(c.NotAfter.Unix()))
		}
	}
	m.advertised.Reset()
	for _, s := range st.Advertised {
		m.advertised.WithLabelValues(s).Set(1)
	}
	installed := map[string]int{contract.FamilyIPv4: 0, contract.FamilyIPv6: 0}
	failed := 0
	if fs := st.Firewall; fs != nil {
		for _, mp := range fs.Mappings {
			if mp.Error != "" {
				failed++
			}
			fams := map[string]bool{}
			for _, s := range mp.TailnetIPs {
				if ip, err := netip.ParseAddr(s); err == nil {
					fams[family(ip)] = true
				}
			}
			for f := range fams {
				installed[f]++
			}
		}
	}
	for f, n := range installed {
		m.dnatMappings.WithLabelValues(f).Set(float64(n))
	}
	m.dnatErrors.Set(float64(failed))
}

func family(ip netip.Addr) string {
	if ip.Is4() {
		return contract.FamilyIPv4
	}
	return contract.FamilyIPv6
}

// observingReporter sets the metrics from every state written.
type observingReporter struct {
	reporter
	m *proxyMetrics
}

func (o observingReporter) Report(ctx context.Context, data map[string][]byte) error {
	if st, err := contract.ParseState(data); err == nil {
		o.m.observe(st)
	}
	return o.reporter.Report(ctx, data)
}

// countingFlow counts a flow's attempts at certificates and their failures.
type countingFlow struct {
	acmeFlow
	m *proxyMetrics
}

func (f countingFlow) obtain(ctx context.Context, name string, renew *x509.Certificate) ([]byte, []byte, error) {
	f.m.issuanceAttempts.WithLabelValues(name).Inc()
	c, k, err := f.acmeFlow.obtain(ctx, name, renew)
	if err != nil && ctx.Err() == nil { // not an attempt ended by a hold or a shutdown
		f.m.issuanceFailures.WithLabelValues(name).Inc()
	}
	return c, k, err
}

// countingSource counts the proxy config's updates as they reach the proxy, and follows its
// metrics switch. An update the proxy cannot apply in place makes it exit, so every other one
// is applied.
type countingSource struct {
	configSource
	m *proxyMetrics
}

func (s countingSource) load(ctx context.Context) (*contract.ProxyConfig, int, error) {
	cfg, v, err := s.configSource.load(ctx)
	if err == nil {
		s.m.enabled.Store(cfg.Metrics)
		s.m.applied(docProxyConfig)
	}
	return cfg, v, err
}

func (s countingSource) watch(ctx context.Context, last configUpdate, updates chan<- configUpdate) {
	counted := make(chan configUpdate)
	go func() {
		for {
			select {
			case u := <-counted:
				if u.err != nil {
					s.m.rejected(docProxyConfig)
				} else {
					s.m.enabled.Store(u.cfg.Metrics)
					s.m.applied(docProxyConfig)
				}
				select {
				case updates <- u:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	s.configSource.watch(ctx, last, counted)
}
