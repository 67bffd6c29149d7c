//go:build chaos

package chaos

import (
	"context"
	"crypto/rand"
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
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller"
)

// token is a random lower-case word for unique names.
func token() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// newNamespace creates a namespace with the echo backend, deleted (and waited for) after the spec.
func newNamespace(ctx context.Context, prefix string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	Expect(suite.k8s.Create(ctx, ns)).To(Succeed())
	deleteAfter(ns)
	labels := map[string]string{"app": "echo"}
	create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "echo"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "echo", Image: suite.image, Args: []string{"netexec", "--http-port=8080"},
				}}},
			},
		},
	})
	create(ctx, echoService(ns.Name, "echo", corev1.ServiceTypeClusterIP))
	return ns.Name
}

// echoService is a Service for the echo Pods: HTTP at port 80 (named http).
func echoService(ns, name string, typ corev1.ServiceType) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{Type: typ, Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
}

// l3Service is a LoadBalancer Service of class tailscale for the echo Pods, on group if set.
func l3Service(ns, name, group string) *corev1.Service {
	s := echoService(ns, name, corev1.ServiceTypeLoadBalancer)
	s.Spec.LoadBalancerClass = ptr.To(controller.LoadBalancerClass)
	if group != "" {
		s.Annotations[controller.AnnotationProxyGroup] = group
		s.Annotations[controller.AnnotationHostname] = name + "-" + ns
	}
	return s
}

// ingress is an Ingress of class tailscale for the echo backend at tailnet name host, on group if set.
func ingress(ns, name, host, group string) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{host}}},
			DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
				Name: "echo", Port: networkingv1.ServiceBackendPort{Name: "http"}}},
		},
	}
	if group != "" {
		ing.Annotations[controller.AnnotationProxyGroup] = group
	}
	return ing
}

func proxyGroup(name string, replicas int32) *tsv1alpha1.ProxyGroup {
	return &tsv1alpha1.ProxyGroup{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress, Replicas: ptr.To(replicas)}}
}

func create(ctx context.Context, obj client.Object) {
	GinkgoHelper()
	Expect(suite.k8s.Create(ctx, obj)).To(Succeed(), "creating %T %s", obj, obj.GetName())
	deleteAfter(obj)
}

// deleteAfter deletes obj after the spec and waits until it is gone: an object with a proxy
// goes once the operator has removed its proxy and device.
func deleteAfter(obj client.Object) {
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(suite.k8s.Delete(ctx, obj))).To(Succeed())
		Eventually(ctx, func() error { return suite.k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj) }).
			Should(Satisfy(apierrors.IsNotFound), "%T %s still there", obj, obj.GetName())
	})
}

func waitGroupReady(ctx context.Context, pg *tsv1alpha1.ProxyGroup) {
	GinkgoHelper()
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.k8s.Get(ctx, client.ObjectKeyFromObject(pg), pg)).To(Succeed())
		g.Expect(meta.IsStatusConditionTrue(pg.Status.Conditions, tsv1alpha1.ProxyGroupReady)).To(BeTrue(), "conditions %v", pg.Status.Conditions)
	}).Should(Succeed(), "ProxyGroup %s ready", pg.Name)
}

// servedName waits for an Ingress's status to name it on the tailnet.
func servedName(ctx context.Context, ing *networkingv1.Ingress) string {
	GinkgoHelper()
	var fqdn string
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
		lb := ing.Status.LoadBalancer.Ingress
		g.Expect(lb).NotTo(BeEmpty())
		fqdn = lb[0].Hostname
	}).Should(Succeed(), "Ingress %s/%s status", ing.Namespace, ing.Name)
	return fqdn
}

// serviceIP waits for a Service's status to give its tailnet IPv4 (standalone) or VIP (group).
func serviceIP(ctx context.Context, svc *corev1.Service) netip.Addr {
	GinkgoHelper()
	var ip netip.Addr
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.k8s.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
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
	return &http.Transport{DialContext: suite.client.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: suite.roots}}
})

// echo asks the backend at base (https://name or http://ip:80) to echo a fresh word.
func echo(base string) request {
	return func(ctx context.Context) error {
		want := token()
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

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil
		}
	}
	return false
}

// restarts sums the container restarts of the Pods in the operator's namespace matching sel.
func restarts(ctx context.Context, sel client.MatchingLabels) map[string]int32 {
	GinkgoHelper()
	pods := &corev1.PodList{}
	Expect(suite.k8s.List(ctx, pods, client.InNamespace(opNS), sel)).To(Succeed())
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
		g.Expect(suite.k8s.List(ctx, pods, client.InNamespace(opNS), operatorPods)).To(Succeed())
		var ready []corev1.Pod
		for _, p := range pods.Items {
			if podReady(&p) {
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
	g.Expect(suite.k8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: name}, s)).To(Succeed())
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
		g.Expect(suite.k8s.List(ctx, list, client.InNamespace(opNS), client.MatchingLabels{
			controller.LabelParentType: typ, controller.LabelParentNS: obj.GetNamespace(), controller.LabelParentName: obj.GetName()})).To(Succeed())
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

// dumpState writes the Events and Pods of the operator's namespace, for a failed spec.
func dumpState(ctx context.Context) {
	events := &corev1.EventList{}
	if err := suite.k8s.List(ctx, events, client.InNamespace(opNS)); err == nil {
		GinkgoWriter.Printf("\n----- Events in %s -----\n", opNS)
		for _, e := range events.Items {
			GinkgoWriter.Printf("%s %s %s/%s %s: %s\n", e.LastTimestamp.Format(time.RFC3339), e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	pods := &corev1.PodList{}
	if err := suite.k8s.List(ctx, pods, client.InNamespace(opNS)); err == nil {
		GinkgoWriter.Printf("\n----- Pods in %s -----\n", opNS)
		for _, p := range pods.Items {
			var rs int32
			for _, cs := range p.Status.ContainerStatuses {
				rs += cs.RestartCount
			}
			GinkgoWriter.Printf("%s: %s ready=%v restarts=%d\n", p.Name, p.Status.Phase, podReady(&p), rs)
		}
	}
	if suite.logs != nil {
		suite.logs.dumpTails(300)
	}
}
