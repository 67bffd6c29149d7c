//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
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

// proxyProtocolPort is the port the PROXY protocol backend answers on, TCP and UDP.
const proxyProtocolPort = 7000

// tailscale.com/proxy-protocol on an L3 Service (docs/l3.md): the backend, which parses the header
// with go-proxyproto, reads the suite client's tailnet address as the source and the address it
// connected to as the destination, over TCP and UDP, standalone and on a ProxyGroup; a version the
// operator does not know is refused with a stable reason.
var _ = Describe("PROXY protocol", func() {
	BeforeEach(func() {
		if suite.skipL3 != "" {
			Skip("L3: " + suite.skipL3)
		}
		if suite.proxyProtocolImage == "" {
			Skip("no PROXY protocol backend image (E2E_PROXYPROTOCOL_IMAGE)")
		}
	})

	It("passes the caller's tailnet address to a standalone L3 Service's backend, TCP and UDP", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		svc := proxyProtocolBackend(ctx, ns, "v2", corev1.ProtocolTCP, corev1.ProtocolUDP)
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		svc.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
		suite.Create(ctx, svc)
		for _, a := range awaitServedAddrs(ctx, svc, kit.ConditionProxyReady, "") {
			expectProxyHeader(ctx, "tcp", 2, a)
			expectProxyHeader(ctx, "udp", 2, a)
		}

		By("refusing a version it does not know, with a stable reason")
		bad := proxyProtocolService(ns, "bad", "v3", corev1.ProtocolTCP)
		bad.Annotations[kit.AnnotationExpose] = "true"
		suite.Create(ctx, bad)
		Eventually(ctx, func(g Gomega) {
			g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(bad), bad)).To(Succeed())
			c := meta.FindStatusCondition(bad.Status.Conditions, kit.ConditionProxyReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(kit.ReasonProxyInvalid))
			g.Expect(c.Message).To(ContainSubstring(kit.AnnotationProxyProtocol))
			var events corev1.EventList
			g.Expect(suite.K8s.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
			g.Expect(events.Items).To(ContainElement(And(
				HaveField("InvolvedObject.Name", bad.Name),
				HaveField("Type", corev1.EventTypeWarning),
				HaveField("Reason", kit.ReasonInvalidAnnotation))))
		}).Should(Succeed(), "the Service with proxy-protocol v3 refused, with a Warning Event")
	})

	It("passes the caller's tailnet address to an HA Service's backend through its VIP (v1)", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		pg := framework.ProxyGroup("e2e-pp-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		svc := proxyProtocolBackend(ctx, ns, "1", corev1.ProtocolTCP)
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer // its status lists the VIPs
		svc.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
		svc.Annotations[kit.AnnotationProxyGroup] = pg.Name
		suite.WaitGroupReady(ctx, pg)
		suite.Create(ctx, svc)
		for _, a := range awaitServedAddrs(ctx, svc, kit.ConditionIngressSvcConfigured, "2/2 ") {
			expectProxyHeader(ctx, "tcp", 1, a)
		}
	})
})

// proxyProtocolService is a Service of the PROXY protocol backend's Pods in ns, annotated with
// version, on proxyProtocolPort for each protocol.
func proxyProtocolService(ns, name, version string, protocols ...corev1.Protocol) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{kit.AnnotationProxyProtocol: version}},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "proxyprotocol-echo"}},
	}
	for _, p := range protocols {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: strings.ToLower(string(p)) + "-echo", Port: proxyProtocolPort, Protocol: p})
	}
	return svc
}

// proxyProtocolBackend runs the PROXY protocol backend in ns, waits until it is available, and
// returns a Service for it (not created) annotated with version.
func proxyProtocolBackend(ctx context.Context, ns, version string, protocols ...corev1.Protocol) *corev1.Service {
	GinkgoHelper()
	suite.RunWorkload(ctx, ns, "proxyprotocol-echo", suite.proxyProtocolImage, fmt.Sprintf("--port=%d", proxyProtocolPort))
	return proxyProtocolService(ns, "db", version, protocols...)
}

// awaitServedAddrs waits until the Service's condition cond is True (its message starting with
// prefix) and its status lists its tailnet address, and returns it.
func awaitServedAddrs(ctx context.Context, svc *corev1.Service, cond, prefix string) []netip.Addr {
	GinkgoHelper()
	// A Service of the default policy: of the cluster's first family.
	return awaitFamilies(ctx, svc, cond, prefix, suite.ipFamily != "ipv6", suite.ipFamily == "ipv6")
}

// expectProxyHeader expects the backend at a's proxyProtocolPort to read, over network, a PROXY
// protocol header of version naming the suite client's tailnet address of a's family as the
// source and a as the destination.
func expectProxyHeader(ctx context.Context, network string, version int, a netip.Addr) {
	GinkgoHelper()
	ip4, ip6 := suite.Client.TailscaleIPs()
	client := ip4
	if a.Is6() {
		client = ip6
	}
	dst := netip.AddrPortFrom(a, proxyProtocolPort)
	Eventually(ctx, func(g Gomega) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, err := suite.Dial(dctx, network, dst.String())
		g.Expect(err).NotTo(HaveOccurred())
		defer c.Close()
		g.Expect(c.SetDeadline(time.Now().Add(5 * time.Second))).To(Succeed())
		payload := "hello " + network
		var answer []byte
		if network == "tcp" {
			_, err = io.WriteString(c, payload+"\n")
			g.Expect(err).NotTo(HaveOccurred())
			answer, err = io.ReadAll(c)
		} else {
			_, err = io.WriteString(c, payload)
			g.Expect(err).NotTo(HaveOccurred())
			buf := make([]byte, 1500)
			var n int
			n, err = c.Read(buf)
			answer = buf[:n]
		}
		g.Expect(err).NotTo(HaveOccurred())
		src := netip.MustParseAddrPort(c.LocalAddr().String())
		g.Expect(src.Addr()).To(Equal(client), "the suite client's own address")
		g.Expect(string(answer)).To(Equal(fmt.Sprintf("v%d %s %s %s", version, src, dst, payload)))
	}).Should(Succeed(), "the backend reads the caller's tailnet address in a v%d header over %s at %s", version, network, dst)
}
