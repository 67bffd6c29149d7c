package controller

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// newManualSlice creates an EndpointSlice for a Service without a selector, as a user (or a
// controller of theirs) does; the cluster's EndpointSlice controller leaves it alone.
func newManualSlice(ns, service, name string, port int32, ready map[string]bool) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: "spec.tsingress.test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	setEndpoints(s, ready)
	Expect(k8s.Create(ctx, s)).To(Succeed())
	return s
}

func setEndpoints(s *discoveryv1.EndpointSlice, ready map[string]bool) {
	s.Endpoints = nil
	for ip, r := range ready {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(r), Terminating: ptr.To(!r)}})
	}
}

func routeFor(g Gomega, cfg *contract.ProxyConfig, p string) contract.Route {
	for _, r := range cfg.Serve.Routes {
		if r.Path == p {
			return r
		}
	}
	g.Expect(cfg.Serve.Routes).To(ContainElement(HaveField("Path", p)))
	return contract.Route{}
}

var _ = Describe("Ingress backends' endpoints", func() {
	It("lists the ready endpoints of a backend in the proxy config and follows their changes", func() {
		ns := newNamespace()
		web := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		Expect(k8s.Create(ctx, web)).To(Succeed())
		slice := newManualSlice(ns, "web", "web-a", 8080, map[string]bool{"10.1.0.1": true, "10.1.0.2": true, "10.1.0.3": false})
		ing := newIngress(ns, "balanced", nil)

		By("writing the ready endpoints, with the Pods' port, beside the ClusterIP")
		Eventually(func(g Gomega) {
			b := routeFor(g, proxyConfigOf(g, proxies.ParentTypeIngress, ing), "/").Backend
			g.Expect(b.URL).To(Equal("http://" + web.Spec.ClusterIP + ":80"))
			g.Expect(b.Endpoints).To(Equal([]string{"10.1.0.1:8080", "10.1.0.2:8080"}))
		}).Should(Succeed())

		By("following a rollout: a new ready endpoint, an old one terminating, a second slice")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(slice), slice)).To(Succeed())
		setEndpoints(slice, map[string]bool{"10.1.0.1": false, "10.1.0.2": true, "10.1.0.4": true})
		Expect(k8s.Update(ctx, slice)).To(Succeed())
		newManualSlice(ns, "web", "web-b", 8081, map[string]bool{"10.1.0.9": true})
		Eventually(func(g Gomega) {
			b := routeFor(g, proxyConfigOf(g, proxies.ParentTypeIngress, ing), "/").Backend
			g.Expect(b.Endpoints).To(Equal([]string{"10.1.0.2:8080", "10.1.0.4:8080", "10.1.0.9:8081"}))
		}).Should(Succeed())

		By("falling back to the ClusterIP alone when no endpoint is ready")
		Expect(k8s.DeleteAllOf(ctx, &discoveryv1.EndpointSlice{}, client.InNamespace(ns),
			client.MatchingLabels{discoveryv1.LabelServiceName: "web"})).To(Succeed())
		Eventually(func(g Gomega) {
			b := routeFor(g, proxyConfigOf(g, proxies.ParentTypeIngress, ing), "/").Backend
			g.Expect(b.Endpoints).To(BeEmpty())
			g.Expect(b.URL).To(Equal("http://" + web.Spec.ClusterIP + ":80"))
		}).Should(Succeed())
	})

	It("serves a wildcard rule host with a bring-your-own wildcard certificate, written as config v3 and the newest, not older", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		now := time.Now()
		certPEM, keyPEM := proxytest.SelfSigned(GinkgoT(), []string{"*.example.com"}, now.Add(-time.Hour), now.Add(30*24*time.Hour))
		allowTLSSecrets(ns)
		Expect(k8s.Create(ctx, tlsSecret(ns, "wild-tls", certPEM, keyPEM))).To(Succeed())
		ing := newIngress(ns, "wild", func(i *networkingv1.Ingress) {
			i.Spec.TLS = append(i.Spec.TLS, networkingv1.IngressTLS{Hosts: []string{"*.example.com"}, SecretName: "wild-tls"})
			i.Spec.Rules = []networkingv1.IngressRule{
				kubeobj.Rule("*.example.com", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", "http"))),
				kubeobj.Rule("api.example.com", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", "admin"))),
				kubeobj.Rule("*.other.com", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", "http"))),
			}
		})
		Eventually(func(g Gomega) {
			s := &corev1.Secret{}
			g.Expect(k8s.Get(ctx, secretKey(proxies.ParentTypeIngress, ing), s)).To(Succeed())
			g.Expect(s.Data).To(HaveKey("proxy-config.v3.json"))
			g.Expect(s.Data).NotTo(HaveKey("proxy-config.v2.json"), "a v2 reader would refuse the wildcard")
			cfg, v, err := contract.ProxyConfigs.Decode(s.Data)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(v).To(Equal(contract.ProxyConfigs.Newest()), "the newest")
			g.Expect(cfg.Serve.TLS.Certificates).To(ConsistOf(HaveField("Hosts", []string{"*.example.com"})))
			g.Expect(cfg.Serve.Routes).To(ContainElements(HaveField("Host", "*.example.com"), HaveField("Host", "api.example.com")))
			g.Expect(cfg.Serve.Routes).NotTo(ContainElement(HaveField("Host", "*.other.com")))
			g.Expect(ingressEvents(g, ing)).To(ContainElement(kit.ReasonUnsupportedHost))
		}).Should(Succeed())
	})
})
