package integration

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/tsnet"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
	"github.com/tsingress/tsingress/internal/testing/tailnetdial"
)

// haReplica is one ProxyGroup replica run in-process, as its Pod would run it; it can be
// stopped gracefully, as on SIGTERM, and started again.
type haReplica struct {
	name   string // the Pod's and the state Secret's
	w      *world
	logs   *syncLog
	cancel context.CancelFunc
	done   chan error

	mu   sync.Mutex
	opts proxy.Options // PodUID follows the Pod
}

// newHAReplica prepares replica i of group pg. Its kernel data path goes into netns, or as root
// with netns "" into a namespace of its own.
func newHAReplica(t *testing.T, w *world, pg string, i int, certs *proxytest.CA, netns string) *haReplica {
	t.Helper()
	name := fmt.Sprintf("%s-%d", pg, i)
	pod := &corev1.Pod{}
	poll.Eventually(t, 30*time.Second, "Pod "+name, func() error {
		return w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: name}, pod)
	})
	r := &haReplica{name: name, w: w, logs: &syncLog{}}
	r.opts = proxy.Options{
		ConfigSecret: name + "-config", GroupConfigMap: pg + "-ingress-config", Kube: w.cp.Config, Namespace: w.opNS,
		PodUID: string(pod.UID), StateDir: t.TempDir(), NetNS: netns, TailnetPort: freeUDPPort(t),
		Logger: slog.New(slog.NewTextHandler(r.logs, nil)),
	}
	if certs != nil {
		r.opts.CertSource = certs
	}
	if netns == "" && os.Geteuid() == 0 {
		// Its own namespace for the TUN, which a root test would otherwise add to the host.
		r.opts.NetNS = netnstest.New(t, fmt.Sprintf("pg%d", i)).Path
	}
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, r.logs)
		}
	})
	return r
}

func (r *haReplica) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.run(ctx) }()
}

// run runs the proxy as a kubelet runs its Pod's container: when the StatefulSet replaces the
// Pod (a new template: the first Service put on a group rolls it onto the kernel path), the
// proxy stops as on SIGTERM and starts again for the new Pod.
func (r *haReplica) run(ctx context.Context) error {
	for {
		r.mu.Lock()
		opts := r.opts
		r.mu.Unlock()
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- proxy.Run(runCtx, opts) }()
		replacement := r.untilReplaced(runCtx, opts.PodUID, done)
		stop()
		err := <-done
		if replacement == "" || err != nil {
			return err
		}
		r.mu.Lock()
		r.opts.PodUID = replacement
		r.mu.Unlock()
	}
}

// untilReplaced waits until the replica's Pod is replaced and returns the new Pod's UID; ""
// when ctx ends or the proxy did (its result is then put back on done).
func (r *haReplica) untilReplaced(ctx context.Context, uid string, done chan error) string {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			done <- err
			return ""
		case <-ctx.Done():
			return ""
		case <-tick.C:
		}
		pod := &corev1.Pod{}
		if err := r.w.k8s.Get(ctx, client.ObjectKey{Namespace: r.w.opNS, Name: r.name}, pod); err == nil &&
			string(pod.UID) != uid && pod.DeletionTimestamp == nil {
			return string(pod.UID)
		}
	}
}

// stop ends the replica as SIGTERM does and waits until it has drained.
func (r *haReplica) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("%s: Run: %v", r.name, err)
		}
	case <-time.After(time.Minute):
		t.Errorf("%s did not stop", r.name)
	}
}

// advertises reports whether the replica's running Pod says it advertises svc.
func (r *haReplica) advertises(w *world, svc string) error {
	sec := &corev1.Secret{}
	if err := w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: r.name}, sec); err != nil {
		return err
	}
	st, err := contract.ParseState(sec.Data)
	if err != nil {
		return err
	}
	r.mu.Lock()
	uid := r.opts.PodUID
	r.mu.Unlock()
	if !st.CurrentFor(uid) || !slices.Contains(st.Advertised, svc) {
		return fmt.Errorf("%s advertises %v (pod %s)", r.name, st.Advertised, st.PodUID)
	}
	return nil
}

type syncLog struct {
	mu sync.Mutex
	sb strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sb.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sb.String()
}

// haLoad sends requests at a steady rate, each on a new connection so that every one is routed
// afresh, taking its targets in turn, and records how each went.
type haLoad struct {
	start time.Time
	mu    sync.Mutex
	reqs  []haRequest
	wg    sync.WaitGroup
}

// haRequest is one request: when it started, from the load's start, where to, and how it went.
type haRequest struct {
	at, took time.Duration
	target   string
	answer   string // who answered, for requests that say
	err      error
}

func (r haRequest) String() string {
	if r.err != nil {
		return fmt.Sprintf("%.2fs %s: %v", r.at.Seconds(), r.target, r.err)
	}
	return fmt.Sprintf("%.2fs %s: took %s", r.at.Seconds(), r.target, r.took.Round(time.Millisecond))
}

// haRequestTimeout is longer than the stalls WireGuard's handshake retries can cause, so that
// those show as slow, and what fails has really failed.
const haRequestTimeout = 15 * time.Second

