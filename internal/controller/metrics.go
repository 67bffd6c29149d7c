package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// registerOperatorMetrics registers the operator's metrics with reg. c reads the operator's
// namespace (the cache).
func registerOperatorMetrics(reg prometheus.Registerer, c client.Reader, namespace string, limits acmebudget.Limits) (*kit.OperatorMetrics, error) {
	m := &kit.OperatorMetrics{
		Outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tsingress_operator_reconcile_outcomes_total",
			Help: "Reconcile passes by controller and outcome: each Warning reason a pass reported (standing or new), " +
				kit.OutcomeError + " for a pass that ended on an error, " + kit.OutcomeReconciled + " for a pass with neither.",
		}, []string{"controller", "reason"}),
		Memories: map[string]*kit.EventMemory{},
	}
	if err := reg.Register(m.Outcomes); err != nil {
		return nil, fmt.Errorf("registering the reconcile outcomes counter: %w", err)
	}
	if err := reg.Register(&stateCollector{c: c, namespace: namespace, limits: limits, now: time.Now, m: m}); err != nil {
		return nil, fmt.Errorf("registering the state collector: %w", err)
	}
	return m, nil
}

var (
	descManagedProxies = prometheus.NewDesc("tsingress_operator_managed_proxies",
		"Proxy StatefulSets the operator runs, by the type of object they serve (ingress, svc, proxygroup).", []string{"type"}, nil)
	descDevices = prometheus.NewDesc("tsingress_operator_tailnet_devices",
		"Tailnet devices of the operator's proxies (proxies and ProxyGroup replicas whose state names a device), by type.", []string{"type"}, nil)
	descWarnings = prometheus.NewDesc("tsingress_operator_warnings",
		"Objects on which a Warning stands now, by controller and reason.", []string{"controller", "reason"}, nil)
	descDomainCerts = prometheus.NewDesc("tsingress_operator_acme_new_certificates",
		"New certificates of a registered domain in the CA's window (reservations included), counted against the weekly new-certificates-per-domain limit.", []string{"domain"}, nil)
	descNameCerts = prometheus.NewDesc("tsingress_operator_acme_name_certificates",
		"Certificates of one name in the CA's window, renewals and reservations included, counted against the weekly per-name limit.", []string{"name"}, nil)
	descLimits = prometheus.NewDesc("tsingress_operator_acme_limit",
		"The CA's weekly limits the operator keeps proxies within: new_per_domain and per_name.", []string{"limit"}, nil)
)

// stateCollector reads what the metrics describe at each scrape.
type stateCollector struct {
	c         client.Reader
	namespace string
	limits    acmebudget.Limits
	now       func() time.Time
	m         *kit.OperatorMetrics
}

func (s *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descManagedProxies, descDevices, descWarnings, descDomainCerts, descNameCerts, descLimits} {
		ch <- d
	}
}

func (s *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.collectProxies(ctx, ch)
	s.collectLedger(ctx, ch)
	s.m.Mu.Lock()
	defer s.m.Mu.Unlock()
	for controller, mem := range s.m.Memories {
		for reason, n := range mem.StandingWarnings() {
			ch <- prometheus.MustNewConstMetric(descWarnings, prometheus.GaugeValue, float64(n), controller, reason)
		}
	}
}

func (s *stateCollector) collectProxies(ctx context.Context, ch chan<- prometheus.Metric) {
	managed := client.MatchingLabels{kit.LabelManaged: "true"}
	proxyCount := map[string]int{proxies.ParentTypeIngress: 0, proxies.ParentTypeService: 0, proxies.ParentTypeProxyGroup: 0}
	devices := map[string]int{proxies.ParentTypeIngress: 0, proxies.ParentTypeService: 0, proxies.ParentTypeProxyGroup: 0}
	sts := &appsv1.StatefulSetList{}
	secrets := &corev1.SecretList{}
	// In every namespace the cache holds proxy Pods in: kernel ones may run apart.
	if err := s.c.List(ctx, sts, managed); err != nil {
		log.FromContext(ctx).Error(err, "metrics: listing proxies")
		return
	}
	if err := s.c.List(ctx, secrets, client.InNamespace(s.namespace), managed); err != nil {
		log.FromContext(ctx).Error(err, "metrics: listing proxy state")
		return
	}
	for _, o := range sts.Items {
		proxyCount[o.Labels[kit.LabelParentType]]++
	}
	for _, o := range secrets.Items {
		switch o.Labels[kit.LabelSecretType] {
		case proxies.SecretTypeConfState, proxies.SecretTypeState:
			if len(o.Data[contract.StateDeviceID]) > 0 {
				devices[o.Labels[kit.LabelParentType]]++
			}
		}
	}
	for typ, n := range proxyCount {
		ch <- prometheus.MustNewConstMetric(descManagedProxies, prometheus.GaugeValue, float64(n), typ)
	}
	for typ, n := range devices {
		ch <- prometheus.MustNewConstMetric(descDevices, prometheus.GaugeValue, float64(n), typ)
	}
}

func (s *stateCollector) collectLedger(ctx context.Context, ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descLimits, prometheus.GaugeValue, float64(s.limits.PerDomain), "new_per_domain")
	ch <- prometheus.MustNewConstMetric(descLimits, prometheus.GaugeValue, float64(s.limits.PerName), "per_name")
	segs, err := certs.ListLedgerSegments(ctx, s.c, s.namespace)
	if err != nil {
		return
	}
	parts := map[string][]*acmebudget.Ledger{}
	for _, seg := range segs {
		for key, v := range seg.CM.Data {
			domain, ok := strings.CutSuffix(key, ".json")
			l := &acmebudget.Ledger{}
			if !ok || json.Unmarshal([]byte(v), l) != nil {
				continue
			}
			parts[domain] = append(parts[domain], l)
		}
	}
	now := s.now()
	for domain, ps := range parts {
		n, perName := acmebudget.Union(ps...).Usage(now, s.limits)
		ch <- prometheus.MustNewConstMetric(descDomainCerts, prometheus.GaugeValue, float64(n), domain)
		for name, n := range perName {
			ch <- prometheus.MustNewConstMetric(descNameCerts, prometheus.GaugeValue, float64(n), name)
		}
	}
}
