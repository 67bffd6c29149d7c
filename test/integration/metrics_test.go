package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// Metrics, whole flow: a ProxyClass asking for a ServiceMonitor is refused while the CRD is
// missing (a condition says why) and accepted once it is installed; an Ingress on that class
// gets a proxy serving /metrics (its requests by Ingress, route and code, its certificate), a
// <proxy>-metrics Service selecting its Pod and a ServiceMonitor with the class's labels; the
// operator counts the proxy, its device, its reconcile outcomes and the certificate against the
// CA's weekly limits. Turning the ServiceMonitor, then the metrics, off removes them, and the
// running proxy stops serving /metrics without a restart.
func TestMetricsWholeFlow(t *testing.T) {
	w := startWorld(t)
	const ns = "shop"
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	web := newRecordingBackend(t, "web")
	if err := w.k8s.Create(w.ctx, loopbackService(ns, "web", web.port())); err != nil {
		t.Fatal(err)
	}

	pc := &tsv1alpha1.ProxyClass{
		ObjectMeta: metav1.ObjectMeta{Name: "monitored"},
		Spec: tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true,
			ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true, Labels: map[string]string{"release": "prom"}}}},
	}
	if err := w.k8s.Create(w.ctx, pc); err != nil {
		t.Fatal(err)
	}
	classReady := func(want metav1.ConditionStatus, msg string) func() error {
		return func() error {
			if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(pc), pc); err != nil {
				return err
			}
			c := meta.FindStatusCondition(pc.Status.Conditions, tsv1alpha1.ProxyClassReady)
			if c == nil || c.Status != want || c.ObservedGeneration != pc.Generation || !strings.Contains(c.Message, msg) {
				return fmt.Errorf("ProxyClassReady %+v", c)
			}
			return nil
		}
	}
	poll.Eventually(t, 30*time.Second, "the class refused without the ServiceMonitor CRD", classReady(metav1.ConditionFalse, "ServiceMonitor CRD"))

	installServiceMonitorCRD(t, w)
	patch := client.MergeFrom(pc.DeepCopy())
	pc.Spec.Metrics.ServiceMonitor.Labels["team"] = "web"
	if err := w.k8s.Patch(w.ctx, pc, patch); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "the class accepted with the CRD", classReady(metav1.ConditionTrue, ""))

	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "store", Labels: map[string]string{kit.LabelProxyClass: pc.Name}},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{"store"}}},
			DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
				Name: "web", Port: networkingv1.ServiceBackendPort{Name: "http"}}},
		},
	}
	if err := w.k8s.Create(w.ctx, ing); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := ln.Addr().String()
	ca := proxytest.NewCA(t)
	p := runStandaloneProxy(t, w, client.MatchingLabels{kit.LabelParentName: "store"}, proxy.Options{CertSource: ca, HealthListener: ln})
	secret, pod := p.secret, p.pod
	proxyName := strings.TrimSuffix(secret.Name, "-0")
	if cfg, _, err := contract.ProxyConfigs.Decode(secret.Data); err != nil || !cfg.Metrics {
		t.Fatalf("the proxy config does not enable metrics: %+v, %v", cfg, err)
	}
	poll.Eventually(t, 60*time.Second, "Ingress status", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(ing), ing); err != nil {
			return err
		}
		if lb := ing.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].Hostname != "store.tailnet.test" {
			return fmt.Errorf("status %+v", lb)
		}
		return nil
	})

	cl := joinClient(t, w, "laptop")
	httpc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: cl.Dial, TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	for range 3 {
		resp, err := httpc.Get("https://store.tailnet.test/cart")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	// The proxy's metrics, at its health address as the metrics Service reaches them.
	poll.Eventually(t, 30*time.Second, "the proxy's metrics", func() error {
		code, fs, err := scrapeProxy(health)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("/metrics: %d %v", code, err)
		}
		for _, check := range []error{
			fs.expectValue("tsingress_proxy_http_requests_total", map[string]string{"ingress": "shop/store", "route": "/", "code": "200"}, "3", func(v float64) bool { return v == 3 }),
			fs.expectValue("tsingress_proxy_http_request_duration_seconds", map[string]string{"ingress": "shop/store", "route": "/"}, "3 observations", func(v float64) bool { return v == 3 }),
			fs.expectValue("tsingress_proxy_certificate_expiry_timestamp_seconds", map[string]string{"name": "store.tailnet.test"}, "in the future", func(v float64) bool { return v > float64(time.Now().Unix()) }),
			fs.expectValue("tsingress_proxy_certificate_issuance_attempts_total", map[string]string{"name": "store.tailnet.test"}, ">= 1", func(v float64) bool { return v >= 1 }),
			fs.expectValue("tailscaled_inbound_packets_total", nil, "> 0", func(v float64) bool { return v > 0 }),
		} {
			if check != nil {
				return check
			}
		}
		return nil
	})

	// The metrics Service selects the proxy's Pod; the ServiceMonitor selects the Service and
	// carries the class's labels.
	svc := &corev1.Service{}
	sm := &unstructured.Unstructured{}
	sm.SetAPIVersion("monitoring.coreos.com/v1")
	sm.SetKind("ServiceMonitor")
	poll.Eventually(t, 30*time.Second, "metrics Service and ServiceMonitor", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: proxyName + "-metrics"}, svc); err != nil {
			return err
		}
		return w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: proxyName + "-metrics"}, sm)
	})
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) || svc.Spec.Ports[0].Port != 9002 || svc.Spec.Ports[0].Name != "metrics" {
		t.Errorf("metrics Service: selector %v ports %+v; the proxy Pod has labels %v", svc.Spec.Selector, svc.Spec.Ports, pod.Labels)
	}
	if l := sm.GetLabels(); l["release"] != "prom" || l["team"] != "web" {
		t.Errorf("ServiceMonitor labels %v, want the class's release=prom and team=web", l)
	}
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if !labels.SelectorFromSet(sel).Matches(labels.Set(svc.Labels)) {
		t.Errorf("the ServiceMonitor selects %v, not the metrics Service (%v)", sel, svc.Labels)
	}

	// The operator's metrics.
	poll.Eventually(t, 30*time.Second, "the operator's metrics", func() error {
		fs := gather(t, w.metrics)
		for _, check := range []error{
			fs.expectValue("tsingress_operator_managed_proxies", map[string]string{"type": "ingress"}, "1", func(v float64) bool { return v == 1 }),
			fs.expectValue("tsingress_operator_tailnet_devices", map[string]string{"type": "ingress"}, "1", func(v float64) bool { return v == 1 }),
			fs.expectValue("tsingress_operator_reconcile_outcomes_total", map[string]string{"controller": "ingress", "reason": "Reconciled"}, ">= 1", func(v float64) bool { return v >= 1 }),
			fs.expectValue("tsingress_operator_reconcile_outcomes_total", map[string]string{"controller": "proxyclass", "reason": kit.ReasonProxyClassInvalid}, ">= 1", func(v float64) bool { return v >= 1 }),
			fs.expectValue("tsingress_operator_acme_name_certificates", map[string]string{"name": "store.tailnet.test"}, "1", func(v float64) bool { return v == 1 }),
			fs.expectValue("tsingress_operator_acme_new_certificates", map[string]string{"domain": "tailnet.test"}, "1", func(v float64) bool { return v == 1 }),
			fs.expectValue("tsingress_operator_acme_limit", map[string]string{"limit": "per_name"}, "5", func(v float64) bool { return v == 5 }),
		} {
			if check != nil {
				return check
			}
		}
		return nil
	})
	problems, err := testutil.GatherAndLint(w.metrics)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	// The ServiceMonitor off: it goes, the Service stays.
	patch = client.MergeFrom(pc.DeepCopy())
	pc.Spec.Metrics.ServiceMonitor.Enable = false
	if err := w.k8s.Patch(w.ctx, pc, patch); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "the ServiceMonitor removed", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(sm), sm); !apierrors.IsNotFound(err) {
			return fmt.Errorf("ServiceMonitor still there (%v)", err)
		}
		return w.k8s.Get(w.ctx, client.ObjectKeyFromObject(svc), svc)
	})
	// Metrics off: the Service goes and the running proxy stops serving them.
	patch = client.MergeFrom(pc.DeepCopy())
	pc.Spec.Metrics = nil
	if err := w.k8s.Patch(w.ctx, pc, patch); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "metrics off", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(svc), svc); !apierrors.IsNotFound(err) {
			return fmt.Errorf("metrics Service still there (%v)", err)
		}
		if code, _, err := scrapeProxy(health); err != nil || code != http.StatusNotFound {
			return fmt.Errorf("/metrics answers %d (%v), want 404", code, err)
		}
		return nil
	})
	p.expectRunning(t, "as its metrics were turned off")
}
