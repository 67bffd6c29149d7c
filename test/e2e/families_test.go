//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"net/netip"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/test/framework"
)

// On a dual-stack or IPv6-only cluster (make kind KIND_IP_FAMILY=...): each tailnet address of an
// L3 Service is DNATed to the ClusterIP of its own family (docs/ipv6.md); a family the Service
// lacks is neither forwarded nor advertised, and a connection to it is refused at once.
var _ = Describe("IP families", func() {
	BeforeEach(func() {
		if suite.ipFamily == "ipv4" {
			Skip("an IPv4-only cluster (E2E_IP_FAMILY=ipv4)")
		}
		if suite.skipL3 != "" {
			Skip("L3: " + suite.skipL3)
		}
	})

	// families lists the ClusterIP families a Service of policy gets on this cluster.
	families := func(policy corev1.IPFamilyPolicy) (v4, v6 bool) {
		if suite.ipFamily == "ipv6" {
			return false, true
		}
		return true, policy != corev1.IPFamilyPolicySingleStack
	}

	DescribeTable("forwards a standalone L3 Service at the tailnet addresses of its families", func(ctx SpecContext, policy corev1.IPFamilyPolicy) {
		if policy == corev1.IPFamilyPolicyRequireDualStack && suite.ipFamily != "dual" {
			Skip("RequireDualStack needs a dual-stack cluster")
		}
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		svc := framework.BackendService(ns, "db", corev1.ServiceTypeLoadBalancer)
		svc.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
		svc.Spec.IPFamilyPolicy = ptr.To(policy)
		suite.Create(ctx, svc)
		want4, want6 := families(policy)
		addrs := awaitFamilies(ctx, svc, kit.ConditionProxyReady, "", want4, want6)
		Expect(svc.Spec.ClusterIPs).To(HaveLen(len(addrs)))
		expectEchoAt(ctx, addrs)
		if !want4 {
			By("refusing TCP at once at the tailnet IPv4 address, which the IPv6-only Service lacks")
			a := proxyTailnetAddr(ctx, svc, true)
			start := time.Now()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			conn, err := suite.Dial(dctx, "tcp", netip.AddrPortFrom(a, framework.HTTPPort).String())
			if err == nil {
				conn.Close()
			}
			Expect(err).To(HaveOccurred(), "a connection to %s", a)
			Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second), "refused, not left to time out: %v", err)
		}
	},
		Entry("SingleStack", corev1.IPFamilyPolicySingleStack),
		Entry("PreferDualStack", corev1.IPFamilyPolicyPreferDualStack),
		Entry("RequireDualStack", corev1.IPFamilyPolicyRequireDualStack),
	)

	It("forwards an HA Service at the VIPs of its families on a ProxyGroup", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		pg := framework.ProxyGroup("e2e-fam-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		suite.WaitGroupReady(ctx, pg)
		svc := framework.BackendService(ns, "db", corev1.ServiceTypeLoadBalancer)
		svc.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
		svc.Annotations = map[string]string{kit.AnnotationProxyGroup: pg.Name}
		suite.Create(ctx, svc)
		want4, want6 := families(corev1.IPFamilyPolicyPreferDualStack)
		expectEchoAt(ctx, awaitFamilies(ctx, svc, kit.ConditionIngressSvcConfigured, "2/2 ", want4, want6))
	})
})

// awaitFamilies waits until the Service's condition of type cond is True (its message starting
// with prefix) and its status.loadBalancer.ingress lists an address of each family wanted and
// none of the others, and returns those addresses.
func awaitFamilies(ctx context.Context, svc *corev1.Service, cond, prefix string, want4, want6 bool) []netip.Addr {
	GinkgoHelper()
	var v4, v6 netip.Addr
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
		c := meta.FindStatusCondition(svc.Status.Conditions, cond)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
		g.Expect(c.Message).To(HavePrefix(prefix))
		v4, v6 = statusAddrs(svc.Status.LoadBalancer.Ingress)
		g.Expect(v4.IsValid()).To(Equal(want4), "an IPv4 address listed in %v", svc.Status.LoadBalancer.Ingress)
		g.Expect(v6.IsValid()).To(Equal(want6), "an IPv6 address listed in %v", svc.Status.LoadBalancer.Ingress)
	}).Should(Succeed(), "Service %s served, its status listing the tailnet address of each of its families", svc.Name)
	var out []netip.Addr
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	return out
}

// expectEchoAt expects the backend's TCP and UDP echo at each address.
func expectEchoAt(ctx context.Context, addrs []netip.Addr) {
	GinkgoHelper()
	hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DialContext: suite.Dial}}
	defer hc.CloseIdleConnections()
	for _, a := range addrs {
		expectEcho(ctx, hc, "http://"+netip.AddrPortFrom(a, framework.HTTPPort).String())
		expectUDPEcho(ctx, netip.AddrPortFrom(a, framework.UDPPort))
	}
}

// statusAddrs are the IPv4 and the IPv6 address a status.loadBalancer.ingress lists (invalid
// where none).
func statusAddrs(lb []corev1.LoadBalancerIngress) (v4, v6 netip.Addr) {
	for _, in := range lb {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			if a.Is4() {
				v4 = a
			} else {
				v6 = a
			}
		}
	}
	return v4, v6
}

// proxyTailnetAddr is the standalone proxy's own tailnet address of a family, as the suite's
// client sees its peer (the Service's status lists only the families forwarded).
func proxyTailnetAddr(ctx context.Context, svc *corev1.Service, v4 bool) netip.Addr {
	GinkgoHelper()
	host := ""
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.Hostname != "" {
			host = in.Hostname
		}
	}
	Expect(host).NotTo(BeEmpty(), "the Service's tailnet name in %v", svc.Status.LoadBalancer.Ingress)
	var out netip.Addr
	Eventually(ctx, func(g Gomega) {
		for _, a := range peerAddrs(ctx, g, host) {
			if a.Is4() == v4 {
				out = a
			}
		}
		g.Expect(out.IsValid()).To(BeTrue(), "an address of %s of the family", host)
	}).Should(Succeed())
	return out
}

// peerAddrs are the tailnet addresses of the peer named fqdn, as the suite's client sees it.
func peerAddrs(ctx context.Context, g Gomega, fqdn string) []netip.Addr {
	lc, err := suite.Client.LocalClient()
	g.Expect(err).NotTo(HaveOccurred())
	st, err := lc.Status(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	for _, p := range st.Peer {
		if p.DNSName == fqdn+"." || p.DNSName == fqdn {
			return p.TailscaleIPs
		}
	}
	return nil
}
