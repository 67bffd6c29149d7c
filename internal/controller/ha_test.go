package controller

import (
	"encoding/json"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
)

func groupDocuments(g Gomega, pg string) (*contract.ServeConfig, *contract.DNATConfig) {
	docs := contract.MergeShards(readGroupShards(g, pg))
	g.Expect(docs.ServeErr).NotTo(HaveOccurred())
	g.Expect(docs.DNATErr).NotTo(HaveOccurred())
	return docs.Serve, docs.DNAT
}

// readGroupShards reads every shard of a group's documents, as a replica does.
func readGroupShards(g Gomega, pg string) []map[string][]byte {
	cm := &corev1.ConfigMap{}
	g.Expect(k8s.Get(ctx, nsKey(pg+proxies.GroupConfigMapSuffix), cm)).To(Succeed())
	count, err := contract.ShardCount(contract.ConfigMapBytes(cm.Data))
	g.Expect(err).NotTo(HaveOccurred())
	shards := []map[string][]byte{contract.ConfigMapBytes(cm.Data)}
	for i := 1; i < count; i++ {
		s := &corev1.ConfigMap{}
		g.Expect(k8s.Get(ctx, nsKey(contract.ShardName(pg+proxies.GroupConfigMapSuffix, i)), s)).To(Succeed())
		shards = append(shards, contract.ConfigMapBytes(s.Data))
	}
	return shards
}

func tailscaleService(name string) (tailnet.Service, error) {
	return tsClient.Service(ctx, name)
}

// dnatEntry waits for a service's entry in a group's DNAT mappings.
func dnatEntry(pg, svcName string) contract.DNATService {
	return dnatEntryWithin(pg, svcName, 20*time.Second)
}

func dnatEntryWithin(pg, svcName string, timeout time.Duration) contract.DNATService {
	var m contract.DNATService
	Eventually(func(g Gomega) {
		_, dnat := groupDocuments(g, pg)
		g.Expect(dnat.Services).To(HaveKey(svcName))
		m = dnat.Services[svcName]
	}, timeout).Should(Succeed(), "DNAT entry %s", svcName)
	return m
}

// vipsOf lists the addresses of a Tailscale Service, as strings, of the families asked for.
func vipsOf(name string, v4, v6 bool) []string {
	ts, err := tailscaleService(name)
	Expect(err).NotTo(HaveOccurred())
	var out []string
	for _, a := range ts.Addrs {
		if (a.Is4() && v4) || (a.Is6() && v6) {
			out = append(out, a.String())
		}
	}
	return out
}

func serviceCondition(svc *corev1.Service, typ string) func(g Gomega) *metav1.Condition {
	return func(g Gomega) *metav1.Condition {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
		c := meta.FindStatusCondition(svc.Status.Conditions, typ)
		g.Expect(c).NotTo(BeNil())
		return c
	}
}

