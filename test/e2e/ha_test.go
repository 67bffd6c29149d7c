//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/test/framework"
)

// The share of requests a replica's restart may cost the clients of a group. Each failure is one
// request in flight as its route moved; the figures are printed with every run.
const maxFailoverLoss = 0.02

var _ = Describe("A ProxyGroup under a replica restart", Ordered, func() {
	var pg *tsv1alpha1.ProxyGroup
	var ns string

	BeforeAll(func(ctx SpecContext) {
		ns = suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		pg = framework.ProxyGroup("e2e-ha-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		suite.WaitGroupReady(ctx, pg)
	})

	It("serves an Ingress over HTTPS through its Tailscale Service while replica 0 restarts, and releases the Service once deleted", func(ctx SpecContext) {
		host := "e2e-hai-" + framework.Token()
		ing := framework.Ingress(ns, "web", host, pg.Name)
		suite.Create(ctx, ing)
		fqdn := suite.ServedName(ctx, ing)
		expectHTTPSEcho(ctx, fqdn)
		expectHTTPSFailover(ctx, pg.Name+"-0", fqdn)
		expectServiceReleased(ctx, ing, host)
	})

	It("serves a Gateway's HTTPRoute over HTTPS through its Tailscale Service while replica 0 restarts, and releases the Service once deleted", func(ctx SpecContext) {
		host := "e2e-hagw-" + framework.Token()
		backend := &corev1.Service{}
		Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: framework.BackendName}, backend)).To(Succeed())
		edge := kubeobj.Gateway(ns, "edge", gatewayClass(ctx), kubeobj.Listener("https", gatewayv1.HTTPSProtocolType, 443))
		edge.Annotations = map[string]string{kit.AnnotationHostname: host, kit.AnnotationProxyGroup: pg.Name}
		suite.Create(ctx, edge)
		suite.Create(ctx, kubeobj.HTTPRoute(ns, "edge", edge.Name,
			kubeobj.HTTPRule(gatewayv1.PathMatchPathPrefix, "/", "", framework.BackendName, int(backend.Spec.Ports[0].Port))))

		By("reporting the Tailscale Service's MagicDNS name and VIPs as its addresses")
		addrs := programmedAddresses(ctx, edge, 1)
		svc, err := suite.API.Service(ctx, "svc:"+host)
		Expect(err).NotTo(HaveOccurred())
		var vips []string
		for _, a := range svc.Addrs {
			vips = append(vips, a.String())
		}
		Expect(addrs[1:]).To(HaveEach(HaveField("Value", BeElementOf(vips))))
		Expect(addrs[1:]).NotTo(BeEmpty())
		fqdn := addrs[0].Value
		Expect(fqdn).To(HavePrefix(host + "."))
		expectHTTPSEcho(ctx, fqdn)
		expectHTTPSFailover(ctx, pg.Name+"-0", fqdn)
		expectServiceReleased(ctx, edge, host)
	})

	It("forwards a Service's TCP and UDP at its Tailscale Service while replica 1 restarts", func(ctx SpecContext) {
		if suite.skipL3 != "" {
			Skip("L3: " + suite.skipL3)
		}
		svc := framework.BackendService(ns, "db", corev1.ServiceTypeLoadBalancer)
		svc.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
		svc.Annotations = map[string]string{kit.AnnotationProxyGroup: pg.Name}
		suite.Create(ctx, svc)
		var vip netip.Addr
		Eventually(ctx, func(g Gomega) {
			g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
			c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionIngressSvcConfigured)
			g.Expect(c).NotTo(BeNil(), "conditions %v", svc.Status.Conditions)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
			g.Expect(c.Message).To(HavePrefix("2/2 "))
			for _, in := range svc.Status.LoadBalancer.Ingress {
				if a, err := netip.ParseAddr(in.IP); err == nil && inServiceFamily(a) {
					vip = a
				}
			}
			g.Expect(vip.IsValid()).To(BeTrue(), "a VIP of the Service's family in %v", svc.Status.LoadBalancer.Ingress)
		}).Should(Succeed(), "HA Service configured on both replicas")

		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: suite.Dial}}
		defer hc.CloseIdleConnections()
		base := "http://" + netip.AddrPortFrom(vip, framework.HTTPPort).String()
		expectEcho(ctx, hc, base)
		expectUDPEcho(ctx, netip.AddrPortFrom(vip, framework.UDPPort))
		loss := underReplicaRestart(ctx, pg.Name+"-1", func(ctx context.Context) error {
			// A new connection each time: a kept one would stay on the replica it was made to.
			hc.CloseIdleConnections()
			return echoOnce(ctx, hc, base)
		})
		Expect(loss).To(BeNumerically("<=", maxFailoverLoss), "share of TCP requests lost while %s-1 restarted", pg.Name)
	})
})

