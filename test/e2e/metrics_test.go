//go:build e2e

package e2e

import (
	"bytes"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/test/framework"
)

var _ = Describe("Proxy metrics", func() {
	It("are served through the <proxy>-metrics Service once the ProxyClass enables them, counting the Ingress's requests", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		pc := &tsv1alpha1.ProxyClass{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-metrics-" + framework.Token()},
			Spec:       tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true}},
		}
		suite.Create(ctx, pc)
		host := "e2e-metrics-" + framework.Token()
		ing := framework.Ingress(ns, "measured", host, "")
		ing.Labels = map[string]string{kit.LabelProxyClass: pc.Name}
		suite.Create(ctx, ing)
		expectHTTPSEcho(ctx, suite.ServedName(ctx, ing))

		pod := proxyPod(ctx, "ingress", ns, ing.Name, true)
		svc := strings.TrimSuffix(pod.Name, "-0") + "-metrics"
		if suite.localBackend != "" {
			// The local environment has no Pod network for the API server's Service proxy to
			// reach (its proxies listen on loopback ports of their own; the kind suite fetches):
			// the Service is checked to select the proxy's Pod.
			Eventually(ctx, func(g Gomega) {
				s := &corev1.Service{}
				g.Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: svc}, s)).To(Succeed())
				g.Expect(s.Spec.Selector).NotTo(BeEmpty())
				g.Expect(labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels))).To(BeTrue(), "Service %s selects Pod %s", svc, pod.Name)
			}).Should(Succeed())
			return
		}
		// Through the API server's Service proxy: the Service must select the proxy's Pod.
		Eventually(ctx, func(g Gomega) {
			body, err := suite.Clientset.CoreV1().Services(pod.Namespace).ProxyGet("http", svc, "metrics", "/metrics", nil).DoRaw(ctx)
			g.Expect(err).NotTo(HaveOccurred(), "GET /metrics through Service %s", svc)
			p := expfmt.NewTextParser(model.UTF8Validation)
			families, err := p.TextToMetricFamilies(bytes.NewReader(body))
			g.Expect(err).NotTo(HaveOccurred())
			f := families["tsingress_proxy_http_requests_total"]
			g.Expect(f).NotTo(BeNil(), "no request counter")
			var served float64
			for _, m := range f.Metric {
				labels := map[string]string{}
				for _, l := range m.Label {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["ingress"] == ns+"/"+ing.Name && labels["code"] == "200" {
					served += m.Counter.GetValue()
				}
			}
			g.Expect(served).To(BeNumerically(">=", 1), "requests counted for %s/%s", ns, ing.Name)
			g.Expect(families).To(HaveKey("tsingress_proxy_certificate_expiry_timestamp_seconds"))
			g.Expect(families).To(HaveKey("tailscaled_inbound_packets_total"))
		}).Should(Succeed())
	})
})

var _ = Describe("An HA Ingress with tailscale.com/http-endpoint: enabled", func() {
	It("is served over plain HTTP on port 80 beside HTTPS, and its status lists port 80", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		pg := framework.ProxyGroup("e2e-http-"+framework.Token(), 1)
		suite.Create(ctx, pg)
		suite.WaitGroupReady(ctx, pg)
		host := "e2e-http-" + framework.Token()
		ing := framework.Ingress(ns, "plain", host, pg.Name)
		ing.Annotations[kit.AnnotationHTTPEndpoint] = "enabled"
		suite.Create(ctx, ing)
		fqdn := suite.ServedName(ctx, ing)
		Eventually(ctx, func(g Gomega) {
			g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			var ports []int32
			for _, p := range ing.Status.LoadBalancer.Ingress[0].Ports {
				ports = append(ports, p.Port)
			}
			g.Expect(ports).To(Equal([]int32{443, 80}))
		}).Should(Succeed(), "status ports")
		expectHTTPSEcho(ctx, fqdn)
		hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DialContext: suite.Dial},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		defer hc.CloseIdleConnections()
		expectEcho(ctx, hc, "http://"+fqdn)
	})
})