// reconciles counts a controller's passes so far, from controller-runtime's metric.
func reconciles(controller string) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
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
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha", kit.AnnotationHTTPRedirect: "true"}
		})

		By("writing its routes into the group's Serve config")
		want := contract.WebService{HTTP: contract.HTTPRedirect, Ingress: ns + "/ha-shop", Routes: []contract.Route{
			{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}}}}
		// No replica runs here. The tailnet's domain is known only when a device of another spec
		// was in the tailnet when the operator first asked the API (the order specs run in):
		// until then issuance waits for it, after it nothing holds it.
		waiting := want
		waiting.TLS = contract.WebTLS{Hold: &contract.IssuanceHold{Reason: kit.ReasonWaitingForTailnetDomain,
			Message: "the tailnet's domain is not known yet; the certificate is requested once the proxy has joined"}}
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "ha")
			return serve.Services
		}).Should(Or(HaveKeyWithValue("svc:ha-shop", waiting), HaveKeyWithValue("svc:ha-shop", want)))

		By("creating the Tailscale Service, owned by this operator")
		ts, err := tailscaleService("svc:ha-shop")
		Expect(err).NotTo(HaveOccurred())
		Expect(ts.Ports).To(Equal([]string{"tcp:443", "tcp:80"}))
		Expect(ts.Addrs).NotTo(BeEmpty())
		var refs groupstore.OwnerRefs
		Expect(json.Unmarshal([]byte(ts.Annotations[groupstore.AnnotationOwnerRefs]), &refs)).To(Succeed())
		Expect(refs.OwnerRefs).To(HaveLen(1))

		By("letting every replica advertise it")
		for i := range 2 {
			Eventually(func(g Gomega) []string { return olderProxyAdvertises(g, "ha", i) }).Should(ContainElement("svc:ha-shop"))
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
		Eventually(func(g Gomega) []string { return olderProxyAdvertises(g, "ha", 0) }).ShouldNot(ContainElement("svc:ha-shop"))
	})

	It("serves a Service at L3 through the Tailscale Service's VIPs", func() {
		ns := newNamespace()
		svc := newService(ns, "ha-db", func(s *corev1.Service) {
			s.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha"}
		})
		awaitKernelReplicas("ha", 2)
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
		Eventually(cond(kit.ConditionIngressSvcValid)).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(cond(kit.ConditionIngressSvcConfigured)).Should(HaveField("Reason", kit.ReasonIngressSvcNoBackends))
		reportReplica("ha", 0, contract.ProxyState{FQDN: "ha-0.tailnet.test", Advertised: []string{"svc:" + ns + "-ha-db"}})
		Eventually(cond(kit.ConditionIngressSvcConfigured)).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Message", ContainSubstring("1/2"))))
		Expect(svc.Status.LoadBalancer.Ingress[0].Hostname).To(Equal(ns + "-ha-db.tailnet.test"))

		By("naming the replica that cannot install the rules, and why")
		reportReplica("ha", 1, contract.ProxyState{FQDN: "ha-1.tailnet.test", Firewall: &contract.FirewallStatus{Mode: contract.FirewallNFTables,
			Mappings: map[string]contract.AppliedDNAT{"svc:" + ns + "-ha-db": {Error: "ipv4: ipv4 forwarding is off",
				FamilyErrors: map[string]string{contract.FamilyIPv4: "ipv4 forwarding is off"}}}}})
		Eventually(cond(kit.ConditionIngressSvcConfigured)).Should(HaveField("Message",
			Equal("1/2 proxy replicas ready and advertising; DNAT rules not in place on ha-1: ipv4: ipv4 forwarding is off")))

		By("cleaning up when the annotation goes")
		patch := client.MergeFrom(svc.DeepCopy())
		delete(svc.Annotations, kit.AnnotationProxyGroup)
		Expect(k8s.Patch(ctx, svc, patch)).To(Succeed())
		Eventually(func(g Gomega) map[string]contract.DNATService {
			_, dnat := groupDocuments(g, "ha")
			return dnat.Services
		}).ShouldNot(HaveKey("svc:" + ns + "-ha-db"))
		Eventually(cond(kit.ConditionProxyReady)).ShouldNot(BeNil(), "now a standalone L3 Service")
	})

	It("maps each IP family of a Service to the VIP of that family, and an ExternalName to every VIP", func() {
		ns := newNamespace()
		haService := func(name string, mutate func(*corev1.Service)) *corev1.Service {
			return newService(ns, name, func(s *corev1.Service) {
				s.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha"}
				mutate(s)
			})
		}
		v6 := haService("v6", func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} })
		dual := haService("dual", func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack) })
		ext := haService("ext", func(s *corev1.Service) {
			s.Annotations[kit.AnnotationExpose] = "true"
			s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "db.example.com"
			s.Spec.LoadBalancerClass, s.Spec.Selector = nil, nil
		})
		Expect(v6.Spec.ClusterIPs).To(HaveLen(1))
		Expect(dual.Spec.ClusterIPs).To(HaveLen(2))

		Expect(dnatEntry("ha", "svc:"+ns+"-v6")).To(Equal(contract.DNATService{
			VIPs: vipsOf("svc:"+ns+"-v6", false, true), Destination: contract.Destination{IPs: v6.Spec.ClusterIPs}}))
		Expect(dnatEntry("ha", "svc:"+ns+"-dual")).To(Equal(contract.DNATService{
			VIPs: vipsOf("svc:"+ns+"-dual", true, true), Destination: contract.Destination{IPs: dual.Spec.ClusterIPs}}))
		Expect(dnatEntry("ha", "svc:"+ns+"-ext")).To(Equal(contract.DNATService{
			VIPs: vipsOf("svc:"+ns+"-ext", true, true), Destination: contract.Destination{DNSName: "db.example.com"}}))

		By("publishing the VIPs of the Service's families once a replica advertises it")
		reportReplica("ha", 1, contract.ProxyState{FQDN: "ha-1.tailnet.test", Advertised: []string{"svc:" + ns + "-dual", "svc:" + ns + "-ext", "svc:" + ns + "-v6"}})
		lb := func(svc *corev1.Service) func(g Gomega) []corev1.LoadBalancerIngress {
			return func(g Gomega) []corev1.LoadBalancerIngress {
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
				return svc.Status.LoadBalancer.Ingress
			}
		}
		// The name and the first address in one entry, as the original writes it.
		want := func(name string, vips []string) []corev1.LoadBalancerIngress {
			out := []corev1.LoadBalancerIngress{{Hostname: ns + "-" + name + ".tailnet.test", IP: vips[0], IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
			for _, ip := range vips[1:] {
				out = append(out, corev1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
			}
			return out
		}
		Eventually(lb(dual)).Should(Equal(want("dual", vipsOf("svc:"+ns+"-dual", true, true))))
		Eventually(lb(v6)).Should(Equal(want("v6", vipsOf("svc:"+ns+"-v6", false, true))))
		Eventually(serviceCondition(ext, kit.ConditionIngressSvcConfigured)).Should(HaveField("Status", metav1.ConditionTrue))

		By("releasing everything on delete")
		for _, svc := range []*corev1.Service{v6, dual, ext} {
			Expect(k8s.Delete(ctx, svc)).To(Succeed())
			expectGone(svc)
			_, err := tailscaleService("svc:" + ns + "-" + svc.Name)
			Expect(tailnet.IsNotFound(err)).To(BeTrue(), "Tailscale Service of %s still there: %v", svc.Name, err)
		}
		reportReplica("ha", 1, contract.ProxyState{FQDN: "ha-1.tailnet.test"})
	})

	// The local tailnet stands in for a control plane that gives Tailscale Services IPv4
	// addresses only; the Services ask for IPv6.
	It("reports a Tailscale Service with no address of the Service's families, without looping, until either is fixed", func() {
		Expect(tsnet.SetServiceAddrFamilies(true, false)).To(Succeed())
		DeferCleanup(tsnet.SetServiceAddrFamilies, true, true)
		ns := newNamespace()
		v6only := func(name string) *corev1.Service {
			return newService(ns, name, func(s *corev1.Service) {
				s.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha"}
				s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol}
			})
		}
		// a is fixed by making it dual-stack, b by the tailnet giving its service an IPv6 address.
		a, b := v6only("a"), v6only("b")
		for _, svc := range []*corev1.Service{a, b} {
			Eventually(func(g Gomega) []string { return eventMessages(g, "Service", svc.Name) }).Should(
				ContainElement(HavePrefix(kit.ReasonUnsupportedIPFamily+": the Tailscale Service has addresses [100.")), svc.Name)
			Expect(events(Default, "Service", svc.Name)).To(ContainElement(And(
				HaveField("Reason", kit.ReasonUnsupportedIPFamily), HaveField("Type", corev1.EventTypeWarning))))
			Eventually(serviceCondition(svc, kit.ConditionIngressSvcValid)).Should(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonUnsupportedIPFamily)))
			Expect(serviceCondition(svc, kit.ConditionIngressSvcConfigured)(Default)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonUnsupportedIPFamily)))
			_, dnat := groupDocuments(Default, "ha")
			Expect(dnat.Services).NotTo(HaveKey("svc:"+ns+"-"+svc.Name), "a mapping with no VIP to map")
		}

		By("not reconciling again while nothing changes")
		time.Sleep(time.Second) // the passes that the status writes bring
		before, versions := reconciles("service-proxygroup"), map[string]string{}
		for _, svc := range []*corev1.Service{a, b} {
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
			versions[svc.Name] = svc.ResourceVersion
		}
		Consistently(func(g Gomega) map[string]string {
			now := map[string]string{}
			for _, svc := range []*corev1.Service{a, b} {
				cur := &corev1.Service{}
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), cur)).To(Succeed())
				now[svc.Name] = cur.ResourceVersion
			}
			return now
		}, "3s", "200ms").Should(Equal(versions), "the Services keep changing")
		Expect(reconciles("service-proxygroup")-before).To(BeNumerically("<=", 5), "passes in 3 quiet seconds: a hot loop makes dozens")

		By("serving a once it is dual-stack, through the IPv4 VIP")
		patch := client.MergeFrom(a.DeepCopy())
		a.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
		Expect(k8s.Patch(ctx, a, patch)).To(Succeed())
		Expect(a.Spec.ClusterIPs).To(HaveLen(2))
		Expect(dnatEntry("ha", "svc:"+ns+"-a")).To(Equal(contract.DNATService{
			VIPs: vipsOf("svc:"+ns+"-a", true, false), Destination: contract.Destination{IPs: a.Spec.ClusterIPs}}))
		Eventually(serviceCondition(a, kit.ConditionIngressSvcValid)).Should(HaveField("Status", metav1.ConditionTrue))

		By("serving b once its Tailscale Service has an IPv6 address, which the operator looks for again on its own")
		time.Sleep(time.Second) // the passes that a's change brings to the group's Services
		Expect(tsnet.SetServiceAddrFamilies(true, true)).To(Succeed())
		fixed := time.Now()
		Expect(dnatEntryWithin("ha", "svc:"+ns+"-b", kit.TailnetRetry+30*time.Second)).To(Equal(contract.DNATService{
			VIPs: vipsOf("svc:"+ns+"-b", false, true), Destination: contract.Destination{IPs: b.Spec.ClusterIPs}}))
		Eventually(serviceCondition(b, kit.ConditionIngressSvcValid)).Should(HaveField("Status", metav1.ConditionTrue))
		AddReportEntry("UnsupportedIPFamily: served after the tailnet's fix", time.Since(fixed).Round(time.Second).String())
	})

	It("reports a missing group, a group of the wrong type, a duplicate hostname and a foreign Tailscale Service", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		egress := newProxyGroup("ha-egress", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Type = tsv1alpha1.ProxyGroupTypeEgress })
		DeferCleanup(k8s.Delete, ctx, egress)

		missing := newIngress(ns, "lost", func(i *networkingv1.Ingress) { i.Annotations = map[string]string{kit.AnnotationProxyGroup: "nope"} })
		wrong := newIngress(ns, "wrong", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha-egress"}
		})
		first := newIngress(ns, "first", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha"}
			i.Spec.TLS[0].Hosts = []string{"same"}
		})
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "ha")
			return serve.Services
		}).Should(HaveKey("svc:same"))
		second := newIngress(ns, "second", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha"}
			i.Spec.TLS[0].Hosts = []string{"same"}
		})
		_, err := tsClient.PutService(ctx, tailnet.Service{Name: "svc:foreign", Ports: []string{"tcp:443"}, Tags: []string{"tag:k8s"}})
		Expect(err).NotTo(HaveOccurred())
		foreign := newIngress(ns, "foreign", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha"}
		})

		for ing, reason := range map[*networkingv1.Ingress]string{
			missing: kit.ReasonProxyGroupNotFound, wrong: kit.ReasonProxyGroupWrongType,
			second: kit.ReasonDuplicateHostname, foreign: kit.ReasonInvalidTailscaleSvc,
		} {
			Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(reason), ing.Name)
		}
		Expect(ingressEvents(Default, first)).NotTo(ContainElement(kit.ReasonDuplicateHostname))
		ts, err := tailscaleService("svc:foreign")
		Expect(err).NotTo(HaveOccurred())
		Expect(ts.Annotations).NotTo(HaveKey(groupstore.AnnotationOwnerRefs), "a foreign Tailscale Service is left alone")
		Expect(k8s.Delete(ctx, first)).To(Succeed())
		expectGone(first)
	})
})

