package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
)

// podRunner stands in for the kubelet: it runs each proxy Pod of the operator's StatefulSets
// (standalone L7 and L3 proxies, ProxyGroup replicas) as an in-process proxy with that Pod's
// arguments and identity, restarts it when it exits, and reports the Pod's phase and readiness
// (from the proxy's /readyz) back.
type podRunner struct {
	k8s  client.Client
	kube *rest.Config
	logs io.Writer // the proxies' log
	noL3 string    // why kernel proxies cannot run here; "" when they can
	// acmeDirectory is the one ACME directory of every in-process proxy (the local CA's).
	acmeDirectory string
	print         func(format string, args ...any)

	mu   sync.Mutex
	pods map[types.UID]context.CancelFunc
	// stopped is closed when the proxy of the Pod of that name has stopped. A kubelet starts a
	// StatefulSet's next Pod of a name once the last one's containers exited; here the Pod
	// object goes at once (no node), so the new one waits for the old proxy's drain, or two
	// processes would run the same device.
	stopped     map[string]chan struct{}
	seq         int
	serviceCIDR netip.Prefix
	wg          sync.WaitGroup
}

// run keeps the running proxies in line with the Pods until ctx ends, then stops them all and
// waits until they have shut down and their namespaces are gone.
func (p *podRunner) run(ctx context.Context) {
	p.pods = map[types.UID]context.CancelFunc{}
	p.stopped = map[string]chan struct{}{}
	defer p.wg.Wait()
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
	live := map[types.UID]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil {
			continue
		}
		live[pod.UID] = true
		p.mu.Lock()
		_, started := p.pods[pod.UID]
		draining := false
		if ch, ok := p.stopped[pod.Name]; ok && !started {
			select {
			case <-ch:
			default:
				draining = true // started at a later sync
			}
		}
		p.mu.Unlock()
		if !started && !draining {
			p.start(ctx, pod)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for uid, stop := range p.pods {
		if !live[uid] {
			stop()
			delete(p.pods, uid)
		}
	}
}

// start runs a Pod's proxy; a Pod that cannot run here is left Pending, with the reason.
func (p *podRunner) start(ctx context.Context, pod *corev1.Pod) {
	podCtx, cancel := context.WithCancel(ctx)
	p.mu.Lock()
	p.pods[pod.UID] = cancel
	p.seq++
	seq := p.seq
	p.mu.Unlock()

	c := pod.Spec.Containers[0]
	opts := proxy.Options{
		Kube: p.kube, Namespace: pod.Namespace, PodUID: string(pod.UID),
		Logger: slog.New(slog.NewTextHandler(p.logs, nil)).With("pod", pod.Name),
	}
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--config-secret="); ok {
			opts.ConfigSecret = strings.ReplaceAll(v, "$(POD_NAME)", pod.Name)
		}
		if v, ok := strings.CutPrefix(a, "--group-configmap="); ok {
			opts.GroupConfigMap = v
		}
		if a == "--group-l7-only" {
			opts.GroupL7Only = true
		}
	}
	if why := p.needsOwnProcess(ctx, pod.Namespace, opts.ConfigSecret); why != "" {
		p.print("  ! proxy Pod %s is not run: %s\n", pod.Name, why)
		p.reportPending(ctx, pod, why)
		return
	}
	kernel := c.SecurityContext != nil && c.SecurityContext.Capabilities != nil &&
		slices.Contains(c.SecurityContext.Capabilities.Add, "NET_ADMIN")
	var pn *podNet
	switch {
	case kernel && p.noL3 != "" && opts.GroupConfigMap == "":
		p.print("  ! L3 proxy Pod %s is not run (%s)\n", pod.Name, p.noL3)
		p.reportPending(ctx, pod, "devenv runs L3 proxies only as root ("+p.noL3+")")
		return
	case kernel && p.noL3 != "":
		// A replica serves L7 without its kernel data path.
		p.print("  ! ProxyGroup replica %s runs without its kernel data path, L7 only (%s)\n", pod.Name, p.noL3)
	case kernel:
		cidr, err := p.clusterServiceCIDR(ctx)
		if err == nil {
			pn, err = newPodNet(seq, cidr)
		}
		if err != nil {
			p.print("  ! proxy Pod %s is not run: %v\n", pod.Name, err)
			p.reportPending(ctx, pod, err.Error())
			return
		}
		opts.NetNS = pn.proxyPath()
	}
	dir, err := os.MkdirTemp("", "devenv-"+pod.Name+"-")
	if err != nil {
		p.print("  ! proxy Pod %s is not run: %v\n", pod.Name, err)
		return
	}
	opts.StateDir = dir
	stopped := make(chan struct{})
	p.mu.Lock()
	p.stopped[pod.Name] = stopped
	p.mu.Unlock()
	p.wg.Go(func() {
		defer close(stopped)
		defer os.RemoveAll(dir) //nolint:errcheck // best effort: it lies in the run directory, removed at the end
		p.runPod(podCtx, pod, opts)
		// After the proxy, which removes its TUN device and rules from the namespace first.
		if pn != nil {
			if err := pn.close(); err != nil {
				p.print("  ! removing the network namespaces of Pod %s: %v\n", pod.Name, err)
			}
		}
	})
}