// startHALoad runs do every interval, on the targets in turn, until ctx ends. do returns who
// answered, if it can tell.
func startHALoad(ctx context.Context, every time.Duration, targets []string, do func(ctx context.Context, target string) (string, error)) *haLoad {
	l := &haLoad{start: time.Now()}
	l.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			target := targets[n%len(targets)]
			l.wg.Go(func() {
				// Not ctx: requests under way when the load stops finish.
				rctx, cancel := context.WithTimeout(context.Background(), haRequestTimeout)
				defer cancel()
				began := time.Now()
				answer, err := do(rctx, target)
				r := haRequest{at: began.Sub(l.start), took: time.Since(began), target: target, answer: answer, err: err}
				l.mu.Lock()
				defer l.mu.Unlock()
				l.reqs = append(l.reqs, r)
			})
		}
	})
	return l
}

// wait waits for the requests in flight once ctx has ended, and returns them all, in the order
// they started.
func (l *haLoad) wait() []haRequest {
	l.wg.Wait()
	slices.SortFunc(l.reqs, func(a, b haRequest) int { return cmp.Compare(a.at, b.at) })
	return l.reqs
}

// since is the time from the load's start.
func (l *haLoad) since() time.Duration {
	return time.Since(l.start)
}

// haReport is what a load came to.
type haReport struct {
	total      int
	fails      []haRequest
	slow       []haRequest // successes that took over a second
	p50, p99   time.Duration
	max        time.Duration
	answeredBy map[string]int
}

func summarize(reqs []haRequest) haReport {
	rep := haReport{total: len(reqs), answeredBy: map[string]int{}}
	var took []time.Duration
	for _, r := range reqs {
		switch {
		case r.err != nil:
			rep.fails = append(rep.fails, r)
			continue
		case r.took > time.Second:
			rep.slow = append(rep.slow, r)
		}
		took = append(took, r.took)
		rep.answeredBy[r.answer]++
	}
	if len(took) > 0 {
		slices.Sort(took)
		rep.p50, rep.p99, rep.max = took[len(took)/2], took[len(took)*99/100], took[len(took)-1]
	}
	return rep
}

func (rep haReport) String() string {
	return fmt.Sprintf("%d of %d requests failed, %d took over a second; latency p50 %s, p99 %s, max %s",
		len(rep.fails), rep.total, len(rep.slow), rep.p50.Round(100*time.Microsecond), rep.p99.Round(100*time.Microsecond), rep.max.Round(time.Millisecond))
}

// haTimeline notes what happened during a load, and when the client's route may have moved.
type haTimeline struct {
	load  *haLoad
	lines []string
	moves []time.Duration
}

func (tl *haTimeline) mark(move bool, format string, args ...any) {
	at := tl.load.since()
	tl.lines = append(tl.lines, fmt.Sprintf("%.2fs: ", at.Seconds())+fmt.Sprintf(format, args...))
	if move {
		tl.moves = append(tl.moves, at)
	}
}

// nearMove reports whether a request started close enough to a route change to be caught by
// it: the change lies between its mark and the state that led to it, which the test sees a
// little later.
func (tl *haTimeline) nearMove(r haRequest) bool {
	return slices.ContainsFunc(tl.moves, func(m time.Duration) bool { return r.at > m-time.Second && r.at < m+500*time.Millisecond })
}

func (tl *haTimeline) String() string { return strings.Join(tl.lines, "\n  ") }

// haHTTPClient makes each request on a new connection through c, over the tailnet only.
func haHTTPClient(c *tsnet.Server, pool *x509.CertPool) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: tailnetdial.For(c), TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
}

func haGet(ctx context.Context, c *http.Client, url, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK || string(body) != want {
		return fmt.Errorf("%d %q", res.StatusCode, body)
	}
	return nil
}

// freeUDPPort finds a UDP port for a replica's WireGuard to keep across restarts, as a Pod's
// proxy keeps 41641 (here every replica shares the host's network).
func freeUDPPort(t *testing.T) uint16 {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// newHAGroupWithBackend creates namespace ns with a recording backend behind Service "web", and
// a ProxyGroup pg of two Ingress replicas.
func newHAGroupWithBackend(t *testing.T, w *world, ns, pg string) *recordingBackend {
	t.Helper()
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	backend := newRecordingBackend(t, "web")
	if err := w.k8s.Create(w.ctx, loopbackService(ns, "web", backend.port())); err != nil {
		t.Fatal(err)
	}
	if err := w.k8s.Create(w.ctx, &tsv1alpha1.ProxyGroup{
		ObjectMeta: metav1.ObjectMeta{Name: pg},
		Spec:       tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress, Replicas: ptr.To[int32](2)},
	}); err != nil {
		t.Fatal(err)
	}
	return backend
}

// webIngress is an Ingress of class tailscale for tailnet name host, with the annotations,
// whose default backend is port http of Service "web" (newHAGroupWithBackend's).
func webIngress(ns, name, host string, annotations map[string]string) *networkingv1.Ingress {
	return &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{host}}},
			DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
				Name: "web", Port: networkingv1.ServiceBackendPort{Name: "http"}}},
		},
	}
}

// newHAIngressWorld is newHAGroupWithBackend with Ingress "store" on the group for host.
func newHAIngressWorld(t *testing.T, w *world, ns, pg, host string) *networkingv1.Ingress {
	t.Helper()
	newHAGroupWithBackend(t, w, ns, pg)
	ing := webIngress(ns, "store", host, map[string]string{kit.AnnotationProxyGroup: pg})
	if err := w.k8s.Create(w.ctx, ing); err != nil {
		t.Fatal(err)
	}
	return ing
}
