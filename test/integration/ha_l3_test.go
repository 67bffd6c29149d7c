package integration

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/tsnet"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// A dual-stack HA Service on a ProxyGroup of two replicas, each a real proxy whose kernel, in a
// network namespace of its own, DNATs the Tailscale Service's VIPs to the Service's ClusterIPs:
// the operator reports the Service once replicas advertise it; a replica advertises only with
// its rules in place, and withdraws before it removes them; a client connecting at a steady rate,
// by MagicDNS name (IPv6) and IPv4 VIP in turn, keeps being served while each replica in turn
// stops gracefully and starts again.
func TestHAServiceFailover(t *testing.T) {
	netnstest.NeedRoot(t, "nft")
	begin := time.Now()
	w := startWorldWith(t, localtailnet.Options{}, contract.FirewallAuto)
	const ns, pg, svcName = "data", "pg", "svc:data-db"
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := w.k8s.Create(w.ctx, &tsv1alpha1.ProxyGroup{
		ObjectMeta: metav1.ObjectMeta{Name: pg},
		Spec:       tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress, Replicas: ptr.To[int32](2)},
	}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db", Annotations: map[string]string{kit.AnnotationProxyGroup: pg}},
		Spec: corev1.ServiceSpec{
			Type:              corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass: ptr.To(kit.LoadBalancerClass),
			IPFamilyPolicy:    ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			Ports: []corev1.ServicePort{
				{Name: "pg", Port: proxytest.EchoTCPPort, Protocol: corev1.ProtocolTCP},
				{Name: "dns", Port: proxytest.EchoUDPPort, Protocol: corev1.ProtocolUDP},
			},
		},
	}
	if err := w.k8s.Create(w.ctx, svc); err != nil {
		t.Fatal(err)
	}
	var clusterIPs []netip.Addr
	for _, s := range svc.Spec.ClusterIPs {
		clusterIPs = append(clusterIPs, netip.MustParseAddr(s))
	}
	if len(clusterIPs) != 2 || !clusterIPs[0].Is4() || !clusterIPs[1].Is6() {
		t.Fatalf("ClusterIPs %v, want an IPv4 and an IPv6 one", clusterIPs)
	}

	// Each replica's backend answers on the ClusterIPs, as kube-proxy would make them reachable
	// from its Pod, and names the replica, so that the client sees where it was routed.
	var replicas []*haReplica
	var tops []netnstest.Topology
	for i := range 2 {
		top := proxytest.NewTopology(t)
		for _, ip := range clusterIPs {
			proxytest.AddBackend(t, top, ip, fmt.Sprintf("%s-%d", pg, i))
		}
		tops = append(tops, top)
		replicas = append(replicas, newHAReplica(t, w, pg, i, nil, top.Proxy.Path))
	}
	audit := auditStates(t, w, svcName, pg+"-0", pg+"-1")
	for _, r := range replicas {
		r.start()
	}

	fqdn := "data-db." + w.lt.Domain
	var vips []netip.Addr
	poll.Eventually(t, 90*time.Second, "Service status", func() error {
		ts, err := w.api.Service(w.ctx, svcName)
		if err != nil {
			return err
		}
		vips = ts.Addrs
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
			return err
		}
		c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionIngressSvcConfigured)
		if c == nil || c.Status != metav1.ConditionTrue || !strings.HasPrefix(c.Message, "2/2 ") {
			return fmt.Errorf("condition %+v", c)
		}
		// The name and the IPv4 VIP in one entry, as the original writes it; the IPv6 one after.
		var want []corev1.LoadBalancerIngress
		for _, a := range vips {
			want = append(want, corev1.LoadBalancerIngress{IP: a.String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)})
		}
		if len(want) > 0 {
			want[0].Hostname = fqdn
		}
		if lb := svc.Status.LoadBalancer.Ingress; !slices.EqualFunc(lb, want, func(a, b corev1.LoadBalancerIngress) bool {
			return a.Hostname == b.Hostname && a.IP == b.IP && ptr.Equal(a.IPMode, b.IPMode)
		}) {
			return fmt.Errorf("load balancer status %+v, want %+v", lb, want)
		}
		return nil
	})
	if len(vips) != 2 || !vips[0].Is4() || !vips[1].Is6() {
		t.Fatalf("VIPs %v, want an IPv4 and an IPv6 one", vips)
	}
	t.Logf("Service served by both replicas %s after creation", time.Since(begin).Round(time.Millisecond))

	laptop := joinClient(t, w, "laptop")
	for _, vip := range vips {
		for _, network := range []string{"tcp", "udp"} {
			port := map[string]uint16{"tcp": proxytest.EchoTCPPort, "udp": proxytest.EchoUDPPort}[network]
			poll.Eventually(t, 20*time.Second, network+" to "+vip.String(), func() error {
				ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
				defer cancel()
				_, err := proxytest.Echo(ctx, laptop, network, netip.AddrPortFrom(vip, port).String())
				return err
			})
		}
	}

	ctx, stopLoad := context.WithCancel(w.ctx)
	defer stopLoad()
	const every = 50 * time.Millisecond
	byName, byIPv4 := fmt.Sprintf("%s:%d", fqdn, proxytest.EchoTCPPort), netip.AddrPortFrom(vips[0], proxytest.EchoTCPPort).String()
	load := startHALoad(ctx, every, []string{byName, byIPv4}, func(ctx context.Context, target string) (string, error) {
		return proxytest.Echo(ctx, laptop, "tcp", target)
	})
	tl := &haTimeline{load: load}
	routes := watchRoute(ctx, t, laptop, vips[0], load)
	time.Sleep(2 * time.Second)
	for _, i := range []int{1, 0} {
		r, top := replicas[i], tops[i]
		tl.mark(true, "stopping %s", r.name)
		stopped := make(chan struct{})
		go func() { defer close(stopped); r.stop(t) }()
		// Withdrawn, while its rules still serve the clients that have not moved yet.
		poll.Eventually(t, 10*time.Second, r.name+" withdrawing", func() error {
			if r.advertises(w, svcName) == nil {
				return fmt.Errorf("%s still advertises", r.name)
			}
			return nil
		})
		tl.mark(false, "%s withdrew", r.name)
		if left := proxytest.Leftovers(t, top.Proxy); len(left) == 0 {
			t.Errorf("%s removed its TUN and rules before the end of its withdrawal wait", r.name)
		}
		poll.Eventually(t, 10*time.Second, "the operator counting one replica", func() error {
			if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
				return err
			}
			c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionIngressSvcConfigured)
			if c == nil || c.Status != metav1.ConditionTrue || !strings.HasPrefix(c.Message, "1/2 ") {
				return fmt.Errorf("condition %+v", c)
			}
			return nil
		})
		<-stopped
		tl.mark(false, "%s stopped", r.name)
		if left := proxytest.Leftovers(t, top.Proxy); len(left) > 0 {
			t.Errorf("after %s stopped, still there:\n%s", r.name, strings.Join(left, "\n"))
		}
		// Down long enough that the client no longer trusts the old instance's UDP address:
		// tailscaled keeps a peer's path for 6.5s after its last pong, disco key change or not,
		// and a replica back sooner, on a new port, gets the first handshake sent to the old
		// one (a 5s stall, or 10s and failures); see docs/ha.md.
		time.Sleep(restartGap)
		r.start()
		poll.Eventually(t, 30*time.Second, r.name+" advertising again", func() error { return r.advertises(w, svcName) })
		tl.mark(true, "%s advertises again", r.name)
		time.Sleep(2 * time.Second)
	}
	stopLoad()
	reqs := load.wait()
	rep := summarize(reqs)
	t.Logf("timeline:\n  %s", tl)
	t.Logf("failover: %s (one every %s over %.1fs); answered by %v", rep, every, load.since().Seconds(), rep.answeredBy)
	for _, target := range []string{byName, byIPv4} {
		t.Logf("  to %s: %s", target, summarize(slices.DeleteFunc(slices.Clone(reqs), func(r haRequest) bool { return r.target != target })))
	}
	t.Logf("  client's netmap routed the VIPs to: %s", <-routes)
	t.Logf("  client's requests answered by: %s", routeChanges(reqs))
	for _, f := range rep.fails {
		t.Logf("  failed: %s", f)
	}
	for _, s := range rep.slow {
		t.Logf("  slow: %s", s)
	}
	for _, v := range audit.stop() {
		t.Errorf("advertised without its DNAT rules in place: %s", v)
	}

	// A request under way when the client's route moves loses its connection: the other
	// replica's kernel knows nothing of it. A request takes milliseconds, so each of the two
	// moves may cost one or two, and none may fail away from a move. No stall either: one lost
	// SYN (retransmitted after a second) at most.
	if rep.total < 300 { // the whole sequence: two stops, waits and restarts
		t.Errorf("only %d requests sent", rep.total)
	}
	if len(rep.fails) > 2*2 {
		t.Errorf("%d requests failed; want at most 4", len(rep.fails))
	}
	for _, f := range rep.fails {
		if !tl.nearMove(f) {
			t.Errorf("a request failed away from any route change: %s", f)
		}
	}
	if rep.max > 2500*time.Millisecond {
		t.Errorf("a request took %s; want no stall beyond one retransmission", rep.max)
	}
	for _, r := range replicas {
		r.stop(t)
		if strings.Contains(r.logs.String(), "tskey-") {
			t.Errorf("a key appears in the logs of %s", r.name)
		}
	}
	for _, top := range tops {
		if left := proxytest.Leftovers(t, top.Proxy); len(left) > 0 {
			t.Errorf("after the replicas stopped, still there:\n%s", strings.Join(left, "\n"))
		}
	}
}

