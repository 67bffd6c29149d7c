package controller

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/tailnet"
)

func groupDocuments(g Gomega, pg string) (*contract.ServeConfig, *contract.DNATConfig) {
	cm := &corev1.ConfigMap{}
	g.Expect(k8s.Get(ctx, nsKey(pg+groupConfigMapSuffix), cm)).To(Succeed())
	serve, _, _ := contract.ServeConfigs.Decode(cmData(cm))
	dnat, _, _ := contract.DNATConfigs.Decode(cmData(cm))
	if serve == nil {
		serve = &contract.ServeConfig{}
	}
	if dnat == nil {
		dnat = &contract.DNATConfig{}
	}
	return serve, dnat
}

func tailscaleService(name string) (tailnet.Service, error) {
	return tsClient.Service(ctx, name)
}

var _ = Describe("Ingresses and Services on a ProxyGroup", Ordered, func() {
	BeforeAll(func() {
		pg := newProxyGroup("ha", nil)
		DeferCleanup(k8s.Delete, ctx, pg)
		Eventually(func(g Gomega) { replicaConfig(g, "ha", 1) }).Should(Succeed())
	})

	It("serves an Ingress through a Tailscale Service advertised by the replicas", func() {
		ns := newNamespace()
		web := newBackendService(ns, "web")
		ing := newIngress(ns, "ha-shop", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{AnnotationProxyGroup: "ha", AnnotationHTTPRedirect: "true"}
		})

		By("writing its routes into the group's Serve config")
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "ha")
			return serve.Services
		}).Should(HaveKeyWithValue("svc:ha-shop", contract.WebService{HTTP: contract.HTTPRedirect, Routes: []contract.Route{
			{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}}}}))

		By("creating the Tailscale Service, owned by this operator")
		ts, err := tailscaleService("svc:ha-shop")
		Expect(err).NotTo(HaveOccurred())
		Expect(ts.Ports).To(Equal([]string{"tcp:443", "tcp:80"}))
		Expect(ts.Addrs).NotTo(BeEmpty())
		var refs ownerRefs
		Expect(json.Unmarshal([]byte(ts.Annotations[annotationOwnerRefs]), &refs)).To(Succeed())
		Expect(refs.OwnerRefs).To(HaveLen(1))

		By("letting every replica advertise it")
		for i := range 2 {
			Eventually(func(g Gomega) []string { return replicaConfig(g, "ha", i).AdvertiseServices }).Should(ContainElement("svc:ha-shop"))
		}

		By("reporting the name once a replica advertises it")
		Consistently(func(g Gomega) int {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			return len(ing.Status.LoadBalancer.Ingress)
		}, "500ms").Should(BeZero())
		reportReplica("ha", 1, contract.ProxyState{FQDN: "ha-1.tailnet.test", Advertised: []string{"svc:ha-shop"}})
		Eventually(func(g Gomega) []networkingv1.IngressLoadBalancerIngress {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			return ing.Status.LoadBalancer.Ingress
		}).Should(Equal([]networkingv1.IngressLoadBalancerIngress{{Hostname: "ha-shop.tailnet.test", Ports: []networkingv1.IngressPortStatus{
			{Port: 443, Protocol: corev1.ProtocolTCP}, {Port: 80, Protocol: corev1.ProtocolTCP}}}}))

		By("removing everything on delete")
		Expect(k8s.Delete(ctx, ing)).To(Succeed())
		expectGone(ing)
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "ha")
			return serve.Services
		}).ShouldNot(HaveKey("svc:ha-shop"))
		_, err = tailscaleService("svc:ha-shop")
		Expect(tailnet.IsNotFound(err)).To(BeTrue(), "Tailscale Service still there: %v", err)
		Eventually(func(g Gomega) []string { return replicaConfig(g, "ha", 0).AdvertiseServices }).ShouldNot(ContainElement("svc:ha-shop"))
	})

	It("serves a Service at L3 through the Tailscale Service's VIPs", func() {
		ns := newNamespace()
		svc := newService(ns, "ha-db", func(s *corev1.Service) {
			s.Annotations = map[string]string{AnnotationProxyGroup: "ha"}
		})
		var mapping contract.DNATService
		Eventually(func(g Gomega) {
			_, dnat := groupDocuments(g, "ha")
			g.Expect(dnat.Services).To(HaveKey("svc:" + ns + "-ha-db"))
			mapping = dnat.Services["svc:"+ns+"-ha-db"]
		}).Should(Succeed())
		Expect(mapping.Destination).To(Equal(contract.Destination{IPs: svc.Spec.ClusterIPs}))
		ts, err := tailscaleService("svc:" + ns + "-ha-db")
		Expect(err).NotTo(HaveOccurred())
		Expect(mapping.VIPs).To(ContainElement(ts.Addrs[0].String()), "IPv4 VIP for an IPv4 ClusterIP")

		cond := func(typ string) func(g Gomega) *metav1.Condition {
			return func(g Gomega) *metav1.Condition {
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
				c := meta.FindStatusCondition(svc.Status.Conditions, typ)
				g.Expect(c).NotTo(BeNil())
				return c
			}
		}
		Eventually(cond(ConditionIngressSvcValid)).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(cond(ConditionIngressSvcConfigured)).Should(HaveField("Reason", ReasonIngressSvcNoBackends))
		reportReplica("ha", 0, contract.ProxyState{FQDN: "ha-0.tailnet.test", Advertised: []string{"svc:" + ns + "-ha-db"}})
		Eventually(cond(ConditionIngressSvcConfigured)).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Message", ContainSubstring("1/2"))))
		Expect(svc.Status.LoadBalancer.Ingress[0].Hostname).To(Equal(ns + "-ha-db.tailnet.test"))

		By("cleaning up when the annotation goes")
		patch := client.MergeFrom(svc.DeepCopy())
		delete(svc.Annotations, AnnotationProxyGroup)
		Expect(k8s.Patch(ctx, svc, patch)).To(Succeed())
		Eventually(func(g Gomega) map[string]contract.DNATService {
			_, dnat := groupDocuments(g, "ha")
			return dnat.Services
		}).ShouldNot(HaveKey("svc:" + ns + "-ha-db"))
		Eventually(cond(ConditionProxyReady)).ShouldNot(BeNil(), "now a standalone L3 Service")
	})

	It("reports a missing group, a group of the wrong type, a duplicate hostname and a foreign Tailscale Service", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		egress := newProxyGroup("ha-egress", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Type = tsv1alpha1.ProxyGroupTypeEgress })
		DeferCleanup(k8s.Delete, ctx, egress)

		missing := newIngress(ns, "lost", func(i *networkingv1.Ingress) { i.Annotations = map[string]string{AnnotationProxyGroup: "nope"} })
		wrong := newIngress(ns, "wrong", func(i *networkingv1.Ingress) { i.Annotations = map[string]string{AnnotationProxyGroup: "ha-egress"} })
		first := newIngress(ns, "first", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{AnnotationProxyGroup: "ha"}
			i.Spec.TLS[0].Hosts = []string{"same"}
		})
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "ha")
			return serve.Services
		}).Should(HaveKey("svc:same"))
		second := newIngress(ns, "second", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{AnnotationProxyGroup: "ha"}
			i.Spec.TLS[0].Hosts = []string{"same"}
		})
		_, err := tsClient.PutService(ctx, tailnet.Service{Name: "svc:foreign", Ports: []string{"tcp:443"}, Tags: []string{"tag:k8s"}})
		Expect(err).NotTo(HaveOccurred())
		foreign := newIngress(ns, "foreign", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{AnnotationProxyGroup: "ha"}
		})

		for ing, reason := range map[*networkingv1.Ingress]string{
			missing: ReasonProxyGroupNotFound, wrong: ReasonProxyGroupWrongType,
			second: ReasonDuplicateHostname, foreign: ReasonInvalidTailscaleSvc,
		} {
			Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(reason), ing.Name)
		}
		Expect(ingressEvents(Default, first)).NotTo(ContainElement(ReasonDuplicateHostname))
		ts, err := tailscaleService("svc:foreign")
		Expect(err).NotTo(HaveOccurred())
		Expect(ts.Annotations).NotTo(HaveKey(annotationOwnerRefs), "a foreign Tailscale Service is left alone")
		Expect(k8s.Delete(ctx, first)).To(Succeed())
		expectGone(first)
	})
})
