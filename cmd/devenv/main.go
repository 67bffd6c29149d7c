// Command devenv runs the whole product on one machine, with no cluster and no Tailscale
// account: a real kube-apiserver, etcd and kube-controller-manager, a local tailnet with a real
// ACME CA, the operator, and the proxies its StatefulSets ask for (run here as in-process
// "Pods", since no kubelet runs). It serves a demo Ingress over HTTPS on the tailnet and proves
// it with a request from a tailnet client. Run it from the repository root (`make dev`).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"
	"tailscale.com/tsnet"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller"
	"github.com/tsingress/tsingress/internal/localtailnet"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testenv"
)

const operatorNamespace = "tailscale"

func main() {
	once := flag.Bool("once", false, "Prove the demo Ingress, then shut down (for CI and smoke tests).")
	verbose := flag.Bool("v", false, "Show the operator's logs.")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *once, *verbose); err != nil {
		fmt.Fprintf(os.Stderr, "devenv: %v\n", err)
		os.Exit(1)
	}
}

// step prints progress: what is starting, then how long it took.
func step(what string) func() {
	start := time.Now()
	fmt.Printf("  … %s\n", what)
	return func() { fmt.Printf("  ✓ %s (%s)\n", what, time.Since(start).Round(time.Millisecond)) }
}

func run(ctx context.Context, once, verbose bool) error {
	if verbose {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	} else {
		ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	}
	fmt.Println("Starting the local environment:")

	done := step("local tailnet: control server, DERP, DNS, API and ACME CA on 127.0.0.1")
	lt, err := localtailnet.Start(context.Background(), localtailnet.Options{ACME: true})
	if err != nil {
		return err
	}
	defer lt.Close()
	// tailscaled's ACME client (in the in-process proxies) must trust the local CA's API.
	if err := lt.ACME.UseInProcess(func(k, v string) { os.Setenv(k, v) }); err != nil {
		return err
	}
	done()

	done = step("Kubernetes control plane: kube-apiserver, etcd, kube-controller-manager")
	cp, err := testenv.Start(filepath.Join("config", "crd", "bases"))
	if err != nil {
		return fmt.Errorf("%w (run from the repository root, after `make envtest`, with KUBEBUILDER_ASSETS set; `make dev` does both)", err)
	}
	defer cp.Stop()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := tsv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	k8s, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	if err := applyFile(ctx, k8s, filepath.Join("config", "ingressclass", "ingressclass.yaml"), &networkingv1.IngressClass{}); err != nil {
		return err
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}); err != nil {
		return err
	}
	done()

	done = step("operator")
	oauthDir, err := os.MkdirTemp("", "devenv-oauth-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(oauthDir)
	idFile, secretFile, err := lt.WriteOAuthFiles(oauthDir)
	if err != nil {
		return err
	}
	api, err := tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: lt.APIBaseURL, ClientIDFile: idFile, ClientSecretFile: secretFile})
	if err != nil {
		return err
	}
	settings := controller.Settings{
		Namespace: operatorNamespace, IngressClassName: "tailscale", DefaultTags: []string{"tag:k8s"},
		ProxyImage: "in-process", FirewallMode: contract.FirewallAuto, ControlURL: lt.ControlURL,
	}
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: controller.CacheOptions(settings),
	})
	if err != nil {
		return err
	}
	if err := controller.Setup(mgr, settings, api); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		if err := mgr.Start(runCtx); err != nil {
			fmt.Fprintf(os.Stderr, "operator stopped: %v\n", err)
		}
	})
	kubelet := &podRunner{k8s: k8s, cfg: cp, logger: slog.New(slog.DiscardHandler)}
	if verbose {
		kubelet.logger = slog.Default()
	}
	wg.Go(func() { kubelet.run(runCtx) })
	done()

	done = step("demo: a backend and an Ingress with ingressClassName tailscale")
	backend, err := startBackend()
	if err != nil {
		return err
	}
	defer backend.Close()
	if err := createDemo(ctx, k8s, backend.Addr().(*net.TCPAddr).Port); err != nil {
		return err
	}
	done()

	done = step("waiting for the proxy to join the tailnet and get a certificate")
	host, err := waitServed(ctx, k8s)
	if err != nil {
		return err
	}
	done()

	done = step("proving it: HTTPS from a tailnet client")
	body, issuer, err := prove(ctx, lt, host)
	if err != nil {
		return err
	}
	done()

	fmt.Printf(`
The demo Ingress is served at https://%s/
  answer:      %q
  certificate: issued by %q (the local ACME CA; roots in %s)

Point things at this environment:
  kubeconfig:     %s   (kubectl --kubeconfig %s get ingress -A)
  control server: %s   (tsnet ControlURL, or tailscale up --login-server)
  Tailscale API:  %s   (OAuth client in %s and %s)
`, host, body, issuer, lt.ACME.RootsFile, cp.Kubeconfig, cp.Kubeconfig, lt.ControlURL, lt.APIBaseURL, idFile, secretFile)
	if once {
		return nil
	}
	fmt.Println("Running; Ctrl-C stops everything.")
	<-ctx.Done()
	fmt.Println("Shutting down.")
	return nil
}

