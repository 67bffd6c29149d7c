//go:build chaos

package chaos

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/test/framework"
)

// The original's users see some ten minutes of lost traffic when a replica and the operator die
// together (tailscale/tailscale#20661). Here failover needs no operator: the replicas advertise
// their Tailscale Services themselves, and a Pod the StatefulSet controller brings back serves
// from its own config and state. The operator is scaled to zero and a replica's Pod killed (no
// grace) at the same moment, under steady HTTPS and L3 TCP load; the operator stays down to the end.
var _ = Describe("A ProxyGroup whose operator dies with a replica", func() {
	It("keeps serving, and recovers within 15s without the operator", func(ctx SpecContext) {
		pg, https, tcp := servedGroup(ctx, "chaos-fo")

		const rate = 20
		stopHTTPS, stopTCP := background(ctx, rate, https), background(ctx, rate, tcp)
		time.Sleep(10 * time.Second)

		By("scaling the operator to zero and killing replica 0's Pod at the same moment")
		deploy := &appsv1.Deployment{}
		Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: "operator"}, deploy)).To(Succeed())
		replicas := ptr.Deref(deploy.Spec.Replicas, 1)
		DeferCleanup(func(ctx context.Context) {
			scaleOperator(ctx, replicas)
			operatorPod(ctx)
		}, NodeTimeout(3*time.Minute))
		victim, err := suite.FindPod(ctx, proxyNS(), pg.Name+"-0")
		Expect(err).NotTo(HaveOccurred())
		killed := time.Now()
		scaleOperator(ctx, 0)
		Expect(suite.K8s.Delete(ctx, victim, client.GracePeriodSeconds(0))).To(Succeed())
		for _, p := range operatorPodsNow(ctx) {
			Expect(client.IgnoreNotFound(suite.K8s.Delete(ctx, &p, client.GracePeriodSeconds(0)))).To(Succeed())
		}

		By("serving on while the operator stays down, until the replica is back and has served 10s")
		var back time.Duration
		Eventually(ctx, func(g Gomega) {
			p, err := suite.FindPod(ctx, proxyNS(), pg.Name+"-0")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.UID).NotTo(Equal(victim.UID))
			g.Expect(framework.PodReady(p)).To(BeTrue())
			back = time.Since(killed)
		}).WithTimeout(3 * time.Minute).Should(Succeed())
		time.Sleep(10 * time.Second)
		Expect(operatorPodsNow(ctx)).To(BeEmpty(), "the operator stayed down")
		h, t := stopHTTPS(), stopTCP()

		recovery := func(r loadResult) time.Duration {
			var last time.Time
			for _, s := range r.spans {
				if s.end.After(last) {
					last = s.end
				}
			}
			if last.Before(killed) {
				return 0
			}
			return last.Sub(killed)
		}
		suite.report.add("### Failover with the operator down\n\nA ProxyGroup of 2 replicas serving an Ingress (HTTPS) and a Service "+
			"(L3 TCP), each loaded with %d requests/s on new connections through the tailnet. The operator's Deployment is scaled "+
			"to zero and its Pod killed, and replica 0's Pod killed without grace, at the same moment; the operator stays down to "+
			"the end. Replica 0's replacement Ready %s after the kill. Goal (asserted): traffic recovers within 15s of the kill, "+
			"the last failed request ending earlier.\n\n| Traffic | Requests | Failed | Last failure after the kill |\n| --- | --- | --- | --- |\n"+
			"| HTTPS (Ingress) | %d | %d | %s |\n| L3 TCP (Service) | %d | %d | %s |\n\n%s\n",
			rate, back.Round(100*time.Millisecond), h.sent, h.failed, recovery(h).Round(100*time.Millisecond),
			t.sent, t.failed, recovery(t).Round(100*time.Millisecond), failures(h, t))
		for what, r := range map[string]loadResult{"HTTPS": h, "L3 TCP": t} {
			Expect(r.sent).To(BeNumerically(">", rate*20), "%s requests sent", what)
			Expect(recovery(r)).To(BeNumerically("<", 15*time.Second), "%s: the last failure after the kill: %s", what, r)
		}
	})
})

// scaleOperator sets the operator Deployment's replicas.
func scaleOperator(ctx context.Context, n int32) {
	GinkgoHelper()
	deploy := &appsv1.Deployment{}
	Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: "operator"}, deploy)).To(Succeed())
	patch := client.MergeFrom(deploy.DeepCopy())
	deploy.Spec.Replicas = ptr.To(n)
	Expect(suite.K8s.Patch(ctx, deploy, patch)).To(Succeed())
}

// operatorPodsNow lists the operator's Pods that are not being deleted.
func operatorPodsNow(ctx context.Context) []corev1.Pod {
	GinkgoHelper()
	pods := &corev1.PodList{}
	Expect(suite.K8s.List(ctx, pods, client.InNamespace(opNS), operatorPods)).To(Succeed())
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}
