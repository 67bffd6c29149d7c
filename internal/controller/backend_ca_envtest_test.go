package controller

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/ingress"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

var _ = Describe("Backend CAs", func() {
	It("verifies https backends against the CA bundle a ConfigMap holds, following the ConfigMap as it comes and changes", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "verified", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationBackendCA: "web-ca"}
		})

		By("reporting a ConfigMap that does not exist, rather than reaching the backend unverified")
		Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(kit.ReasonInvalidBackendCA))

		By("verifying against the bundle once the ConfigMap exists, without a change to the Ingress")
		// Self-signed certificates: a bundle is any PEM certificate.
		now := time.Now()
		firstPEM, _ := proxytest.SelfSigned(GinkgoT(), []string{"first-ca"}, now, now.Add(time.Hour))
		secondPEM, _ := proxytest.SelfSigned(GinkgoT(), []string{"second-ca"}, now, now.Add(time.Hour))
		first, second := string(firstPEM), string(secondPEM)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-ca"}, Data: map[string]string{ingress.BackendCAKey: first}}
		Expect(k8s.Create(ctx, cm)).To(Succeed())
		backend := func(g Gomega) contract.Backend {
			cfg := proxyConfigOf(g, proxies.ParentTypeIngress, ing)
			g.Expect(cfg.Serve.Routes).To(HaveLen(1))
			return cfg.Serve.Routes[0].Backend
		}
		Eventually(func(g Gomega) {
			b := backend(g)
			g.Expect(b.URL).To(HavePrefix("https://"))
			g.Expect(b.InsecureSkipVerify).To(BeFalse())
			g.Expect(b.CABundle).To(Equal(first))
			g.Expect(b.ServerName).To(Equal("web." + ns + ".svc"))
		}).Should(Succeed())

		By("following a rotated bundle")
		cm.Data[ingress.BackendCAKey] = second
		Expect(k8s.Update(ctx, cm)).To(Succeed())
		Eventually(func(g Gomega) string { return backend(g).CABundle }).Should(Equal(second))
	})
})
