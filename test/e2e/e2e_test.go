//go:build e2e

package e2e

import (
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/test/framework"
)

var _ = Describe("A standalone Ingress", func() {
	It("is served over HTTPS on its tailnet name with a trusted certificate", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		host := "e2e-l7-" + framework.Token()
		ing := framework.Ingress(ns, "web", host, "")
		suite.Create(ctx, ing)
		fqdn := suite.ServedName(ctx, ing)
		expectHTTPSEcho(ctx, fqdn)

		// The backend learns who called from the proxy alone: the caller's tailnet address, and no
		// identity header the caller made up (a tagged device has no user identity to pass on).
		hc := tailnetHTTPClient(15 * time.Second)
		defer hc.CloseIdleConnections()
		header := func(key string, sent http.Header) string {
			v, err := get(ctx, hc, "https://"+fqdn+"/header?key="+key, sent)
			Expect(err).NotTo(HaveOccurred(), "GET /header?key=%s", key)
			return v
		}
		ip4, _ := suite.Client.TailscaleIPs()
		Expect(header("X-Forwarded-For", http.Header{"X-Forwarded-For": {"203.0.113.9"}})).To(Equal(ip4.String()), "X-Forwarded-For")
		Expect(header("X-Forwarded-Proto", nil)).To(Equal("https"))
		Expect(header("Tailscale-User-Login", http.Header{"Tailscale-User-Login": {"mallory@example.com"}})).To(BeEmpty(), "a forged identity header reached the backend")
	})

	It("leaves nothing behind once deleted: no proxy StatefulSet, no Secrets, no device", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		ing := framework.Ingress(ns, "gone", "e2e-gone-"+framework.Token(), "")
		suite.Create(ctx, ing)
		deviceID := proxyDevice(ctx, "ingress", ing)
		Expect(suite.K8s.Delete(ctx, ing)).To(Succeed())
		expectProxyGone(ctx, "ingress", ing, deviceID)
	})
})

var _ = Describe("A standalone L3 Service", func() {
	// Forwarding in the proxy Pod's network namespace is turned on by a privileged init container,
	// or, for a ProxyClass that sets it, by the Pod's sysctls (which the kubelet must allow).
	DescribeTable("forwards TCP and UDP at its tailnet IP to the Service", func(ctx SpecContext, podSysctls bool) {
		if suite.skipL3 != "" {
			Skip("L3: " + suite.skipL3)
		}
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		svc := framework.BackendService(ns, "db", corev1.ServiceTypeLoadBalancer)
		svc.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
		if podSysctls {
			pc := &tsv1alpha1.ProxyClass{
				ObjectMeta: metav1.ObjectMeta{Name: "e2e-sysctl-" + framework.Token()},
				Spec: tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{
					SecurityContext: &corev1.PodSecurityContext{Sysctls: forwardingSysctls()},
				}}},
			}
			suite.Create(ctx, pc)
			svc.Labels = map[string]string{kit.LabelProxyClass: pc.Name}
		}
		suite.Create(ctx, svc)
		var ip netip.Addr
		Eventually(ctx, func(g Gomega) {
			g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
			c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionProxyReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
			lb := svc.Status.LoadBalancer.Ingress
			g.Expect(len(lb)).To(BeNumerically(">=", 2), "the tailnet name and IPs")
			g.Expect(lb[0].Hostname).To(HavePrefix(ns + "-db."))
			for _, in := range lb[1:] {
				if a, err := netip.ParseAddr(in.IP); err == nil && inServiceFamily(a) {
					ip = a
				}
			}
			g.Expect(ip.IsValid()).To(BeTrue(), "a tailnet IP of the Service's family in %v", lb)
		}).Should(Succeed(), "Service ready")
		hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DialContext: suite.Dial}}
		defer hc.CloseIdleConnections()
		expectEcho(ctx, hc, "http://"+netip.AddrPortFrom(ip, framework.HTTPPort).String())
		expectUDPEcho(ctx, netip.AddrPortFrom(ip, framework.UDPPort))

		if suite.localBackend != "" {
			return // no kubelet runs init containers or applies sysctls here
		}
		pod := proxyPod(ctx, "svc", ns, svc.Name, true)
		if podSysctls {
			Expect(pod.Spec.InitContainers).To(BeEmpty(), "an init container although the Pod's sysctls forward")
			return
		}
		Expect(pod.Status.InitContainerStatuses).To(HaveLen(1))
		st := pod.Status.InitContainerStatuses[0]
		Expect(st.Name).To(Equal("sysctler"))
		Expect(st.State.Terminated).NotTo(BeNil(), "the init container's state %+v", st.State)
		Expect(st.State.Terminated.ExitCode).To(BeZero())
	},
		Entry("with the privileged init container", false),
		Entry("with the Pod's sysctls from its ProxyClass", true),
	)
})

var _ = Describe("An Ingress on a ProxyGroup", func() {
	It("is served over HTTPS through its Tailscale Service by the group's replicas", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		pg := framework.ProxyGroup("e2e-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		host := "e2e-ha-" + framework.Token()
		ing := framework.Ingress(ns, "web", host, pg.Name)
		suite.Create(ctx, ing)
		suite.WaitGroupReady(ctx, pg)
		fqdn := suite.ServedName(ctx, ing)
		svc, err := suite.API.Service(ctx, "svc:"+host)
		Expect(err).NotTo(HaveOccurred(), "the Tailscale Service")
		Expect(svc.Name).To(Equal("svc:" + host))
		expectHTTPSEcho(ctx, fqdn)

		By("writing each replica's config in the newest version alone once its proxy reports it reads that")
		for i := range 2 {
			Eventually(ctx, func(g Gomega) []string {
				s := &corev1.Secret{}
				g.Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: suite.opNS, Name: fmt.Sprintf("%s-%d-config", pg.Name, i)}, s)).To(Succeed())
				return slices.Sorted(maps.Keys(s.Data))
			}).Should(Equal([]string{contract.ProxyConfigs.Keys()[0]}), "replica %d's config", i)
		}
	})
})

var _ = Describe("Bad input", func() {
	It("gets Warning Events with stable reasons", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		// The reasons are part of the user-facing contract, hence literal.
		// A host the API accepts, whose first label (the tailnet hostname) is too long for one.
		bad := framework.Ingress(ns, "bad-host", strings.Repeat("x", 64)+".example.com", "")
		suite.Create(ctx, bad)
		expectWarning(ctx, bad, "InvalidHostname")
		orphan := framework.Ingress(ns, "no-group", "e2e-orphan-"+framework.Token(), "missing-"+framework.Token())
		suite.Create(ctx, orphan)
		expectWarning(ctx, orphan, "ProxyGroupNotFound")
	})
})

// forwardingSysctls turn forwarding on for the cluster's families.
func forwardingSysctls() []corev1.Sysctl {
	v4 := corev1.Sysctl{Name: "net.ipv4.ip_forward", Value: "1"}
	v6 := corev1.Sysctl{Name: "net.ipv6.conf.all.forwarding", Value: "1"}
	switch suite.ipFamily {
	case "ipv6":
		return []corev1.Sysctl{v6}
	case "dual":
		return []corev1.Sysctl{v4, v6}
	}
	return []corev1.Sysctl{v4}
}
