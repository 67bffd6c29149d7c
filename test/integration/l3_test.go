package integration

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// A tailscale LoadBalancer Service from creation to deletion, in each firewall mode: the
// operator writes the proxy's config, the proxy runs from it with its kernel data path in a
// network namespace, a tailnet client reaches the Service's backends over TCP and UDP, the
// Service reports ready with its tailnet name and addresses, and deleting it removes the
// device, the proxy's objects and, once the proxy stops, every rule and the TUN.
func TestL3ServiceWholeFlow(t *testing.T) {
	netnstest.NeedRoot(t, "nft")
	for _, mode := range []contract.FirewallMode{contract.FirewallNFTables, contract.FirewallIPTables} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == contract.FirewallIPTables {
				if _, err := exec.LookPath("iptables"); err != nil {
					t.Skip("kernel test: needs iptables (apt-get install iptables)")
				}
			}
			testL3Flow(t, mode)
		})
	}
}

func testL3Flow(t *testing.T, mode contract.FirewallMode) {
	w := startWorldWith(t, localtailnet.Options{}, mode)
	laptop := joinClient(t, w, "laptop")
	start := time.Now()
	phase := func(what string) {
		t.Logf("%s: %s after the Service was created", what, time.Since(start).Round(10*time.Millisecond))
	}

	ns := "l3-" + string(mode)
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
		Spec: corev1.ServiceSpec{
			Type:              corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass: ptr.To(kit.LoadBalancerClass),
			Ports: []corev1.ServicePort{
				{Name: "pg", Port: proxytest.EchoTCPPort, Protocol: corev1.ProtocolTCP},
				{Name: "dns", Port: proxytest.EchoUDPPort, Protocol: corev1.ProtocolUDP},
			},
		},
	}
	if err := w.k8s.Create(w.ctx, svc); err != nil {
		t.Fatal(err)
	}
	// The backend answers on the ClusterIP that the apiserver allocated, as kube-proxy would
	// make it reachable from the proxy Pod.
	clusterIP, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !clusterIP.Is4() {
		t.Fatalf("ClusterIP %q: %v", svc.Spec.ClusterIP, err)
	}
	top := proxytest.NewTopology(t, clusterIP)

	// The operator writes the proxy's Secret; kube-controller-manager creates its Pod. The proxy
	// runs here in-process from that Secret, as the Pod would.
	parent := client.MatchingLabels{kit.LabelParentName: "db", kit.LabelParentNS: ns, kit.LabelParentType: "svc"}
	var sts appsv1.StatefulSet
	var pod corev1.Pod
	poll.Eventually(t, 30*time.Second, "proxy StatefulSet, Secret and Pod", func() error {
		list := &appsv1.StatefulSetList{}
		if err := w.k8s.List(w.ctx, list, client.InNamespace(w.opNS), parent); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d StatefulSets", len(list.Items))
		}
		sts = list.Items[0]
		if err := w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: sts.Name + "-0"}, &corev1.Secret{}); err != nil {
			return err
		}
		return w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: sts.Name + "-0"}, &pod)
	})
	phase("proxy Secret and Pod")
	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy logs:\n%s", logs)
		}
	})
	runCtx, stopProxy := context.WithCancel(w.ctx)
	var proxyErr error
	proxyDone := make(chan struct{})
	go func() {
		defer close(proxyDone)
		proxyErr = proxy.Run(runCtx, proxy.Options{
			ConfigSecret: sts.Name + "-0", Kube: w.cp.Config, Namespace: w.opNS, PodUID: string(pod.UID),
			StateDir: t.TempDir(), NetNS: top.Proxy.Path, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		})
	}()
	// Before the namespaces and the tailnet go, also when the test fails early.
	t.Cleanup(func() { stopProxy(); <-proxyDone })

	fqdn := ns + "-db." + w.lt.Domain
	var tailnetIPs []string
	poll.Eventually(t, 60*time.Second, "Service ready", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
			return err
		}
		c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionProxyReady)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != kit.ReasonProxyReady {
			return fmt.Errorf("condition %+v", c)
		}
		lb := svc.Status.LoadBalancer.Ingress
		if len(lb) < 2 || lb[0].Hostname != fqdn {
			return fmt.Errorf("load balancer status %+v, want %s and the tailnet IPs", lb, fqdn)
		}
		tailnetIPs = nil
		for _, in := range lb[1:] {
			tailnetIPs = append(tailnetIPs, in.IP)
		}
		return nil
	})
	phase("Service ready")
	// The addresses the operator published are the device's, of the Service's family only: the
	// IPv6 one would refuse connections to an IPv4-only Service.
	st, err := contract.ParseState(mustSecret(t, w, sts.Name+"-0").Data)
	if err != nil || st.DeviceID == "" {
		t.Fatalf("proxy state %+v, %v", st, err)
	}
	dev, err := w.api.Device(w.ctx, st.DeviceID)
	if err != nil {
		t.Fatal(err)
	}
	var devIPs []string
	for _, a := range dev.Addresses {
		if a.Is4() {
			devIPs = append(devIPs, a.String())
		}
	}
	slices.Sort(devIPs)
	if got := slices.Sorted(slices.Values(tailnetIPs)); !slices.Equal(got, devIPs) {
		t.Errorf("load balancer IPs %v, the device has %v", got, devIPs)
	}
	if st.Firewall == nil || st.Firewall.Mode != mode || st.Firewall.PodUID != string(pod.UID) {
		t.Errorf("firewall status %+v, want mode %s from Pod %s", st.Firewall, mode, pod.UID)
	}

	var ip4 netip.Addr
	for _, s := range tailnetIPs {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			ip4 = a
		}
	}
	proxytest.ExpectBackend(t, laptop, ip4, clusterIP)
	phase("TCP and UDP echo over the tailnet")

	if err := w.k8s.Delete(w.ctx, svc); err != nil {
		t.Fatal(err)
	}
	lc, err := laptop.LocalClient()
	if err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, "cleanup", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(svc), svc); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Service still there (%v)", err)
		}
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(&sts), &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("StatefulSet still there (%v)", err)
		}
		if _, err := w.api.Device(w.ctx, st.DeviceID); !tailnet.IsNotFound(err) {
			return fmt.Errorf("device %s still on the tailnet (%v)", st.DeviceID, err)
		}
		status, err := lc.Status(w.ctx)
		if err != nil {
			return err
		}
		for _, peer := range status.Peer {
			if slices.Contains(peer.TailscaleIPs, ip4) {
				return fmt.Errorf("the client still sees the proxy %s as a peer", peer.HostName)
			}
		}
		return nil
	})
	phase("Service, proxy objects and device gone")

	if left := proxytest.Leftovers(t, top.Proxy); len(left) == 0 {
		t.Fatal("no TUN or rules found while the proxy runs: the leftover check sees nothing")
	}
	stopProxy()
	select {
	case <-proxyDone:
		if proxyErr != nil {
			t.Errorf("proxy: %v", proxyErr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy did not stop")
	}
	if left := proxytest.Leftovers(t, top.Proxy); len(left) > 0 {
		t.Errorf("after the proxy stopped, still there:\n%s", strings.Join(left, "\n"))
	}
	phase("whole flow, proxy stopped and clean")
	if strings.Contains(logs.String(), "tskey-") {
		t.Error("a key appears in the proxy's logs")
	}
}

// syncBuffer collects logs written from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
