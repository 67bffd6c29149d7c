//go:build chaos

package chaos

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/test/framework"
)

// l3Service is a LoadBalancer Service of class tailscale for the echo Pods, on group if set.
func l3Service(ns, name, group string) *corev1.Service {
	s := framework.BackendService(ns, name, corev1.ServiceTypeLoadBalancer)
	s.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
	if group != "" {
		s.Annotations[kit.AnnotationProxyGroup] = group
		s.Annotations[kit.AnnotationHostname] = name + "-" + ns
	}
	return s
}

// serviceIP waits for a Service's status to give its tailnet IPv4 (standalone) or VIP (group).
func serviceIP(ctx context.Context, svc *corev1.Service) netip.Addr {
	GinkgoHelper()
	var ip netip.Addr
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil && a.Is4() {
				ip = a
			}
		}
		g.Expect(ip.IsValid()).To(BeTrue(), "an IPv4 in %v", svc.Status.LoadBalancer.Ingress)
	}).Should(Succeed(), "Service %s/%s status", svc.Namespace, svc.Name)
	return ip
}

// request is one request to a served object; nil means the backend answered as asked.
type request func(ctx context.Context) error

// transport makes a new connection per request, as new clients do: a kept connection would stay
// on the replica it was made to.
var transport = sync.OnceValue(func() *http.Transport {
	return &http.Transport{DialContext: suite.Client.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: suite.roots}}
})

// echo asks the backend at base (https://name or http://ip:80) to echo a fresh word.
func echo(base string) request {
	return func(ctx context.Context) error {
		want := framework.Token()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/echo?msg="+want, nil)
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Transport: transport()}).Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || string(b) != want {
			return fmt.Errorf("%s: %q", resp.Status, b)
		}
		return nil
	}
}

func httpsEcho(fqdn string) request { return echo("https://" + fqdn) }
func tcpEcho(ip netip.Addr) request { return echo("http://" + netip.AddrPortFrom(ip, 80).String()) }
func expectServing(ctx context.Context, r request, what string) {
	GinkgoHelper()
	Eventually(ctx, func() error {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return r(rctx)
	}).Should(Succeed(), "%s serving", what)
}

// loadResult counts a request loop's requests.
type loadResult struct {
	sent, failed int64
	errs         []string // the first failures
	spans        []span   // of every failed request
}

// span is when a request was sent and when it ended.
type span struct{ start, end time.Time }

// atMoves counts the failures in flight while the client's route to their service moved.
func (l loadResult) atMoves(m *routeMoves) int {
	n := 0
	for _, s := range l.spans {
		if m.during(s.start, s.end) {
			n++
		}
	}
	return n
}

func (l loadResult) String() string {
	s := fmt.Sprintf("%d of %d failed", l.failed, l.sent)
	if len(l.errs) > 0 {
		s += " (" + strings.Join(l.errs, "; ") + ")"
	}
	return s
}

// load sends requests at rate per second until ctx ends or for d, each with a 5s timeout and
// without waiting for the previous one, and waits for the last to finish.
func load(ctx context.Context, rate int, d time.Duration, r request) loadResult {
	var sent, failed atomic.Int64
	var mu sync.Mutex
	var errs []string
	var spans []span
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.After(d)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
			break loop
		case <-tick.C:
		}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			start := time.Now()
			err := r(rctx)
			sent.Add(1)
			if err != nil {
				failed.Add(1)
				mu.Lock()
				spans = append(spans, span{start, time.Now()})
				if len(errs) < 3 {
					errs = append(errs, time.Now().Format("15:04:05.0")+" "+strings.TrimSpace(err.Error()))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return loadResult{sent: sent.Load(), failed: failed.Load(), errs: errs, spans: spans}
}

// background runs load until stop is called, which returns its result.
func background(ctx context.Context, rate int, r request) (stop func() loadResult) {
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan loadResult, 1)
	go func() { done <- load(lctx, rate, time.Hour, r) }()
	return func() loadResult {
		cancel()
		return <-done
	}
}

// restarts sums the container restarts of the operator's and the proxies' Pods matching sel.
func restarts(ctx context.Context, sel client.MatchingLabels) map[string]int32 {
	GinkgoHelper()
	pods := &corev1.PodList{}
	Expect(suite.ListEach(ctx, pods, proxyNS(), sel)).To(Succeed())
	out := map[string]int32{}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			out[p.Name] += cs.RestartCount
		}
	}
	return out
}

var operatorPods = client.MatchingLabels{"app.kubernetes.io/component": "operator"}

func operatorPod(ctx context.Context) *corev1.Pod {
	GinkgoHelper()
	var pod *corev1.Pod
	Eventually(ctx, func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(suite.K8s.List(ctx, pods, client.InNamespace(opNS), operatorPods)).To(Succeed())
		var ready []corev1.Pod
		for _, p := range pods.Items {
			if framework.PodReady(&p) {
				ready = append(ready, p)
			}
		}
		g.Expect(ready).To(HaveLen(1), "one Ready operator Pod")
		pod = &ready[0]
	}).Should(Succeed())
	return pod
}

// state reads the proxy state in Secret name of the operator's namespace.
func state(ctx context.Context, g Gomega, name string) *contract.ProxyState {
	s := &corev1.Secret{}
	g.Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: name}, s)).To(Succeed())
	st, err := contract.ParseState(s.Data)
	g.Expect(err).NotTo(HaveOccurred())
	return st
}

// proxyOf finds the StatefulSet of a standalone object's proxy.
func proxyOf(ctx context.Context, typ string, obj client.Object) string {
	GinkgoHelper()
	var name string
	Eventually(ctx, func(g Gomega) {
		list := &appsv1.StatefulSetList{}
		g.Expect(suite.ListEach(ctx, list, proxyNS(), client.MatchingLabels{
			kit.LabelParentType: typ, kit.LabelParentNS: obj.GetNamespace(), kit.LabelParentName: obj.GetName()})).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1))
		name = list.Items[0].Name
	}).Should(Succeed(), "the proxy of %s", obj.GetName())
	return name
}

// nodeExec runs a command on the kind node.
func nodeExec(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", append([]string{"exec", suite.node}, args...)...).CombinedOutput()
	return string(out), err
}

// admin calls the local tailnet's admin endpoint.
func admin(ctx context.Context, method, path string) []byte {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, method, suite.admin+path, nil)
	Expect(err).NotTo(HaveOccurred())
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	Expect(resp.StatusCode).To(BeNumerically("<", 300), "%s %s: %s", method, path, b)
	return b
}

// caOrders counts the orders the local CA has accepted so far.
func caOrders(ctx context.Context) int {
	GinkgoHelper()
	var counts struct{ Orders int }
	Expect(json.Unmarshal(admin(ctx, http.MethodGet, "/acme/orders"), &counts)).To(Succeed())
	return counts.Orders
}

// durations summarizes measured durations: median, 90th percentile and maximum.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) time.Duration {
		return s[min(len(s)-1, int(q*float64(len(s))))].Round(100 * time.Millisecond)
	}
	return fmt.Sprintf("median %s, p90 %s, max %s", at(0.5), at(0.9), s[len(s)-1].Round(100*time.Millisecond))
}
