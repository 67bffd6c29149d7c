package controller

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func newService(ns, name string, mutate func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:              corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass: ptr.To(kit.LoadBalancerClass),
			Selector:          map[string]string{"app": name},
			Ports: []corev1.ServicePort{
				{Name: "pg", Port: 5432, Protocol: corev1.ProtocolTCP},
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
			},
		},
	}
	if mutate != nil {
		mutate(s)
	}
	Expect(k8s.Create(ctx, s)).To(Succeed())
	return s
}

func proxyReady(svc *corev1.Service) func(g Gomega) *metav1.Condition {
	return func(g Gomega) *metav1.Condition {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
		c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionProxyReady)
		g.Expect(c).NotTo(BeNil())
		return c
	}
}

var _ = Describe("Service reconciler (standalone L3)", func() {
	It("runs a kernel proxy for a tailscale LoadBalancer, reports readiness and addresses, and cleans up", func() {
		ns := newNamespace()
		svc := newService(ns, "db", func(s *corev1.Service) {
			s.Annotations = map[string]string{kit.AnnotationHostname: "orders-db", kit.AnnotationTags: "tag:k8s,tag:k8s-operator"}
		})

		var cfg *contract.ProxyConfig
		Eventually(func(g Gomega) { cfg = proxyConfigOf(g, proxies.ParentTypeService, svc) }).Should(Succeed())
		Expect(cfg.Kind).To(Equal(contract.KindService))
		Expect(cfg.Hostname).To(Equal("orders-db"))
		Expect(cfg.Tags).To(Equal([]string{"tag:k8s", "tag:k8s-operator"}))
		Expect(cfg.Forward.IPs).To(Equal(svc.Spec.ClusterIPs))
		Expect(cfg.Firewall.Mode).To(Equal(contract.FirewallAuto))
		Expect(cfg.AuthKey).NotTo(BeEmpty())

		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(ctx, proxyKey(proxies.ParentTypeService, svc), sts) }).Should(Succeed())
		sc := sts.Spec.Template.Spec.Containers[0].SecurityContext
		Expect(sc.Capabilities.Add).To(ContainElement(corev1.Capability("NET_ADMIN")))
		Expect(*sc.RunAsUser).To(BeZero())

		Eventually(proxyReady(svc)).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyPending)))

		By("reporting ready with the MagicDNS name and tailnet IPs once the rules are in place")
		ips := []string{"100.64.0.7", "fd7a:115c:a1e0::7"}
		reportState(proxies.ParentTypeService, svc, proxytest.AppliedState("orders-db.tailnet.test", ips, ""))
		Eventually(proxyReady(svc)).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonProxyReady)))
		Expect(svc.Status.LoadBalancer.Ingress).To(Equal([]corev1.LoadBalancerIngress{
			{Hostname: "orders-db.tailnet.test"},
			{IP: ips[0], IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)},
			{IP: ips[1], IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}))

		By("reporting a DNAT failure")
		reportState(proxies.ParentTypeService, svc, proxytest.AppliedState("orders-db.tailnet.test", ips, "nftables: operation not permitted"))
		Eventually(proxyReady(svc)).Should(And(HaveField("Reason", kit.ReasonProxyFailed), HaveField("Message", ContainSubstring("operation not permitted"))))

		By("cleaning up when the Service leaves the class")
		patch := client.MergeFrom(svc.DeepCopy())
		svc.Spec.LoadBalancerClass = nil
		svc.Spec.Type = corev1.ServiceTypeClusterIP
		Expect(k8s.Patch(ctx, svc, patch)).To(Succeed())
		expectGone(sts)
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
			g.Expect(svc.Finalizers).To(BeEmpty())
			g.Expect(meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionProxyReady)).To(BeNil())
		}).Should(Succeed())
		Expect(apierrors.IsNotFound(k8s.Get(ctx, secretKey(proxies.ParentTypeService, svc), &corev1.Secret{}))).To(BeTrue())
	})

	It("advertises only the tailnet addresses forwarded, and reports per family what is not, on the condition and in Events", func() {
		ns := newNamespace()
		svc := newService(ns, "famdb", func(s *corev1.Service) {
			s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		})
		Eventually(func(g Gomega) { proxyConfigOf(g, proxies.ParentTypeService, svc) }).Should(Succeed())
		Expect(svc.Spec.ClusterIPs).To(HaveLen(2))
		fqdn, ips := ns+"-famdb.tailnet.test", []string{"100.64.0.9", "fd7a:115c:a1e0::9"}
		forwardingOff := func(f string) contract.FamilyProblem {
			return contract.FamilyProblem{Reason: contract.FamilyForwardingOff, Message: f + " forwarding is off and the proxy cannot turn it on (read-only file system)"}
		}

		By("forwarding off in the Pod: a clear reason, before the login too, and an Event")
		reportState(proxies.ParentTypeService, svc, contract.ProxyState{Firewall: &contract.FirewallStatus{Mode: contract.FirewallNFTables,
			Families: map[string]contract.FamilyProblem{contract.FamilyIPv4: forwardingOff("ipv4"), contract.FamilyIPv6: forwardingOff("ipv6")}}})
		Eventually(proxyReady(svc)).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonIPForwardingDisabled),
			HaveField("Message", And(ContainSubstring("ipv4 forwarding is off"), ContainSubstring("ipv6 forwarding is off")))))
		Eventually(func(g Gomega) []string { return eventReasons(g, "Service", "famdb") }).Should(ContainElement(kit.ReasonIPForwardingDisabled))
		Expect(svc.Status.LoadBalancer.Ingress).To(BeEmpty())

		By("IPv6 disabled in the Pod: ready on IPv4, IPv6 named as not forwarded and not advertised")
		disabled := "IPv6 is disabled in the proxy's network namespace (net.ipv6.conf.all.disable_ipv6=1)"
		reportState(proxies.ParentTypeService, svc, contract.ProxyState{DeviceID: "nFam", FQDN: fqdn, TailnetIPs: ips,
			Firewall: &contract.FirewallStatus{Mode: contract.FirewallNFTables,
				Families: map[string]contract.FamilyProblem{contract.FamilyIPv6: {Reason: contract.FamilyDisabled, Message: disabled}},
				Mappings: map[string]contract.AppliedDNAT{contract.StandaloneMapping: {
					TailnetIPs: ips[:1], Destinations: svc.Spec.ClusterIPs[:1], Error: "ipv6: " + disabled,
					FamilyErrors: map[string]string{contract.FamilyIPv6: disabled}}}}})
		Eventually(proxyReady(svc)).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonProxyReady),
			HaveField("Message", ContainSubstring("not forwarded: ipv6: "+disabled))))
		Expect(svc.Status.LoadBalancer.Ingress).To(Equal([]corev1.LoadBalancerIngress{
			{Hostname: fqdn}, {IP: ips[0], IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}))
		Eventually(func(g Gomega) []string { return eventMessages(g, "Service", "famdb") }).
			Should(ContainElement(ContainSubstring(kit.ReasonIPFamilyNotForwarded + ": not forwarded: ipv6: IPv6 is disabled")))

		By("both families forwarded")
		reportState(proxies.ParentTypeService, svc, proxytest.AppliedState(fqdn, ips, ""))
		Eventually(proxyReady(svc)).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Message", Not(ContainSubstring("not forwarded")))))
		Expect(svc.Status.LoadBalancer.Ingress).To(HaveLen(3))

		By("a mapping that forwards nothing fails, with an Event")
		reportState(proxies.ParentTypeService, svc, contract.ProxyState{DeviceID: "nFam", FQDN: fqdn, TailnetIPs: ips,
			Firewall: &contract.FirewallStatus{Mode: contract.FirewallNFTables, Mappings: map[string]contract.AppliedDNAT{
				contract.StandaloneMapping: {Error: "ipv4: mss clamp: operation not permitted; ipv6: mss clamp: operation not permitted",
					FamilyErrors: map[string]string{"ipv4": "mss clamp: operation not permitted", "ipv6": "mss clamp: operation not permitted"}}}}})
		Eventually(proxyReady(svc)).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyFailed)))
		Expect(svc.Status.LoadBalancer.Ingress).To(BeEmpty())
		Eventually(func(g Gomega) []string { return eventReasons(g, "Service", "famdb") }).Should(ContainElement(kit.ReasonProxyFailed))
	})

	It("does not advertise the IPv6 tailnet address of an IPv4-only Service", func() {
		ns := newNamespace()
		svc := newService(ns, "v4db", nil)
		Eventually(func(g Gomega) { proxyConfigOf(g, proxies.ParentTypeService, svc) }).Should(Succeed())
		fqdn := ns + "-v4db.tailnet.test"
		// The device has both addresses; the proxy forwards the one with a ClusterIP of its family.
		st := proxytest.AppliedState(fqdn, []string{"100.64.0.10"}, "")
		st.TailnetIPs = []string{"100.64.0.10", "fd7a:115c:a1e0::10"}
		reportState(proxies.ParentTypeService, svc, st)
		Eventually(proxyReady(svc)).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Message", ContainSubstring("(100.64.0.10)"))))
		Expect(svc.Status.LoadBalancer.Ingress).To(Equal([]corev1.LoadBalancerIngress{
			{Hostname: fqdn}, {IP: "100.64.0.10", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}))
	})

	It("exposes an annotated ClusterIP Service without touching its load-balancer status", func() {
		ns := newNamespace()
		svc := newService(ns, "cache", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.LoadBalancerClass = corev1.ServiceTypeClusterIP, nil
			s.Annotations = map[string]string{kit.AnnotationExpose: "true"}
		})
		Eventually(func(g Gomega) { proxyConfigOf(g, proxies.ParentTypeService, svc) }).Should(Succeed())
		Expect(proxyConfigOf(Default, proxies.ParentTypeService, svc).Hostname).To(Equal(ns + "-cache"))
		reportState(proxies.ParentTypeService, svc, proxytest.AppliedState(ns+"-cache.tailnet.test", []string{"100.64.0.8"}, ""))
		Eventually(proxyReady(svc)).Should(HaveField("Status", metav1.ConditionTrue))
		Expect(svc.Status.LoadBalancer.Ingress).To(BeEmpty())

		By("removing the proxy when the annotation goes")
		patch := client.MergeFrom(svc.DeepCopy())
		delete(svc.Annotations, kit.AnnotationExpose)
		Expect(k8s.Patch(ctx, svc, patch)).To(Succeed())
		expectGone(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: proxyKey(proxies.ParentTypeService, svc).Name}})
	})

	It("forwards an ExternalName Service by DNS name and follows a change of name", func() {
		ns := newNamespace()
		svc := newService(ns, "ext", func(s *corev1.Service) {
			s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com"}
			s.Annotations = map[string]string{kit.AnnotationExpose: "true"}
		})
		Eventually(func(g Gomega) *contract.Destination { return proxyConfigOf(g, proxies.ParentTypeService, svc).Forward }).
			Should(Equal(&contract.Destination{DNSName: "db.example.com"}))
		patch := client.MergeFrom(svc.DeepCopy())
		svc.Spec.ExternalName = "db2.example.com"
		Expect(k8s.Patch(ctx, svc, patch)).To(Succeed())
		Eventually(func(g Gomega) string { return proxyConfigOf(g, proxies.ParentTypeService, svc).Forward.DNSName }).Should(Equal("db2.example.com"))
	})

	It("leaves other load balancers alone", func() {
		ns := newNamespace()
		other := newService(ns, "metallb", func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("metallb") })
		classless := newService(ns, "classless", func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil })
		grouped := newService(ns, "grouped", func(s *corev1.Service) { s.Annotations = map[string]string{kit.AnnotationProxyGroup: "pg"} })
		for _, s := range []*corev1.Service{other, classless, grouped} {
			Consistently(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, proxyKey(proxies.ParentTypeService, s), &appsv1.StatefulSet{}))
			}, "1s").Should(BeTrue())
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(s), s)).To(Succeed())
			Expect(s.Finalizers).To(BeEmpty())
		}
	})

	DescribeTable("rejects bad input with ProxyInvalid and an Event",
		func(mutate func(*corev1.Service), event, message string) {
			ns := newNamespace()
			svc := newService(ns, "bad", mutate)
			Eventually(proxyReady(svc)).Should(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyInvalid), HaveField("Message", ContainSubstring(message))))
			Eventually(func(g Gomega) []string { return eventReasons(g, "Service", "bad") }).Should(ContainElement(event))
			Consistently(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, proxyKey(proxies.ParentTypeService, svc), &appsv1.StatefulSet{}))
			}, "1s").Should(BeTrue())
		},
		Entry("an invalid hostname", func(s *corev1.Service) {
			s.Annotations = map[string]string{kit.AnnotationHostname: "Orders_DB"}
		}, kit.ReasonInvalidAnnotation, "must be a DNS label"),
		Entry("bad tags", func(s *corev1.Service) {
			s.Annotations = map[string]string{kit.AnnotationTags: "k8s"}
		}, kit.ReasonInvalidAnnotation, "tag:name"),
		Entry("a headless Service", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.LoadBalancerClass, s.Spec.ClusterIP = corev1.ServiceTypeClusterIP, nil, corev1.ClusterIPNone
			s.Annotations = map[string]string{kit.AnnotationExpose: "true"}
		}, kit.ReasonInvalidService, "headless"),
		Entry("an expose value that is not true", func(s *corev1.Service) {
			s.Annotations = map[string]string{kit.AnnotationExpose: "yes"}
		}, kit.ReasonInvalidAnnotation, "only \"true\""),
	)
})
