package controller

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientevents "k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/controller/proxyclass"
)

// emptyReader answers every read with nothing, for metrics that need no cluster.
type emptyReader struct{ client.Reader }

func (emptyReader) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
}

func (emptyReader) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// A pass counts once per Warning reason it reported, standing or new; a pass without any as
// Reconciled, one that ended on an error as ReconcileError. Objects on which a Warning stands
// are a gauge per reason. The names pass Prometheus's lint.
func TestReconcileOutcomes(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := registerOperatorMetrics(reg, emptyReader{}, "tailscale", acmebudget.LetsEncrypt)
	if err != nil {
		t.Fatal(err)
	}
	r := m.Reporter(clientevents.NewFakeRecorder(100), "ingress")
	web := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "1"}}
	api := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "api", UID: "2"}}
	r.Warning(web, kit.ReasonInvalidAnnotation, "bad")
	r.Warning(web, kit.ReasonInvalidAnnotation, "worse")
	r.Warning(web, kit.ReasonTLSSecretNotFound, "missing")
	r.Settle(web, true)
	r.Warning(web, kit.ReasonInvalidAnnotation, "bad") // standing: emitted once, counted again
	r.Settle(web, true)
	r.Settle(api, true)
	r.Settle(api, false)

	want := `
# HELP tsingress_operator_reconcile_outcomes_total Reconcile passes by controller and outcome: each Warning reason a pass reported (standing or new), ReconcileError for a pass that ended on an error, Reconciled for a pass with neither.
# TYPE tsingress_operator_reconcile_outcomes_total counter
tsingress_operator_reconcile_outcomes_total{controller="ingress",reason="InvalidAnnotation"} 2
tsingress_operator_reconcile_outcomes_total{controller="ingress",reason="ReconcileError"} 1
tsingress_operator_reconcile_outcomes_total{controller="ingress",reason="Reconciled"} 1
tsingress_operator_reconcile_outcomes_total{controller="ingress",reason="TLSSecretNotFound"} 1
# HELP tsingress_operator_warnings Objects on which a Warning stands now, by controller and reason.
# TYPE tsingress_operator_warnings gauge
tsingress_operator_warnings{controller="ingress",reason="InvalidAnnotation"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tsingress_operator_reconcile_outcomes_total", "tsingress_operator_warnings"); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// A ProxyClass with metrics gets a Service on the proxies' health port selecting exactly their
// Pods; with a ServiceMonitor too, one selecting that Service, with the user's labels beside the
// operator's (which win) and the parent's identity as ts_proxy_* labels.
func TestProxyMetricsObjects(t *testing.T) {
	par := proxies.Parent{Typ: proxies.ParentTypeIngress, Namespace: "shop", Name: "store"}
	p := &proxies.StandaloneProxy{Parent: par}
	class := func(m *tsv1alpha1.Metrics) *tsv1alpha1.ProxyClass {
		return &tsv1alpha1.ProxyClass{Spec: tsv1alpha1.ProxyClassSpec{Metrics: m}}
	}
	for _, c := range []*tsv1alpha1.ProxyClass{nil, class(nil), class(&tsv1alpha1.Metrics{Enable: false})} {
		if svc, sm := proxies.ProxyMetricsObjects(p.Name(), "tailscale", par.Labels(), p.Selector(), c); svc != nil || sm != nil {
			t.Errorf("metrics objects without metrics enabled (%+v)", c)
		}
	}
	svc, sm := proxies.ProxyMetricsObjects(p.Name(), "tailscale", par.Labels(), p.Selector(), class(&tsv1alpha1.Metrics{Enable: true}))
	if svc == nil || sm != nil {
		t.Fatalf("metrics only: Service %v, ServiceMonitor %v", svc != nil, sm != nil)
	}
	if svc.Name != p.Name()+"-metrics" || svc.Spec.Ports[0].Port != proxies.HealthPort || svc.Spec.Ports[0].TargetPort.StrVal != "health" || svc.Spec.Ports[0].Name != "metrics" {
		t.Errorf("Service %s ports %+v", svc.Name, svc.Spec.Ports)
	}
	pod := p.BuildStatefulSet(kit.Settings{Namespace: "tailscale", ProxyImage: "proxy"}).Spec.Template
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("the Service's selector %v does not select the proxy Pod %v", svc.Spec.Selector, pod.Labels)
	}

	svc, sm = proxies.ProxyMetricsObjects(p.Name(), "tailscale", par.Labels(), p.Selector(), class(&tsv1alpha1.Metrics{Enable: true,
		ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true, Labels: map[string]string{"release": "prom", kit.LabelManaged: "false"}}}))
	if sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	if sm.GetKind() != "ServiceMonitor" || sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetName() != svc.Name {
		t.Errorf("ServiceMonitor %s %s %s", sm.GetAPIVersion(), sm.GetKind(), sm.GetName())
	}
	if l := sm.GetLabels(); l["release"] != "prom" || l[kit.LabelManaged] != "true" {
		t.Errorf("ServiceMonitor labels %v: want the user's and the operator's, the operator's winning", l)
	}
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if !labels.SelectorFromSet(sel).Matches(labels.Set(svc.Labels)) || sel[proxies.LabelMetrics] != "true" {
		t.Errorf("ServiceMonitor selector %v does not select the metrics Service %v", sel, svc.Labels)
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	ep := eps[0].(map[string]any)
	relabelings := ep["relabelings"].([]any)
	first := relabelings[0].(map[string]any)
	if ep["port"] != "metrics" || ep["path"] != "/metrics" || len(relabelings) != 3 ||
		first["sourceLabels"].([]any)[0] != "__meta_kubernetes_service_label_tailscale_com_parent_resource_type" || first["targetLabel"] != "ts_proxy_type" {
		t.Errorf("ServiceMonitor endpoint %v", ep)
	}
}

// The certificate-use gauges count a domain's whole account, over every segment of the ledger.
func TestLedgerMetricsReadEverySegment(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	segment := func(i int, names ...string) *corev1.ConfigMap {
		l := &acmebudget.Ledger{}
		for _, n := range names {
			l.Entries = append(l.Entries, acmebudget.Entry{Name: n, At: now.Add(-time.Hour), Serial: n})
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "op", Name: certs.LedgerSegmentName(i), Labels: map[string]string{kit.LabelManaged: "true"}},
			Data: map[string]string{certs.LedgerKey("x.ts.net"): string(b)}}
	}
	c := fake.NewClientBuilder().WithObjects(segment(0, "a.x.ts.net", "b.x.ts.net"), segment(3, "c.x.ts.net"), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "op", Name: "tsingress-acme-ledger-x", Labels: map[string]string{kit.LabelManaged: "true"}}, Data: map[string]string{certs.LedgerKey("x.ts.net"): `{"entries":[{"name":"d.x.ts.net","at":"2026-12-04T11:00:00Z"}]}`}}).Build()
	s := &stateCollector{c: c, namespace: "op", limits: acmebudget.LetsEncrypt, now: func() time.Time { return now }}
	want := `