// needsOwnProcess says why a proxy cannot share this process with the others, or "". The ACME
// directory is process-wide in tailscaled: a proxy asking for another one (a ProxyClass's
// Let's Encrypt staging switch) would move every in-process proxy's certificates there.
func (p *podRunner) needsOwnProcess(ctx context.Context, ns, configSecret string) string {
	if configSecret == "" {
		return ""
	}
	sec := &corev1.Secret{}
	if err := p.k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: configSecret}, sec); err != nil {
		return "" // the proxy reports it
	}
	cfg, _, err := contract.ProxyConfigs.Decode(sec.Data)
	if err != nil {
		return ""
	}
	if dir := cfg.TLS.ACMEDirectoryURL; dir != "" && dir != p.acmeDirectory {
		return fmt.Sprintf("its config asks for ACME directory %s, and devenv's in-process proxies share one (the local CA's); run it on a cluster (make test-e2e)", dir)
	}
	return ""
}

// runPod runs the proxy until ctx ends, restarting it as a kubelet does (restartPolicy Always).
func (p *podRunner) runPod(ctx context.Context, pod *corev1.Pod, opts proxy.Options) {
	started := metav1.Now()
	for restarts := int32(0); ; restarts++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.print("  ! proxy Pod %s: health endpoint: %v\n", pod.Name, err)
			return
		}
		opts.HealthListener = ln
		probeCtx, stopProbe := context.WithCancel(ctx)
		go p.probe(probeCtx, pod, "http://"+ln.Addr().String()+"/readyz", restarts, started)
		err = proxy.Run(ctx, opts)
		stopProbe()
		ln.Close()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, proxy.ErrRestartRequired) {
			opts.Logger.Info("restarting the proxy, as its kubelet would", "reason", err)
		} else {
			p.print("  ! proxy Pod %s stopped: %v; restarting it\n", pod.Name, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// probe reports the Pod running, and ready whenever the proxy's /readyz says so.
func (p *podRunner) probe(ctx context.Context, pod *corev1.Pod, url string, restarts int32, started metav1.Time) {
	hc := &http.Client{Timeout: time.Second}
	reported := false
	ready := false
	for {
		ok := false
		if resp, err := hc.Get(url); err == nil {
			resp.Body.Close()
			ok = resp.StatusCode == http.StatusOK
		}
		if !reported || ok != ready {
			ready, reported = ok, p.reportRunning(ctx, pod, ok, restarts, started) == nil
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (p *podRunner) reportRunning(ctx context.Context, pod *corev1.Pod, ready bool, restarts int32, started metav1.Time) error {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	return p.patchStatus(ctx, pod, corev1.PodStatus{
		Phase: corev1.PodRunning, StartTime: &started, PodIP: "127.0.0.1",
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: pod.Spec.Containers[0].Name, Image: "in-process", Ready: ready, RestartCount: restarts,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		}},
	})
}

// reportPending says in the Pod's status why it does not run.
func (p *podRunner) reportPending(ctx context.Context, pod *corev1.Pod, why string) {
	// patchStatus logs a failure; the Pod stays as it was.
	_ = p.patchStatus(ctx, pod, corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "NotRunLocally", Message: why,
		LastTransitionTime: metav1.Now(),
	}}})
}

func (p *podRunner) patchStatus(ctx context.Context, pod *corev1.Pod, status corev1.PodStatus) error {
	meta := metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}
	err := p.k8s.Status().Patch(ctx, &corev1.Pod{ObjectMeta: meta, Status: status}, client.MergeFrom(&corev1.Pod{ObjectMeta: meta}))
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(p.logs, "reporting the status of Pod %s: %v\n", pod.Name, err)
	}
	return err
}

// clusterServiceCIDR is the IPv4 range the apiserver takes ClusterIPs from.
func (p *podRunner) clusterServiceCIDR(ctx context.Context) (netip.Prefix, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.serviceCIDR.IsValid() {
		return p.serviceCIDR, nil
	}
	sc := &networkingv1.ServiceCIDR{}
	if err := p.k8s.Get(ctx, client.ObjectKey{Name: "kubernetes"}, sc); err != nil {
		return netip.Prefix{}, fmt.Errorf("the cluster's service range: %w", err)
	}
	for _, c := range sc.Spec.CIDRs {
		if pfx, err := netip.ParsePrefix(c); err == nil && pfx.Addr().Is4() {
			p.serviceCIDR = pfx
			return pfx, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("ServiceCIDR kubernetes has no IPv4 range: %v", sc.Spec.CIDRs)
}