var _ = Describe("A renamed object on a ProxyGroup", func() {
	It("moves its entry and its Tailscale Service to the new name", func() {
		pg := newProxyGroup("rename", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "old-name", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "rename"}
		})
		Eventually(func(g Gomega) {
			serve, _ := groupDocuments(g, "rename")
			g.Expect(serve.Services).To(HaveKey("svc:old-name"))
			_, err := tailscaleService("svc:old-name")
			g.Expect(err).NotTo(HaveOccurred())
		}).Should(Succeed())

		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
		ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"new-name"}}}
		Expect(k8s.Update(ctx, ing)).To(Succeed())
		Eventually(func(g Gomega) {
			serve, _ := groupDocuments(g, "rename")
			g.Expect(serve.Services).To(HaveKey("svc:new-name"))
			g.Expect(serve.Services).NotTo(HaveKey("svc:old-name"))
			_, err := tailscaleService("svc:old-name")
			g.Expect(tailnet.IsNotFound(err)).To(BeTrue(), "the old Tailscale Service is released: %v", err)
		}).Should(Succeed())

		Expect(k8s.Delete(ctx, ing)).To(Succeed())
		Eventually(func(g Gomega) {
			serve, _ := groupDocuments(g, "rename")
			g.Expect(serve.Services).To(BeEmpty())
			_, err := tailscaleService("svc:new-name")
			g.Expect(tailnet.IsNotFound(err)).To(BeTrue())
		}).Should(Succeed())
	})
})

