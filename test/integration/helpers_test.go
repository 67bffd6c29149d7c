// Package integration tests whole flows: the operator's reconcilers on a real control plane,
// proxies run in-process from the Secrets the operator writes, and clients on a local tailnet.
package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"tailscale.com/net/netns"
	"tailscale.com/tsnet"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/testenv"
)

// world is a whole flow's environment: a real control plane (kube-apiserver, etcd,
// kube-controller-manager) running the operator's reconcilers, and a local tailnet.
type world struct {
	k8s     client.Client
	metrics *prometheus.Registry // the operator's
	cp      *testenv.ControlPlane
	lt      *localtailnet.LocalTailnet
	api     *tailnet.APIClient
	opNS    string
	ctx     context.Context
	cancel  context.CancelFunc
}

func startWorld(t *testing.T) *world {
	return startWorldWith(t, localtailnet.Options{HTTPS: true}, contract.FirewallAuto)
}

// startWorldWith starts a world whose tailnet has the given options and whose operator gives
// L3 proxies the given firewall mode.
func startWorldWith(t *testing.T, tailnetOpts localtailnet.Options, mode contract.FirewallMode) *world {
	t.Helper()
	lt, _ := localtailnettest.Start(t, tailnetOpts)
	return startCluster(t, lt, mode)
}

// startCluster starts a control plane running an operator that uses the tailnet lt: a world
// of its own, or one of several clusters on one tailnet. tune changes the operator's settings.
func startCluster(t *testing.T, lt *localtailnet.LocalTailnet, mode contract.FirewallMode, tune ...func(*kit.Settings)) *world {
	t.Helper()
	netns.SetEnabled(false)
	ctx, cancel := context.WithCancel(context.Background())
	w := &world{opNS: "tailscale", ctx: ctx, cancel: cancel, lt: lt}
	var err error
	if w.cp, err = testenv.Start(filepath.Join("..", "..", "config", "crd", "bases")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.cp.Stop() })
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := tsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if w.k8s, err = client.New(w.cp.Config, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	if err := w.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.opNS}}); err != nil {
		t.Fatal(err)
	}
	// An API client of its own, as each cluster's operator has.
	if w.api, err = w.lt.APIClient(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	// Each test runs its own operator in this process, with metrics of its own.
	w.metrics = prometheus.NewRegistry()
	settings := kit.Settings{
		Namespace: w.opNS, IngressClassName: "tailscale", DefaultTags: []string{"tag:k8s"},
		ProxyImage: "unused", FirewallMode: mode, ControlURL: w.lt.ControlURL, Metrics: w.metrics,
	}
	for _, f := range tune {
		f(&settings)
	}
	mgr, err := ctrl.NewManager(w.cp.Config, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, Cache: controller.CacheOptions(settings),
		// Each test runs its own operator in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.Setup(mgr, settings, w.api); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// recordingBackend is an HTTP server on loopback that answers with its name and the path, and
// keeps the headers of the last request.
type recordingBackend struct {
	*httptest.Server
	mu   sync.Mutex
	last http.Header
}

func newRecordingBackend(t *testing.T, name string) *recordingBackend {
	b := &recordingBackend{}
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		b.last = r.Header.Clone()
		b.mu.Unlock()
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *recordingBackend) port() int32 {
	_, p, _ := net.SplitHostPort(b.Listener.Addr().String())
	n, _ := strconv.Atoi(p)
	return int32(n)
}

func (b *recordingBackend) lastHeaders() http.Header {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// loopbackService is an ExternalName Service for a backend on this machine: the proxy reaches
// it by name, so the test needs no ClusterIP routing.
func loopbackService(ns, name string, port int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "http", Port: port}}},
	}
}

// joinClient joins a person's device (login alice@example.com) to the tailnet.
func joinClient(t *testing.T, w *world, hostname string) *tsnet.Server {
	t.Helper()
	return joinUser(t, w, hostname, "alice@example.com", "Alice Example")
}

// joinUser joins the device of the person with that login and name to the tailnet.
func joinUser(t *testing.T, w *world, hostname, login, name string) *tsnet.Server {
	t.Helper()
	key := w.lt.MintUserKey(login, name)
	s := &tsnet.Server{Dir: t.TempDir(), Hostname: hostname, ControlURL: w.lt.ControlURL, AuthKey: key.Reveal(), Ephemeral: true}
	upCtx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
	defer cancel()
	if _, err := s.Up(upCtx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustSecret(t *testing.T, w *world, name string) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: name}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

// standaloneProxy is a standalone proxy run in-process from what the operator wrote, as its Pod
// would run it.
type standaloneProxy struct {
	secret corev1.Secret // its config Secret
	pod    corev1.Pod
	ended  chan struct{} // closed when the proxy returns, its error in err
	err    error
}

// runStandaloneProxy waits for the config Secret and the Pod of the standalone proxy of the
// parent the labels select, and runs the proxy until the test ends. opts adds what the Pod's
// own flags would not give it (a certificate source instead of the tailnet's, a health
// listener).
func runStandaloneProxy(t *testing.T, w *world, parent client.MatchingLabels, opts proxy.Options) *standaloneProxy {
	t.Helper()
	p := &standaloneProxy{ended: make(chan struct{})}
	poll.Eventually(t, 60*time.Second, fmt.Sprintf("proxy Secret and Pod of %v", parent), func() error {
		list := &corev1.SecretList{}
		if err := w.k8s.List(w.ctx, list, client.InNamespace(w.opNS), parent); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Secrets", len(list.Items))
		}
		p.secret = list.Items[0]
		return w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: p.secret.Name}, &p.pod)
	})
	opts.ConfigSecret, opts.Kube, opts.Namespace, opts.PodUID, opts.StateDir = p.secret.Name, w.cp.Config, w.opNS, string(p.pod.UID), t.TempDir()
	ctx, stop := context.WithCancel(w.ctx)
	go func() {
		p.err = proxy.Run(ctx, opts)
		close(p.ended)
	}()
	t.Cleanup(func() {
		stop()
		<-p.ended
		if p.err != nil {
			t.Errorf("proxy of %v: %v", parent, p.err)
		}
	})
	return p
}

// expectRunning fails the test if the proxy has returned, which it does only when told to.
func (p *standaloneProxy) expectRunning(t *testing.T, after string) {
	t.Helper()
	select {
	case <-p.ended:
		t.Fatalf("the proxy stopped %s: %v", after, p.err)
	default:
	}
}
