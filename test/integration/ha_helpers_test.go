package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/proxy/proxytest"
)

// haReplica is one ProxyGroup replica run in-process, as its Pod would run it; it can be
// stopped gracefully, as on SIGTERM, and started again.
type haReplica struct {
	name   string // the Pod's and the state Secret's
	opts   proxy.Options
	logs   *syncLog
	cancel context.CancelFunc
	done   chan error
}

func newHAReplica(t *testing.T, w *world, pg string, i int, certs *proxytest.CA) *haReplica {
	t.Helper()
	name := fmt.Sprintf("%s-%d", pg, i)
	pod := &corev1.Pod{}
	eventually(t, 30*time.Second, "Pod "+name, func() error {
		return w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: name}, pod)
	})
	r := &haReplica{name: name, logs: &syncLog{}}
	r.opts = proxy.Options{
		ConfigSecret: name + "-config", GroupConfigMap: pg + "-ingress-config", Kube: w.cp.Config, Namespace: w.opNS,
		PodUID: string(pod.UID), StateDir: t.TempDir(), CertSource: certs,
		Logger: slog.New(slog.NewTextHandler(r.logs, nil)),
	}
	if os.Geteuid() == 0 {
		// Its own namespace for the TUN, which a root test would otherwise add to the host.
		r.opts.NetNS = proxytest.NewNetNS(t, fmt.Sprintf("pg%d", i)).Path
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
	go func() { r.done <- proxy.Run(ctx, r.opts) }()
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
	if !st.CurrentFor(r.opts.PodUID) || !slices.Contains(st.Advertised, svc) {
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

// haLoad sends GET requests at a steady rate, each on a new connection so that every one is
// routed afresh, and records those that fail or are slow.
type haLoad struct {
	start time.Time
	mu    sync.Mutex
	total int
	fails []haRequest
	slow  []haRequest // successes that took over a second
	wg    sync.WaitGroup
}

// haRequest is one request: when it started, from the load's start, and how it went.
type haRequest struct {
	at   time.Duration
	took time.Duration
	err  error
}

func (r haRequest) String() string {
	if r.err != nil {
		return fmt.Sprintf("%.2fs: %v", r.at.Seconds(), r.err)
	}
	return fmt.Sprintf("%.2fs: took %s", r.at.Seconds(), r.took.Round(time.Millisecond))
}

func startHALoad(ctx context.Context, c *tsnet.Server, pool *x509.CertPool, url, want string, every time.Duration) *haLoad {
	httpc := &http.Client{
		// Longer than the stalls WireGuard's handshake retries can cause, so that those show as
		// slow, and what fails has really failed.
		Timeout: 15 * time.Second,
		Transport: &http.Transport{DialContext: c.Dial, TLSClientConfig: &tls.Config{RootCAs: pool},
			DisableKeepAlives: true},
	}
	l := &haLoad{start: time.Now()}
	l.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			l.wg.Go(func() {
				began := time.Now()
				err := haGet(httpc, url, want)
				r := haRequest{at: began.Sub(l.start), took: time.Since(began), err: err}
				l.mu.Lock()
				defer l.mu.Unlock()
				l.total++
				if err != nil {
					l.fails = append(l.fails, r)
				} else if r.took > time.Second {
					l.slow = append(l.slow, r)
				}
			})
		}
	})
	return l
}

func haGet(c *http.Client, url, want string) error {
	res, err := c.Get(url)
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

// wait waits for the requests in flight once ctx has ended.
func (l *haLoad) wait() (total int, fails, slow []haRequest) {
	l.wg.Wait()
	return l.total, l.fails, l.slow
}

// since is the time from the load's start.
func (l *haLoad) since() time.Duration {
	return time.Since(l.start)
}