var _ = Describe("A renamed object whose entry was never written", func() {
	It("releases the Tailscale Service it claimed under its old name, and at its deletion the one under its new name", func() {
		// A group whose ProxyClass does not exist has no ConfigMap: every claim stays unentered.
		pg := newProxyGroup("ha-claims", func(p *tsv1alpha1.ProxyGroup) { p.Spec.ProxyClass = "ha-claims-missing" })
		DeferCleanup(k8s.Delete, ctx, pg)
		ns := newNamespace()
		svc := newService(ns, "claims", func(s *corev1.Service) {
			s.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha-claims", kit.AnnotationHostname: "claims-one"}
		})
		Eventually(func() error { _, err := tailscaleService("svc:claims-one"); return err }).Should(Succeed())

		patch := client.MergeFrom(svc.DeepCopy())
		svc.Annotations[kit.AnnotationHostname] = "claims-two"
		Expect(k8s.Patch(ctx, svc, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			_, err := tailscaleService("svc:claims-two")
			g.Expect(err).NotTo(HaveOccurred())
			_, err = tailscaleService("svc:claims-one")
			g.Expect(tailnet.IsNotFound(err)).To(BeTrue(), "the old name's Tailscale Service is released: %v", err)
		}).Should(Succeed())

		Expect(k8s.Delete(ctx, svc)).To(Succeed())
		Eventually(func(g Gomega) {
			_, err := tailscaleService("svc:claims-two")
			g.Expect(tailnet.IsNotFound(err)).To(BeTrue(), "released with the Service: %v", err)
		}).Should(Succeed())
	})
})