// restartGap is how long a replica stays down in the failover tests: as short as a container
// restart. The replica comes back on its WireGuard port, where peers still look for it.
const restartGap = time.Second

// watchRoute follows which peer the client's netmap routes vip to, until ctx ends, and then
// sends the changes, timed from the load's start.
func watchRoute(ctx context.Context, t *testing.T, c *tsnet.Server, vip netip.Addr, load *haLoad) <-chan string {
	lc, err := c.LocalClient()
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 1)
	go func() {
		var changes []string
		last := "?"
		for ctx.Err() == nil {
			st, err := lc.Status(ctx)
			if err == nil {
				host := "nobody"
				for _, p := range st.Peer {
					if p.AllowedIPs != nil && slices.Contains(p.AllowedIPs.AsSlice(), netip.PrefixFrom(vip, vip.BitLen())) {
						host = p.HostName
					}
				}
				if host != last {
					changes = append(changes, fmt.Sprintf("%s from %.2fs", host, load.since().Seconds()))
					last = host
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		out <- strings.Join(changes, ", ")
	}()
	return out
}

// routeChanges condenses who answered the requests, in order, to where the client's traffic
// went and from when.
func routeChanges(reqs []haRequest) string {
	var out []string
	last := ""
	for _, r := range reqs {
		if r.err == nil && r.answer != last {
			out = append(out, fmt.Sprintf("%s from %.2fs", r.answer, r.at.Seconds()))
			last = r.answer
		}
	}
	return strings.Join(out, ", ")
}

// stateAudit watches replicas' state Secrets and keeps every state that advertises a service
// whose DNAT mapping that state does not show installed, for that Pod, without error.
type stateAudit struct {
	cancel     context.CancelFunc
	done       chan struct{}
	mu         sync.Mutex
	violations []string
	seen       int // states that advertise the service
}

func auditStates(t *testing.T, w *world, svcName string, secrets ...string) *stateAudit {
	t.Helper()
	cs, err := kubernetes.NewForConfig(w.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	watcher, err := cs.CoreV1().Secrets(w.opNS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := &stateAudit{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		defer watcher.Stop()
		for ev := range watcher.ResultChan() {
			sec, ok := ev.Object.(*corev1.Secret)
			if !ok || ev.Type == watch.Deleted || !slices.Contains(secrets, sec.Name) {
				continue
			}
			st, err := contract.ParseState(sec.Data)
			if err != nil || !slices.Contains(st.Advertised, svcName) {
				continue
			}
			a.mu.Lock()
			a.seen++
			var m contract.AppliedDNAT
			ok = st.Firewall != nil && st.Firewall.PodUID == st.PodUID
			if ok {
				m, ok = st.Firewall.Mappings[svcName]
			}
			if !ok || m.Error != "" || len(m.TailnetIPs) != 2 || len(m.Destinations) != 2 {
				a.violations = append(a.violations, fmt.Sprintf("%s (resourceVersion %s): firewall %+v", sec.Name, sec.ResourceVersion, st.Firewall))
			}
			a.mu.Unlock()
		}
		if ctx.Err() == nil {
			t.Error("the watch on the state Secrets ended early")
		}
	}()
	return a
}

// stop ends the audit and returns what it found; it fails when it saw no advertising state.
func (a *stateAudit) stop() []string {
	a.cancel()
	<-a.done
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == 0 {
		return []string{"no state advertising the service was seen: the audit saw nothing"}
	}
	return a.violations
}