func applyFile(ctx context.Context, k8s client.Client, path string, obj client.Object) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(b, obj); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return k8s.Create(ctx, obj)
}

func startBackend() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello, %s, from the demo backend (path %s)\n", r.Header.Get("Tailscale-User-Login"), r.URL.Path)
	}))
	return ln, nil
}

// createDemo creates the demo Ingress. Its backend Service is an ExternalName for localhost:
// with no kube-proxy here, a ClusterIP would lead nowhere.
func createDemo(ctx context.Context, k8s client.Client, port int) error {
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "hello"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "http", Port: int32(port)}}}},
		&networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "hello"}, Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{"hello"}}},
			DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
				Name: "hello", Port: networkingv1.ServiceBackendPort{Name: "http"}}},
		}},
	}
	for _, o := range objs {
		if err := k8s.Create(ctx, o); err != nil {
			return err
		}
	}
	return nil
}

func waitServed(ctx context.Context, k8s client.Client) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		ing := &networkingv1.Ingress{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: "demo", Name: "hello"}, ing); err == nil {
			if lb := ing.Status.LoadBalancer.Ingress; len(lb) > 0 && lb[0].Hostname != "" {
				return lb[0].Hostname, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", errors.New("the demo Ingress was not served within 2 minutes (run with -v to see why)")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func prove(ctx context.Context, lt *localtailnet.LocalTailnet, host string) (body, issuer string, err error) {
	dir, err := os.MkdirTemp("", "devenv-client-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(dir)
	cl := &tsnet.Server{Dir: dir, Hostname: "your-laptop", ControlURL: lt.ControlURL, Ephemeral: true,
		AuthKey: lt.MintUserKey("you@example.com", "You").Reveal(), UserLogf: func(string, ...any) {}}
	defer cl.Close()
	upCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cl.Up(upCtx); err != nil {
		return "", "", err
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: cl.Dial, TLSClientConfig: &tls.Config{RootCAs: lt.ACME.Roots()}}}
	resp, err := hc.Get("https://" + host + "/")
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("GET https://%s/: %s", host, resp.Status)
	}
	return strings.TrimSpace(string(b)), resp.TLS.PeerCertificates[0].Issuer.String(), nil
}

// podRunner stands in for the kubelet: it runs each proxy Pod of the operator's StatefulSets
// as an in-process proxy with that Pod's arguments and identity, and reports the Pod running.
type podRunner struct {
	k8s    client.Client
	cfg    *testenv.ControlPlane
	logger *slog.Logger

	mu      sync.Mutex
	running map[string]context.CancelFunc // by Pod UID
}

func (p *podRunner) run(ctx context.Context) {
	p.running = map[string]context.CancelFunc{}
	for {
		p.sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (p *podRunner) sync(ctx context.Context) {
	pods := &corev1.PodList{}
	if err := p.k8s.List(ctx, pods, client.InNamespace(operatorNamespace), client.MatchingLabels{"app.kubernetes.io/name": "tsingress-proxy"}); err != nil {
		return
	}
	live := map[string]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		uid := string(pod.UID)
		live[uid] = true
		p.mu.Lock()
		_, started := p.running[uid]
		p.mu.Unlock()
		if started || pod.DeletionTimestamp != nil {
			continue
		}
		p.start(ctx, pod)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for uid, stop := range p.running {
		if !live[uid] {
			stop()
			delete(p.running, uid)
		}
	}
}

func (p *podRunner) start(ctx context.Context, pod *corev1.Pod) {
	c := pod.Spec.Containers[0]
	if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
		fmt.Printf("  ! Pod %s is an L3 proxy (kernel TUN and DNAT); the local environment runs L7 proxies only\n", pod.Name)
		p.mu.Lock()
		p.running[string(pod.UID)] = func() {}
		p.mu.Unlock()
		return
	}
	var secret string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--config-secret="); ok {
			secret = strings.ReplaceAll(v, "$(POD_NAME)", pod.Name)
		}
	}
	podCtx, cancel := context.WithCancel(ctx)
	p.mu.Lock()
	p.running[string(pod.UID)] = cancel
	p.mu.Unlock()
	dir, _ := os.MkdirTemp("", "devenv-"+pod.Name+"-")
	go func() {
		defer os.RemoveAll(dir)
		err := proxy.Run(podCtx, proxy.Options{
			ConfigSecret: secret, Kube: p.cfg.Config, Namespace: pod.Namespace, PodUID: string(pod.UID),
			StateDir: dir, Logger: p.logger,
		})
		if err != nil && podCtx.Err() == nil {
			fmt.Printf("  ! proxy Pod %s stopped: %v\n", pod.Name, err)
		}
	}()
	p.markRunning(ctx, pod)
}

// markRunning reports the Pod scheduled and running, as a kubelet would.
func (p *podRunner) markRunning(ctx context.Context, pod *corev1.Pod) {
	before := pod.DeepCopy()
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.PodIP = "127.0.0.1"
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: pod.Spec.Containers[0].Name, Ready: true,
		Image: "in-process", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if err := p.k8s.Status().Patch(ctx, pod, client.MergeFrom(before)); err != nil {
		p.logger.Error("reporting Pod status", "pod", pod.Name, "err", err)
	}
}