// expectHTTPSFailover checks that HTTPS requests to fqdn keep being answered while the group's
// replica Pod restarts, within maxFailoverLoss.
func expectHTTPSFailover(ctx context.Context, replica, fqdn string) {
	GinkgoHelper()
	hc := tailnetHTTPClient(5 * time.Second)
	defer hc.CloseIdleConnections()
	loss := underReplicaRestart(ctx, replica, func(ctx context.Context) error {
		return echoOnce(ctx, hc, "https://"+fqdn)
	})
	Expect(loss).To(BeNumerically("<=", maxFailoverLoss), "share of HTTPS requests to %s lost while %s restarted", fqdn, replica)
}

// expectServiceReleased deletes obj, served on a group as Tailscale Service svc:<host>, and
// waits for the service to be released.
func expectServiceReleased(ctx context.Context, obj client.Object, host string) {
	GinkgoHelper()
	Expect(suite.K8s.Delete(ctx, obj)).To(Succeed())
	Eventually(ctx, func() error {
		_, err := suite.API.Service(ctx, "svc:"+host)
		return err
	}).Should(Satisfy(tailnet.IsNotFound), "the Tailscale Service svc:%s released", host)
}

// underReplicaRestart sends requests at 10 per second while the Pod (of a group, in whichever
// namespace it runs) is deleted and until its replacement is Ready and has served for 10 seconds
// more; it prints the counts and returns the share that failed.
func underReplicaRestart(ctx context.Context, pod string, request func(context.Context) error) float64 {
	GinkgoHelper()
	l := steadyLoad(ctx, request)
	time.Sleep(3 * time.Second)
	old := groupPod(ctx, pod)
	deleted := l.mark()
	Expect(suite.K8s.Delete(ctx, old)).To(Succeed())
	Eventually(ctx, func(g Gomega) {
		var p corev1.Pod
		g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(old), &p)).To(Succeed())
		g.Expect(p.UID).NotTo(Equal(old.UID), "the replacement Pod")
		g.Expect(framework.PodReady(&p)).To(BeTrue(), "replacement %s Ready", pod)
	}).Should(Succeed())
	back := time.Since(deleted)
	time.Sleep(10 * time.Second)
	return l.finish("failover "+pod, fmt.Sprintf("%s deleted: replacement Ready after %s", pod, back.Round(100*time.Millisecond)))
}

// groupPod is the replica Pod of that name, in whichever namespace it runs.
func groupPod(ctx context.Context, name string) *corev1.Pod {
	GinkgoHelper()
	p, err := suite.FindPod(ctx, proxyNamespaces(), name)
	Expect(err).NotTo(HaveOccurred())
	return p
}

// load is a steady stream of requests, 10 per second, counted.
type load struct {
	sent, failed atomic.Int64
	firstErr     atomic.Value
	markedAt     atomic.Int64 // unix nanoseconds of the event the failures are timed from; 0 before
	mu           sync.Mutex
	failedAt     []string // when each failure was sent, relative to the mark
	stop         context.CancelFunc
	done         chan struct{}
}

// steadyLoad starts sending requests until finish; the loop is bounded by the spec's timeout.
func steadyLoad(ctx context.Context, request func(context.Context) error) *load {
	l := &load{done: make(chan struct{})}
	loadCtx, stop := context.WithCancel(ctx)
	l.stop = stop
	go func() {
		defer close(l.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			rctx, cancel := context.WithTimeout(loadCtx, 5*time.Second)
			at := time.Now()
			err := request(rctx)
			cancel()
			if loadCtx.Err() != nil {
				return
			}
			l.sent.Add(1)
			if err != nil {
				l.failed.Add(1)
				l.firstErr.CompareAndSwap(nil, err.Error())
				l.mu.Lock()
				l.failedAt = append(l.failedAt, at.Sub(time.Unix(0, l.markedAt.Load())).Round(100*time.Millisecond).String())
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// mark records now as the time failures are reported from.
func (l *load) mark() time.Time {
	now := time.Now()
	l.markedAt.Store(now.UnixNano())
	return now
}

// finish stops the requests, prints and reports the counts under what, after how it went, and
// returns the share that failed.
func (l *load) finish(what, how string) float64 {
	GinkgoHelper()
	l.stop()
	<-l.done
	n, f := l.sent.Load(), l.failed.Load()
	msg := fmt.Sprintf("%s; %d of %d requests failed", how, f, n)
	if e := l.firstErr.Load(); e != nil {
		l.mu.Lock()
		msg += fmt.Sprintf(" (sent at %s after the mark; first: %s)", strings.Join(l.failedAt, ", "), strings.TrimSpace(e.(string)))
		l.mu.Unlock()
	}
	GinkgoWriter.Println(msg)
	AddReportEntry(what, msg)
	Expect(n).To(BeNumerically(">", 50), "requests sent")
	return float64(f) / float64(n)
}
