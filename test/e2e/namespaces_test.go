//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/test/framework"
)

// With the restricted overlay the operator's namespace enforces the restricted Pod Security
// standard, and proxies on the kernel data path run their Pods in a privileged namespace of
// their own that holds no Secret.
var _ = Describe("The namespace split", Ordered, func() {
	const enforce = "pod-security.kubernetes.io/enforce"

	BeforeAll(func() {
		if suite.privNS == "" {
			Skip("the operator runs every proxy in its own namespace (E2E_PRIVILEGED_NAMESPACE unset: not the restricted overlay)")
		}
		if suite.skipL3 != "" {
			Skip("L3: " + suite.skipL3)
		}
	})

	It("runs the operator in a namespace that enforces restricted, and kernel proxies apart", func(ctx SpecContext) {
		for ns, level := range map[string]string{suite.opNS: "restricted", suite.privNS: "privileged"} {
			n := &corev1.Namespace{}
			Expect(suite.K8s.Get(ctx, client.ObjectKey{Name: ns}, n)).To(Succeed())
			Expect(n.Labels).To(HaveKeyWithValue(enforce, level), "namespace %s", ns)
		}
		pods := &corev1.PodList{}
		Expect(suite.K8s.List(ctx, pods, client.InNamespace(suite.opNS), client.MatchingLabels{"app.kubernetes.io/component": "operator"})).To(Succeed())
		Expect(pods.Items).NotTo(BeEmpty())
		Expect(framework.PodReady(&pods.Items[0])).To(BeTrue(), "the operator runs under restricted")
	})

	It("moves a ProxyGroup's replicas to the privileged namespace one at a time when a Service is put on it, and back, serving HTTPS throughout", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		pg := framework.ProxyGroup("e2e-split-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		suite.WaitGroupReady(ctx, pg)
		ing := framework.Ingress(ns, "web", "e2e-split-"+framework.Token(), pg.Name)
		suite.Create(ctx, ing)
		fqdn := suite.ServedName(ctx, ing)
		expectHTTPSEcho(ctx, fqdn)
		expectReplicasIn(ctx, pg.Name, suite.opNS, 2)
		for i := range 2 {
			p := groupPod(ctx, fmt.Sprintf("%s-%d", pg.Name, i))
			Expect(p.Spec.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()), "an HTTPS-only replica runs unprivileged")
			Expect(p.Spec.InitContainers).To(BeEmpty())
		}

		hc := tailnetHTTPClient(5 * time.Second)
		defer hc.CloseIdleConnections()
		l := steadyLoad(ctx, func(ctx context.Context) error { return echoOnce(ctx, hc, "https://"+fqdn) })
		time.Sleep(3 * time.Second)
		putOn := l.mark()
		svc := framework.BackendService(ns, "db", corev1.ServiceTypeLoadBalancer)
		svc.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
		svc.Annotations = map[string]string{kit.AnnotationProxyGroup: pg.Name}
		suite.Create(ctx, svc)
		expectReplicasIn(ctx, pg.Name, suite.privNS, 2)
		moved := time.Since(putOn)
		time.Sleep(5 * time.Second)
		loss := l.finish("move to "+suite.privNS, fmt.Sprintf("Service put on %s: both replicas Ready in %s after %s", pg.Name, suite.privNS, moved.Round(100*time.Millisecond)))
		Expect(loss).To(BeNumerically("<=", maxFailoverLoss), "share of HTTPS requests lost while the replicas moved")
		for i := range 2 {
			p := groupPod(ctx, fmt.Sprintf("%s-%d", pg.Name, i))
			Expect(p.Namespace).To(Equal(suite.privNS))
			Expect(p.Spec.InitContainers).NotTo(BeEmpty(), "a replica serving L3 has the forwarding init container")
		}

		By("serving the Service at its VIP from there")
		var vip netip.Addr
		Eventually(ctx, func(g Gomega) {
			g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
			c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionIngressSvcConfigured)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
			for _, in := range svc.Status.LoadBalancer.Ingress {
				if a, err := netip.ParseAddr(in.IP); err == nil && inServiceFamily(a) {
					vip = a
				}
			}
			g.Expect(vip.IsValid()).To(BeTrue())
		}).Should(Succeed())
		tcp := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: suite.Dial}}
		defer tcp.CloseIdleConnections()
		expectEcho(ctx, tcp, "http://"+netip.AddrPortFrom(vip, framework.HTTPPort).String())

		By("keeping no Secret where privileged Pods run")
		secrets := &corev1.SecretList{}
		Expect(suite.K8s.List(ctx, secrets, client.InNamespace(suite.privNS))).To(Succeed())
		Expect(secrets.Items).To(BeEmpty())

		By("moving back once the Service is gone")
		Expect(suite.K8s.Delete(ctx, svc)).To(Succeed())
		expectReplicasIn(ctx, pg.Name, suite.opNS, 2)
		expectHTTPSEcho(ctx, fqdn)
	})
})

// expectReplicasIn waits until every replica of group runs Ready in ns, and its StatefulSet
// nowhere else.
func expectReplicasIn(ctx context.Context, group, ns string, n int) {
	GinkgoHelper()
	Eventually(ctx, func(g Gomega) {
		for _, other := range proxyNamespaces() {
			if other != ns {
				err := suite.K8s.Get(ctx, client.ObjectKey{Namespace: other, Name: group}, &appsv1.StatefulSet{})
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "StatefulSet %s/%s gone (%v)", other, group, err)
			}
		}
		for i := range n {
			var p corev1.Pod
			g.Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("%s-%d", group, i)}, &p)).To(Succeed())
			g.Expect(framework.PodReady(&p)).To(BeTrue(), "replica %d Ready in %s", i, ns)
		}
	}, "4m").Should(Succeed(), "the replicas of %s in %s", group, ns)
}