# HELP tsingress_operator_acme_new_certificates New certificates of a registered domain in the CA's window (reservations included), counted against the weekly new-certificates-per-domain limit.
# TYPE tsingress_operator_acme_new_certificates gauge
tsingress_operator_acme_new_certificates{domain="x.ts.net"} 3
`
	if err := testutil.CollectAndCompare(ledgerCollector{s}, strings.NewReader(want), "tsingress_operator_acme_new_certificates"); err != nil {
		t.Error(err)
	}
}

type ledgerCollector struct{ s *stateCollector }

func (l ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDomainCerts, descNameCerts, descLimits} {
		ch <- d
	}
}

func (l ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	l.s.collectLedger(context.Background(), ch)
}

// The ProxyClass reconciler reports through a reporter like every other: an invalid class's
// Warning is emitted once while it stands and counted in the warnings gauge under its controller.
func TestProxyClassWarningsStand(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := registerOperatorMetrics(reg, emptyReader{}, "tailscale", acmebudget.LetsEncrypt)
	if err != nil {
		t.Fatal(err)
	}
	pc := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "bad", UID: "1"}, Spec: tsv1alpha1.ProxyClassSpec{
		StatefulSet: &tsv1alpha1.StatefulSet{Labels: map[string]string{"not a label": "x"}},
	}}
	scheme := runtime.NewScheme()
	if err := tsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pc).WithStatusSubresource(pc).Build()
	rec := clientevents.NewFakeRecorder(10)
	r := &proxyclass.ProxyClassReconciler{Client: c, Reporter: m.Reporter(rec, "proxyclass"), Mapper: meta.NewDefaultRESTMapper(nil)}
	for range 2 {
		if _, err := r.Reconcile(t.Context(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pc)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(rec.Events); n != 1 {
		t.Errorf("two passes over one invalid ProxyClass emitted %d Events, want 1", n)
	}
	want := `
# HELP tsingress_operator_warnings Objects on which a Warning stands now, by controller and reason.
# TYPE tsingress_operator_warnings gauge
tsingress_operator_warnings{controller="proxyclass",reason="ProxyClassInvalid"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tsingress_operator_warnings"); err != nil {
		t.Error(err)
	}
}
