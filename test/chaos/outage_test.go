//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/test/framework"
)

const outage = 60 * time.Second

// Established traffic needs neither the API server nor the tailnet's control server: each may
// be gone for a minute while proxies serve, and the operator rides it out without a restart
// and without spinning.
var _ = Describe("Control plane outages", Ordered, ContinueOnFailure, func() {
	var (
		ns        string
		requests  map[string]request
		restarts0 map[string]int32
	)

	BeforeAll(func(ctx SpecContext) {
		ns = suite.NewNamespace(ctx, "chaos-outage")
		suite.StartBackend(ctx, ns, suite.image)
		ing := framework.Ingress(ns, "web", "chaos-out-"+framework.Token(), "")
		suite.Create(ctx, ing)
		svc := l3Service(ns, "db", "")
		suite.Create(ctx, svc)
		pg := framework.ProxyGroup("chaos-out-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		ha := framework.Ingress(ns, "ha", "chaos-out-ha-"+framework.Token(), pg.Name)
		suite.Create(ctx, ha)
		suite.WaitGroupReady(ctx, pg)
		requests = map[string]request{
			"HTTPS, standalone":  httpsEcho(suite.ServedName(ctx, ing)),
			"L3 TCP, standalone": tcpEcho(serviceIP(ctx, svc)),
			"HTTPS, ProxyGroup":  httpsEcho(suite.ServedName(ctx, ha)),
		}
		for what, r := range requests {
			expectServing(ctx, r, what)
		}
		restarts0 = restarts(ctx, nil)
	})

	// underLoad runs the three kinds of requests at 5/s each while during runs.
	underLoad := func(ctx context.Context, during func()) map[string]loadResult {
		stops := map[string]func() loadResult{}
		for what, r := range requests {
			stops[what] = background(ctx, 5, r)
		}
		during()
		out := map[string]loadResult{}
		for what, stop := range stops {
			out[what] = stop()
		}
		return out
	}
	table := func(rs map[string]loadResult) string {
		s := "| Traffic | Requests | Failed |\n| --- | --- | --- |\n"
		var all []loadResult
		for _, what := range []string{"HTTPS, standalone", "L3 TCP, standalone", "HTTPS, ProxyGroup"} {
			s += fmt.Sprintf("| %s | %d | %d |\n", what, rs[what].sent, rs[what].failed)
			all = append(all, rs[what])
		}
		return s + "\n" + failures(all...)
	}
	// restarted counts the container restarts since BeforeAll in the operator's namespace.
	restarted := func(ctx context.Context) int32 {
		GinkgoHelper()
		var n int32
		for pod, r := range restarts(ctx, nil) {
			n += r - restarts0[pod]
		}
		return n
	}

	It("serves through a minute without the API server, and the operator carries on without a restart", func(ctx SpecContext) {
		op := operatorPod(ctx)
		restarts0 = restarts(ctx, nil)
		before, _, err := reconciles(ctx)
		Expect(err).NotTo(HaveOccurred())
		counted := time.Now()
		var o apiOutage
		results := underLoad(ctx, func() {
			o = apiServerDown(ctx, outage)
		})

		By("the operator still reconciling: a new Ingress is served")
		ing := framework.Ingress(ns, "after-api", "chaos-after-api-"+framework.Token(), "")
		suite.Create(ctx, ing)
		expectServing(ctx, httpsEcho(suite.ServedName(ctx, ing)), "an Ingress created after the outage")
		// Counted once the operator has served again: a restart comes after the outage.
		after := operatorPod(ctx)
		nRestarts := restarted(ctx)
		total, panics, err := reconciles(ctx)
		Expect(err).NotTo(HaveOccurred())
		window := time.Since(counted)
		reconciled := fmt.Sprintf("%0.f reconciles in the %s from before the outage until it was served (%0.1f/min)",
			total-before, window.Round(time.Second), (total-before)/window.Minutes())
		if total < before {
			reconciled = fmt.Sprintf("%0.f reconciles since the operator restarted, %s before it was served", total, window.Round(time.Second))
		}

		suite.report.add("### The API server unreachable\n\nThe kube-apiserver static Pod stopped (its manifest moved away) for %s "+
			"(unreachable from the suite for %s, back %s after its manifest returned; unreachable from the Pods, through the "+
			"`kubernetes` Service, for %s), under 5 requests/s of each kind of traffic, new connections each time. Afterwards: "+
			"%d restarts of any container in the operator's namespace; an Ingress created then served; %s, %0.f panics.\n\n%s",
			outage, o.down.Round(time.Second), o.back.Round(time.Second), o.inCluster.Round(time.Second), nRestarts, reconciled, panics, table(results))
		Expect(after.UID).To(Equal(op.UID), "the operator Pod replaced")
		Expect(nRestarts).To(BeZero(), "container restarts")
		for what, r := range results {
			Expect(r.failed).To(BeZero(), "%s: %s", what, r)
		}
	})

	It("serves through a minute without the tailnet's control server, reports it, and does not spin", func(ctx SpecContext) {
		op := operatorPod(ctx)
		restarts0 = restarts(ctx, nil)
		before, _, err := reconciles(ctx)
		Expect(err).NotTo(HaveOccurred())
		ing := framework.Ingress(ns, "during-control", "chaos-during-"+framework.Token(), "")
		var during float64
		var reason string
		results := underLoad(ctx, func() {
			admin(ctx, http.MethodPost, "/control/down")
			DeferCleanup(admin, context.WithoutCancel(ctx), http.MethodPost, "/control/up")
			start := time.Now()
			By("a new Ingress, whose proxy needs an auth key from the API")
			suite.Create(ctx, ing)
			Eventually(ctx, func(g Gomega) {
				list := &eventsv1.EventList{}
				g.Expect(suite.K8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
				found := false
				for _, e := range list.Items {
					if e.Regarding.Name == ing.Name && e.Reason == kit.ReasonTailnetAPIFailed {
						found, reason = true, e.Note
					}
				}
				g.Expect(found).To(BeTrue(), "a %s Warning on the new Ingress", kit.ReasonTailnetAPIFailed)
			}).WithTimeout(outage).Should(Succeed())
			time.Sleep(time.Until(start.Add(outage)))
			n, _, err := reconciles(ctx)
			Expect(err).NotTo(HaveOccurred())
			during = n - before
			admin(ctx, http.MethodPost, "/control/up")
		})
		Expect(reason).To(ContainSubstring(tailnet.ReasonUnavailable), "the reason of the control plane in the Event")
		Expect(restarted(ctx)).To(BeZero(), "container restarts")
		Expect(operatorPod(ctx).UID).To(Equal(op.UID), "the operator Pod replaced")
		expectServing(ctx, httpsEcho(suite.ServedName(ctx, ing)), "the Ingress created during the outage")

		suite.report.add("### The tailnet's control server unreachable\n\nThe local tailnet's control server and API down for %s "+
			"(DERP and the CA up), under 5 requests/s of each kind of traffic. An Ingress created during the outage got the Warning "+
			"`%s` (%q) and was served once the control server was back; %0.f reconciles in the operator over the whole minute "+
			"(%0.1f/min); no container restarted.\n\n%s",
			outage, kit.ReasonTailnetAPIFailed, reason, during, during/outage.Minutes(), table(results))
		for what, r := range results {
			Expect(r.failed).To(BeZero(), "%s: %s", what, r)
		}
		Expect(during).To(BeNumerically("<", 120), "reconciles in the minute without the control server")
	})
})

// apiOutage is how long the API server was away: from the suite (through the node's port), and
// from the Pods (through the kubernetes Service, whose endpoint the API server takes away on
// shutdown and puts back only once it is ready again).
type apiOutage struct {
	down, back, inCluster time.Duration
}

// apiServerDown stops the kube-apiserver static Pod for d, counted from when it stops
// answering, and waits until it answers again, from the suite and from the Pods.
func apiServerDown(ctx context.Context, d time.Duration) apiOutage {
	GinkgoHelper()
	const manifest, parked = "/etc/kubernetes/manifests/kube-apiserver.yaml", "/etc/kubernetes/kube-apiserver.yaml"
	answers := func() bool {
		_, err := suite.Clientset.Discovery().ServerVersion()
		return err == nil
	}
	// Any HTTP status means a connection through the Service; 000 means none.
	answersInCluster := func() bool {
		out, _ := nodeExec(ctx, "curl", "-sk", "--max-time", "2", "-o", "/dev/null", "-w", "%{http_code}", "https://10.96.0.1:443/readyz")
		return strings.TrimSpace(out) != "000" && strings.TrimSpace(out) != ""
	}
	out, err := nodeExec(ctx, "mv", manifest, parked)
	Expect(err).NotTo(HaveOccurred(), out)
	restore := func() {
		if out, err := nodeExec(context.WithoutCancel(ctx), "sh", "-c", "[ ! -f "+parked+" ] || mv "+parked+" "+manifest); err != nil {
			Fail("restoring the kube-apiserver manifest: " + out)
		}
	}
	DeferCleanup(restore)
	// The kubelet looks at its manifests every 20s.
	Eventually(answers).WithTimeout(90*time.Second).WithPolling(time.Second).Should(BeFalse(), "the API server gone")
	stopped := time.Now()
	time.Sleep(d)
	restore()
	restored := time.Now()
	Eventually(answers).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(BeTrue(), "the API server back")
	o := apiOutage{down: time.Since(stopped), back: time.Since(restored)}
	Eventually(answersInCluster).WithTimeout(5*time.Minute).WithPolling(time.Second).Should(BeTrue(), "the API server back through its Service")
	o.inCluster = time.Since(stopped)
	return o
}
