//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/test/framework"
)

// A ProxyGroup keeps serving an Ingress (HTTPS) and a Service (L3 TCP) under a steady load while
// one replica's Pod is deleted and the other is evicted as a node drain evicts it.
var _ = Describe("A ProxyGroup under load", func() {
	It("serves HTTPS and L3 TCP through a replica deletion and a drain's eviction", func(ctx SpecContext) {
		pg, https, tcp := servedGroup(ctx, "chaos-ha")

		moves, err := watchRoutes(ctx)
		Expect(err).NotTo(HaveOccurred())
		const rate, window = 20, 60 * time.Second
		start := time.Now()
		stopHTTPS, stopTCP := background(ctx, rate, https), background(ctx, rate, tcp)
		time.Sleep(10 * time.Second)

		By("deleting replica 0's Pod")
		deletedBack := replaceReplica(ctx, pg.Name+"-0", func(p *corev1.Pod) {
			Expect(suite.K8s.Delete(ctx, p)).To(Succeed())
		})
		time.Sleep(time.Until(start.Add(35 * time.Second)))

		By("draining replica 1 as kubectl drain does: cordon, evict, uncordon once it is gone")
		evictedBack := replaceReplica(ctx, pg.Name+"-1", func(p *corev1.Pod) {
			setUnschedulable(ctx, p.Spec.NodeName, true)
			DeferCleanup(setUnschedulable, context.WithoutCancel(ctx), p.Spec.NodeName, false)
			Expect(suite.Clientset.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{
				ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})).To(Succeed())
			// One node: the replacement has nowhere else to go.
			Eventually(ctx, func(g Gomega) {
				now := &corev1.Pod{}
				err := suite.K8s.Get(ctx, client.ObjectKeyFromObject(p), now)
				g.Expect(err != nil || now.UID != p.UID).To(BeTrue(), "the evicted Pod gone")
			}).Should(Succeed())
			setUnschedulable(ctx, p.Spec.NodeName, false)
		})
		// The window runs on for 10s at least after the last replacement is Ready.
		time.Sleep(max(time.Until(start.Add(window)), 10*time.Second))
		h, t := stopHTTPS(), stopTCP()
		took := time.Since(start)

		suite.report.add("### A ProxyGroup under load\n\nA ProxyGroup of 2 replicas serving an Ingress (HTTPS) and a Service (L3 TCP), "+
			"each loaded with %d requests/s for %s, every request on a new connection through the tailnet, with a 5s timeout. "+
			"At 10s replica 0's Pod is deleted (its replacement Ready %s later); at 35s the node is cordoned and replica 1 evicted "+
			"through the Eviction API, as `kubectl drain` does, then uncordoned (replacement Ready %s after the eviction). "+
			"Goal, which the spec asserts: no request fails but one in flight at the instant the client's route to its service "+
			"moves, which fails whatever the proxies do, since the client then drops what the old host sends from the service's "+
			"address. The route moved %d times (watched in the client's netmaps).\n\n| Traffic | Requests | Failed | of which in flight at a route move |\n| --- | --- | --- | --- |\n"+
			"| HTTPS (Ingress) | %d | %d | %d |\n| L3 TCP (Service) | %d | %d | %d |\n\n%s\n",
			rate, took.Round(time.Second), deletedBack.Round(100*time.Millisecond), evictedBack.Round(100*time.Millisecond),
			moves.count(), h.sent, h.failed, h.atMoves(moves), t.sent, t.failed, t.atMoves(moves), failures(h, t))
		for what, r := range map[string]loadResult{"HTTPS": h, "L3 TCP": t} {
			Expect(r.sent).To(BeNumerically(">", rate*50), "%s requests sent", what)
			Expect(r.failed-int64(r.atMoves(moves))).To(BeZero(), "%s requests failed away from any route move: %s", what, r)
		}
	})
})

// servedGroup makes a ProxyGroup of 2 replicas (named from prefix) serving an Ingress (HTTPS)
// and a Service (L3 TCP) of a namespace of its own, and returns the group and a request for each,
// once both replicas advertise both services.
func servedGroup(ctx context.Context, prefix string) (*tsv1alpha1.ProxyGroup, request, request) {
	GinkgoHelper()
	ns := suite.NewNamespace(ctx, prefix)
	suite.StartBackend(ctx, ns, suite.image)
	pg := framework.ProxyGroup(prefix+"-"+framework.Token(), 2)
	suite.Create(ctx, pg)
	ing := framework.Ingress(ns, "web", prefix+"-web-"+framework.Token(), pg.Name)
	suite.Create(ctx, ing)
	svc := l3Service(ns, "db", pg.Name)
	suite.Create(ctx, svc)
	suite.WaitGroupReady(ctx, pg)
	https, tcp := httpsEcho(suite.ServedName(ctx, ing)), tcpEcho(serviceIP(ctx, svc))
	expectServing(ctx, https, "the Ingress")
	expectServing(ctx, tcp, "the Service")
	Eventually(ctx, func(g Gomega) {
		for i := range 2 {
			g.Expect(state(ctx, g, fmt.Sprintf("%s-%d", pg.Name, i)).Advertised).To(HaveLen(2), "replica %d", i)
		}
	}).Should(Succeed())
	return pg, https, tcp
}

// replaceReplica does something to a replica's Pod and waits until its replacement is Ready,
// returning how long that took.
func replaceReplica(ctx context.Context, name string, do func(*corev1.Pod)) time.Duration {
	GinkgoHelper()
	old, err := suite.FindPod(ctx, proxyNS(), name)
	Expect(err).NotTo(HaveOccurred())
	start := time.Now()
	do(old)
	Eventually(ctx, func(g Gomega) {
		p, err := suite.FindPod(ctx, proxyNS(), name)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(p.UID).NotTo(Equal(old.UID))
		g.Expect(framework.PodReady(p)).To(BeTrue())
	}).WithTimeout(3*time.Minute).Should(Succeed(), "%s replaced and Ready", name)
	return time.Since(start)
}

func setUnschedulable(ctx context.Context, node string, on bool) {
	GinkgoHelper()
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%v}}`, on)
	_, err := suite.Clientset.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	Expect(err).NotTo(HaveOccurred())
}

// failures names the first failed requests of load results, if any.
func failures(rs ...loadResult) string {
	var s string
	for _, r := range rs {
		for _, e := range r.errs {
			s += "- " + e + "\n"
		}
	}
	if s == "" {
		return ""
	}
	return "First failures:\n\n" + s
}
