package controller

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// normalEvents lists the reasons of the Normal Events about an object.
func normalEvents(kind, name string) func(g Gomega) []string {
	return func(g Gomega) []string {
		var reasons []string
		for _, e := range events(g, kind, name) {
			if e.Type == corev1.EventTypeNormal {
				reasons = append(reasons, e.Reason)
			}
		}
		return reasons
	}
}

// eventCount counts the Events about an object, each repetition of a series included.
func eventCount(kind, name string) func(g Gomega) int {
	return func(g Gomega) int {
		n := 0
		for _, e := range events(g, kind, name) {
			if e.Series != nil {
				n += int(e.Series.Count)
			} else {
				n++
			}
		}
		return n
	}
}

// expectNoNewEvents forces passes over obj (a change of an annotation nobody reads) and checks
// that they emit nothing.
func expectNoNewEvents(obj client.Object, kind string) {
	// Let the Events of the passes so far reach the API.
	Eventually(eventCount(kind, obj.GetName())).WithTimeout(5 * time.Second).Should(BeNumerically(">", 0))
	var before int
	Eventually(func(g Gomega) int {
		n := eventCount(kind, obj.GetName())(g)
		stable := n == before
		before = n
		if stable {
			return 1
		}
		return 0
	}).WithPolling(time.Second).Should(Equal(1))
	for i := range 3 {
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
		a := obj.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a["example.com/touch"] = string(rune('a' + i))
		obj.SetAnnotations(a)
		Expect(k8s.Patch(ctx, obj, patch)).To(Succeed())
		time.Sleep(300 * time.Millisecond)
	}
	Consistently(eventCount(kind, obj.GetName()), "2s").Should(Equal(before), "Events emitted by passes that changed nothing")
}

var _ = Describe("Events", func() {
	It("tell a standalone Ingress's progress, and nothing new while it stands still", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "progress", func(i *networkingv1.Ingress) {
			// A rule it cannot serve: a problem that stands on every pass.
			i.Spec.Rules = []networkingv1.IngressRule{kubeobj.Rule("other.example.com", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", 80)))}
		})
		Eventually(normalEvents("Ingress", ing.Name)).Should(ContainElement(kit.ReasonProxyDeployed))
		Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(kit.ReasonUnsupportedHost))

		fqdn := "progress.events1.example"
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: "nProgress", FQDN: fqdn})
		Eventually(normalEvents("Ingress", ing.Name)).Should(ContainElement(kit.ReasonDeviceJoined))

		issued := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "e7e7",
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: "nProgress", FQDN: fqdn, HTTPSEndpoint: fqdn,
			Certificates: map[string]contract.CertificateStatus{fqdn: issued}})
		Eventually(normalEvents("Ingress", ing.Name)).Should(ContainElements(kit.ReasonCertificateIssued, kit.ReasonServing))
		Expect(eventMessages(Default, "Ingress", ing.Name)).To(ContainElement(kit.ReasonServing + ": serving https://" + fqdn))

		By("emitting nothing more while nothing changes")
		expectNoNewEvents(ing, "Ingress")
		Expect(normalEvents("Ingress", ing.Name)(Default)).To(HaveLen(4), "each step once")
	})

	It("tell a standalone Service's progress, and nothing new while it stands still", func() {
		ns := newNamespace()
		svc := newService(ns, "progress-db", nil)
		Eventually(normalEvents("Service", svc.Name)).Should(ContainElement(kit.ReasonProxyDeployed))
		reportState(proxies.ParentTypeService, svc, proxytest.AppliedState("progress-db.tailnet.test", []string{"100.64.0.70"}, ""))
		Eventually(normalEvents("Service", svc.Name)).Should(ContainElements(kit.ReasonDeviceJoined, kit.ReasonServing))
		expectNoNewEvents(svc, "Service")
	})

	It("tell a ProxyGroup's replicas joining, and an Ingress served through it", func() {
		pg := newProxyGroup("events-ha", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "evha", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "events-ha"}
		})
		Eventually(normalEvents("Ingress", ing.Name)).Should(ContainElement(kit.ReasonTailscaleServiceCreated))

		reportReplica("events-ha", 0, contract.ProxyState{DeviceID: "nEvHA0", FQDN: "events-ha-0.tailnet.test",
			TailnetIPs: []string{"100.64.0.71"}, Advertised: []string{"svc:evha"}})
		Eventually(normalEvents("ProxyGroup", pg.Name)).Should(ContainElements(kit.ReasonDeviceJoined, kit.ReasonProxyGroupReady))
		Eventually(normalEvents("Ingress", ing.Name)).Should(ContainElement(kit.ReasonServing))
		Expect(eventMessages(Default, "Ingress", ing.Name)).To(ContainElement(
			kit.ReasonServing + ": serving https://evha.tailnet.test through Tailscale Service svc:evha"))
		expectNoNewEvents(ing, "Ingress")
		expectNoNewEvents(pg, "ProxyGroup")
	})
})
