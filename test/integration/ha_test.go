package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// An HA Ingress on a ProxyGroup of two replicas, run in-process from the Secrets and ConfigMap
// the operator writes: the operator reports the Ingress once replicas advertise its Tailscale
// Service, and a client requesting it at a steady rate keeps being served while each replica in
// turn stops gracefully and starts again.
func TestHAIngressFailover(t *testing.T) {
	begin := time.Now()
	w := startWorld(t)
	const ns, pg, host, svc = "shop", "pg", "ha-web", "svc:ha-web"
	ing := newHAIngressWorld(t, w, ns, pg, host)

	ca := proxytest.NewCA(t)
	replicas := []*haReplica{newHAReplica(t, w, pg, 0, ca, ""), newHAReplica(t, w, pg, 1, ca, "")}
	for _, r := range replicas {
		r.start()
	}
	fqdn := host + "." + w.lt.Domain
	poll.Eventually(t, 60*time.Second, "Ingress status", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(ing), ing); err != nil {
			return err
		}
		if lb := ing.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].Hostname != fqdn {
			return fmt.Errorf("status %+v", lb)
		}
		return nil
	})
	for _, r := range replicas {
		poll.Eventually(t, 30*time.Second, r.name+" advertising", func() error { return r.advertises(w, svc) })
	}
	t.Logf("Ingress served by both replicas %s after creation", time.Since(begin).Round(time.Millisecond))

	cl := joinClient(t, w, "laptop")
	ctx, stopLoad := context.WithCancel(w.ctx)
	defer stopLoad()
	const every = 50 * time.Millisecond
	httpc := haHTTPClient(cl, ca.Pool())
	load := startHALoad(ctx, every, []string{"https://" + fqdn + "/"}, func(ctx context.Context, url string) (string, error) {
		return "", haGet(ctx, httpc, url, "web /")
	})
	tl := &haTimeline{load: load}
	time.Sleep(2 * time.Second)
	for _, i := range []int{1, 0} {
		r := replicas[i]
		tl.mark(true, "stopping %s", r.name)
		r.stop(t)
		tl.mark(false, "%s stopped", r.name)
		time.Sleep(restartGap) // see TestHAServiceFailover
		r.start()
		poll.Eventually(t, 30*time.Second, r.name+" advertising again", func() error { return r.advertises(w, svc) })
		tl.mark(true, "%s advertises again", r.name)
		time.Sleep(2 * time.Second)
	}
	stopLoad()
	rep := summarize(load.wait())
	t.Logf("timeline:\n  %s", tl)
	t.Logf("failover: %s (one every %s over %.1fs)", rep, every, load.since().Seconds())
	for _, f := range rep.fails {
		t.Logf("  failed: %s", f)
	}
	for _, s := range rep.slow {
		t.Logf("  slow: %s", s)
	}
	// The client routes the service's VIPs to one replica at a time, per packet: when the route
	// moves, the requests then in flight lose their packets (replies from the old replica are
	// dropped as coming from a VIP now routed elsewhere). The sequence moves it twice (away from
	// the replica it uses and back), and a request takes well under 250ms, so each move may
	// cost up to five requests; no request may fail away from a move, during the withdrawal wait
	// or the drain included.
	if rep.total < 300 { // the whole sequence: two stops, waits and restarts
		t.Errorf("only %d requests sent", rep.total)
	}
	if len(rep.fails) > 2*5 {
		t.Errorf("%d requests failed; want at most 10", len(rep.fails))
	}
	for _, f := range rep.fails {
		if !tl.nearMove(f) {
			t.Errorf("a request failed away from any route change: %s", f)
		}
	}
	if rep.max > 2500*time.Millisecond {
		t.Errorf("a request took %s; want no stall beyond one retransmission", rep.max)
	}
}