var _ = Describe("A Service on a ProxyGroup when a step fails", func() {
	It("reports a control-plane outage as not configured, leaving validity undecided, and recovers", func() {
		pg := newProxyGroup("ha-outage", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)
		Eventually(func(g Gomega) { replicaConfig(g, "ha-outage", 0) }).Should(Succeed())
		tsnet.InjectAPIFault(localtailnet.APIFault{Status: 503, Times: 1000})
		DeferCleanup(tsnet.ClearAPIFaults)

		ns := newNamespace()
		svc := newService(ns, "outage", func(s *corev1.Service) {
			s.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha-outage"}
		})
		Eventually(serviceCondition(svc, kit.ConditionIngressSvcConfigured)).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonIngressSvcCreateFailed)))
		Expect(meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionIngressSvcValid)).To(BeNil(),
			"an outage of the tailnet API says nothing about whether the Service is valid")
		Eventually(func(g Gomega) []string { return eventReasons(g, "Service", svc.Name) }).Should(ContainElement(kit.ReasonTailnetAPIFailed))

		By("becoming valid once the API answers again")
		tsnet.ClearAPIFaults()
		patch := client.MergeFrom(svc.DeepCopy())
		svc.Annotations["touch"] = "1"
		Expect(k8s.Patch(ctx, svc, patch)).To(Succeed())
		Eventually(serviceCondition(svc, kit.ConditionIngressSvcValid)).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonIngressSvcValid)))
		Expect(dnatEntry("ha-outage", "svc:"+ns+"-outage").Destination.IPs).To(Equal(svc.Spec.ClusterIPs))
	})

	It("waits for the group's ConfigMap instead of calling the group full", func() {
		// A group whose ProxyClass does not exist creates no children, its ConfigMap included.
		pg := newProxyGroup("ha-nocm", func(p *tsv1alpha1.ProxyGroup) { p.Spec.ProxyClass = "ha-nocm-missing" })
		DeferCleanup(k8s.Delete, ctx, pg)
		ns := newNamespace()
		svc := newService(ns, "nocm", func(s *corev1.Service) {
			s.Annotations = map[string]string{kit.AnnotationProxyGroup: "ha-nocm"}
		})
		Eventually(serviceCondition(svc, kit.ConditionIngressSvcValid)).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(serviceCondition(svc, kit.ConditionIngressSvcConfigured)).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonIngressSvcNoBackends)))
		Consistently(func(g Gomega) string { return serviceCondition(svc, kit.ConditionIngressSvcConfigured)(g).Reason }, "1s").
			ShouldNot(Equal(kit.ReasonConfigMapFull))
		Expect(eventReasons(Default, "Service", svc.Name)).NotTo(ContainElement(kit.ReasonConfigMapFull))
	})
})
