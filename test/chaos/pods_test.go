//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	"github.com/tsingress/tsingress/test/framework"
)

// A proxy whose Pod is deleted comes back as the same tailnet device (its identity is in its
// state Secret), serves again, and orders no certificate (the one it has is kept there too).
var _ = Describe("Proxy Pods deleted", func() {
	It("come back as the same device, order no certificate, and serve again", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "chaos-pods")
		suite.StartBackend(ctx, ns, suite.image)
		ing := framework.Ingress(ns, "web", "chaos-l7-"+framework.Token(), "")
		suite.Create(ctx, ing)
		svc := l3Service(ns, "db", "")
		suite.Create(ctx, svc)
		pg := framework.ProxyGroup("chaos-pods-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		ha := framework.Ingress(ns, "ha", "chaos-pods-ha-"+framework.Token(), pg.Name)
		suite.Create(ctx, ha)

		fqdn := suite.ServedName(ctx, ing)
		ip := serviceIP(ctx, svc)
		suite.WaitGroupReady(ctx, pg)
		haFQDN := suite.ServedName(ctx, ha)
		haSvc := "svc:" + strings.SplitN(haFQDN, ".", 2)[0]
		targets := []podTarget{
			{what: "standalone L7 (Ingress)", pod: proxyOf(ctx, "ingress", ing) + "-0", serving: httpsEcho(fqdn), https: true},
			{what: "standalone L3 (Service)", pod: proxyOf(ctx, "svc", svc) + "-0", serving: tcpEcho(ip)},
			// Ordinal 0 is the group's issuer of certificates: the one that would order.
			{what: "ProxyGroup replica 0", pod: pg.Name + "-0", serving: httpsEcho(haFQDN), advertises: haSvc, https: true},
		}
		for _, t := range targets {
			expectServing(ctx, t.serving, t.what)
		}
		// Every certificate the objects need is issued (a replica's first HTTPS request
		// triggers it) before the count starts.
		Eventually(ctx, func(g Gomega) {
			for _, t := range targets {
				if t.https {
					g.Expect(state(ctx, g, t.pod).Certificates).NotTo(BeEmpty(), "%s's certificates", t.what)
				}
			}
		}).Should(Succeed())
		orders := caOrders(ctx)

		var wg sync.WaitGroup
		for i := range targets {
			wg.Go(func() {
				defer GinkgoRecover()
				targets[i].deleteRepeatedly(ctx, suite.podDeletions)
			})
		}
		wg.Wait()
		newOrders := caOrders(ctx) - orders

		var rows []string
		for _, t := range targets {
			rows = append(rows, fmt.Sprintf("| %s | %d | %d | %d | %s | %s |", t.what, t.deleted, t.sameDevice, t.deleted-t.sameDevice,
				durations(t.ready), durations(t.back)))
		}
		suite.report.add("### Proxy Pods deleted\n\nEach proxy's Pod deleted %d times, one deletion after the previous Pod's replacement "+
			"served again (the three proxies at once). Times from the deletion: to the replacement Pod's readiness (as seen by polls "+
			"every 250ms), and to the first request answered through the proxy, HTTPS or TCP through the tailnet, on a new connection. New certificates ordered at the CA over all %d deletions: %d.\n\n"+
			"| Proxy | Deleted | Same device (node ID and IPs) | Other device | Replacement Pod Ready | Back to serving |\n| --- | --- | --- | --- | --- | --- |\n%s\n",
			suite.podDeletions, len(targets)*suite.podDeletions, newOrders, strings.Join(rows, "\n"))
		for _, t := range targets {
			Expect(t.sameDevice).To(Equal(t.deleted), "%s: deletions that brought back the same device", t.what)
		}
		Expect(newOrders).To(BeZero(), "certificates ordered while proxies restarted")
	})
})

// podTarget is a proxy Pod deleted again and again, and what was measured.
type podTarget struct {
	what       string
	pod        string
	serving    request
	advertises string // a Tailscale Service the replica must advertise again
	https      bool   // it serves a certificate

	deleted, sameDevice int
	ready, back         []time.Duration
}

// deleteRepeatedly deletes the Pod n times, each time waiting until its replacement reports
// the same device and serves; each wait is bounded.
func (t *podTarget) deleteRepeatedly(ctx context.Context, n int) {
	GinkgoHelper()
	for range n {
		var before *corev1.Pod
		var device, ips string
		Eventually(ctx, func(g Gomega) {
			var err error
			before, err = suite.FindPod(ctx, proxyNS(), t.pod)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(framework.PodReady(before)).To(BeTrue())
			st := state(ctx, g, t.pod)
			g.Expect(st.CurrentFor(string(before.UID))).To(BeTrue())
			device, ips = st.DeviceID, strings.Join(st.TailnetIPs, ",")
			g.Expect(device).NotTo(BeEmpty())
		}).Should(Succeed(), "%s up before its deletion", t.what)
		deleted := time.Now()
		Expect(suite.K8s.Delete(ctx, before)).To(Succeed())
		t.deleted++
		var sameDevice bool
		var ready time.Duration
		Eventually(ctx, func(g Gomega) {
			p, err := suite.FindPod(ctx, proxyNS(), t.pod)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.UID).NotTo(Equal(before.UID), "the replacement Pod")
			if ready == 0 && framework.PodReady(p) {
				ready = time.Since(deleted)
			}
			st := state(ctx, g, t.pod)
			g.Expect(st.CurrentFor(string(p.UID))).To(BeTrue(), "the replacement's state")
			g.Expect(st.DeviceID).NotTo(BeEmpty())
			sameDevice = st.DeviceID == device && strings.Join(st.TailnetIPs, ",") == ips
			if t.advertises != "" {
				g.Expect(slices.Contains(st.Advertised, t.advertises)).To(BeTrue(), "advertising %s", t.advertises)
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			g.Expect(t.serving(rctx)).To(Succeed())
		}).WithTimeout(3*time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "%s serving after deletion %d", t.what, t.deleted)
		t.back = append(t.back, time.Since(deleted))
		// The Pod may serve before its readiness probe says so.
		Eventually(ctx, func(g Gomega) {
			if ready != 0 {
				return
			}
			p, err := suite.FindPod(ctx, proxyNS(), t.pod)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(framework.PodReady(p)).To(BeTrue())
			ready = time.Since(deleted)
		}).WithTimeout(time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "%s Ready", t.what)
		t.ready = append(t.ready, ready)
		if sameDevice {
			t.sameDevice++
		}
	}
}
