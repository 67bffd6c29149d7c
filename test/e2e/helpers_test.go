//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The backend: agnhost netexec, as in config/samples, answering HTTP on 8080 (/echo?msg=) and
// UDP on 8081 ("echo <text>"), behind a Service with ports 80 and 8081.
const (
	defaultBackendImage = "registry.k8s.io/e2e-test-images/agnhost:2.53"
	backendService      = "echo"
	httpPort            = 80
	udpPort             = 8081
)

// specNamespace is the current spec's namespace, for the dump on failure.
var specNamespace string

// token is a random lower-case word: unique tailnet names and echo payloads.
func token() string { return strings.ToLower(rand.Text()[:8]) }

// newNamespace creates the spec's namespace and deletes it after the spec, once the objects the
// spec deleted are gone, and waits until it is gone too: a namespace left Terminating (no
// namespace controller, a finalizer nobody removes) fails the spec.
func newNamespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}
	Expect(suite.k8s.Create(ctx, ns)).To(Succeed())
	specNamespace = ns.Name
	deleteAfter(ns)
	return ns.Name
}

// deleteAfter deletes obj after the spec and waits until it is gone: an Ingress or Service
// goes once the operator has removed its proxy and device.
func deleteAfter(obj client.Object) {
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(suite.k8s.Delete(ctx, obj))).To(Succeed())
		Eventually(ctx, func() error { return suite.k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj) }).
			Should(Satisfy(apierrors.IsNotFound), "%T %s still there", obj, obj.GetName())
	})
}

func create(ctx context.Context, obj client.Object) {
	GinkgoHelper()
	Expect(suite.k8s.Create(ctx, obj)).To(Succeed())
	deleteAfter(obj)
}

// newBackend gives the namespace the Service "echo" with an HTTP port named http. Where no
// workload Pods run (the local environment), it is an ExternalName for the environment's
// backend; elsewhere agnhost runs behind it.
func newBackend(ctx context.Context, ns string) {
	GinkgoHelper()
	if suite.localBackend != "" {
		host, port, err := net.SplitHostPort(suite.localBackend)
		Expect(err).NotTo(HaveOccurred(), "E2E_LOCAL_BACKEND")
		p, err := strconv.Atoi(port)
		Expect(err).NotTo(HaveOccurred(), "E2E_LOCAL_BACKEND")
		create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: backendService},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: host,
				Ports: []corev1.ServicePort{{Name: "http", Port: int32(p)}}},
		})
		return
	}
	labels := map[string]string{"app": backendService}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: backendService},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "echo", Image: suite.backendImage,
					Args: []string{"netexec", "--http-port=8080", fmt.Sprintf("--udp-port=%d", udpPort)},
				}}},
			},
		},
	}
	create(ctx, dep)
	create(ctx, backendServiceFor(ns, backendService, corev1.ServiceTypeClusterIP))
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.k8s.Get(ctx, client.ObjectKeyFromObject(dep), dep)).To(Succeed())
		g.Expect(dep.Status.AvailableReplicas).To(BeNumerically(">=", 1))
	}).Should(Succeed(), "the backend Deployment available")
}

// backendServiceFor is a Service for the agnhost Pods: HTTP at 80 (named http) and UDP at 8081.
func backendServiceFor(ns, name string, typ corev1.ServiceType) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": backendService},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: httpPort, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
				{Name: "udp", Port: udpPort, TargetPort: intstr.FromInt32(udpPort), Protocol: corev1.ProtocolUDP},
			},
		},
	}
}

// newIngress is an Ingress of class tailscale for the echo backend at tailnet name host, on
// ProxyGroup group if set.
func newIngress(ns, name, host, group string) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{host}}},
			DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
				Name: backendService, Port: networkingv1.ServiceBackendPort{Name: "http"}}},
		},
	}
	if group != "" {
		ing.Annotations = map[string]string{"tailscale.com/proxy-group": group}
	}
	return ing
}

// servedName waits for the Ingress's status to name it on the tailnet, as host.<tailnet domain>.
func servedName(ctx context.Context, ing *networkingv1.Ingress, host string) string {
	GinkgoHelper()
	var fqdn string
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
		lb := ing.Status.LoadBalancer.Ingress
		g.Expect(lb).To(HaveLen(1))
		fqdn = lb[0].Hostname
	}).Should(Succeed(), "Ingress %s/%s status", ing.Namespace, ing.Name)
	Expect(fqdn).To(HavePrefix(host + "."))
	return fqdn
}

// expectHTTPSEcho waits until https://fqdn/ answers from the backend, over the tailnet, with a
// certificate the suite trusts for that name.
func expectHTTPSEcho(ctx context.Context, fqdn string) {
	GinkgoHelper()
	hc := tailnetHTTPClient(15 * time.Second)
	defer hc.CloseIdleConnections()
	expectEcho(ctx, hc, "https://"+fqdn)
}

// tailnetHTTPClient makes requests over the tailnet, trusting the suite's roots for HTTPS.
func tailnetHTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: suite.dial, TLSClientConfig: &tls.Config{RootCAs: suite.roots}}}
}

func expectEcho(ctx context.Context, hc *http.Client, base string) {
	GinkgoHelper()
	Eventually(ctx, func() error {
		err := echoOnce(ctx, hc, base)
		if err != nil {
			// Not asked again: a connection made before the path was in place may lead elsewhere
			// for its whole life (the node's conntrack keeps its first routing decision).
			hc.CloseIdleConnections()
		}
		return err
	}).Should(Succeed(), "GET %s/echo over the tailnet", base)
}

// echoOnce asks the backend at base to echo a fresh word, and fails unless it does.
func echoOnce(ctx context.Context, hc *http.Client, base string) error {
	want := token()
	got, err := get(ctx, hc, base+"/echo?msg="+want, nil)
	if err == nil && got != want {
		err = fmt.Errorf("echoed %q, want %q", got, want)
	}
	return err
}

// get returns the body of a 200 answer to a GET of url with the given request headers.
func get(ctx context.Context, hc *http.Client, url string, header http.Header) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), err
}

// expectUDPEcho waits until a datagram to dst comes back echoed.
func expectUDPEcho(ctx context.Context, dst netip.AddrPort) {
	GinkgoHelper()
	want := token()
	Eventually(ctx, func() (string, error) {
		c, err := suite.dial(ctx, "udp", dst.String())
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := fmt.Fprintf(c, "echo %s", want); err != nil {
			return "", err
		}
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}).Should(Equal(want), "UDP echo at %s over the tailnet", dst)
}

// expectWarning waits for a Warning Event with reason on the object.
func expectWarning(ctx context.Context, obj client.Object, reason string) {
	GinkgoHelper()
	Eventually(ctx, func(g Gomega) []string {
		events := &corev1.EventList{}
		g.Expect(suite.k8s.List(ctx, events, client.InNamespace(obj.GetNamespace()))).To(Succeed())
		var reasons []string
		for _, e := range events.Items {
			if e.InvolvedObject.Name == obj.GetName() && e.InvolvedObject.UID == obj.GetUID() && e.Type == corev1.EventTypeWarning {
				reasons = append(reasons, e.Reason)
			}
		}
		return reasons
	}).Should(ContainElement(reason), "a Warning Event %s on %s", reason, obj.GetName())
}

// dumpEvents writes a namespace's Events, oldest first.
func dumpEvents(ctx context.Context, ns string) {
	events := &corev1.EventList{}
	if err := suite.k8s.List(ctx, events, client.InNamespace(ns)); err != nil {
		GinkgoWriter.Printf("listing the Events of %s: %v\n", ns, err)
		return
	}
	slices.SortFunc(events.Items, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	GinkgoWriter.Printf("\n----- Events in namespace %s -----\n", ns)
	for _, e := range events.Items {
		GinkgoWriter.Printf("%s %s %s/%s %s: %s\n", eventTime(e).Format(time.RFC3339), e.Type,
			strings.ToLower(e.InvolvedObject.Kind), e.InvolvedObject.Name, e.Reason, e.Message)
	}
}

// eventTime is when an Event last happened, whichever API recorded it.
func eventTime(e corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	return e.EventTime.Time
}

// dumpLogs writes the tail of a log: the file when one is named, otherwise the logs of the Pods
// in the operator's namespace with the label selector.
func dumpLogs(ctx context.Context, what, file, selector string) {
	const lines = 300
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			GinkgoWriter.Printf("reading the %s log: %v\n", what, err)
			return
		}
		all := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
		GinkgoWriter.Printf("\n----- %s log %s (last %d lines) -----\n%s\n", what, file, lines, bytes.Join(all[max(0, len(all)-lines):], []byte("\n")))
		return
	}
	pods, err := suite.clientset.CoreV1().Pods(suite.opNS).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		GinkgoWriter.Printf("listing the %s Pods: %v\n", what, err)
		return
	}
	for _, pod := range pods.Items {
		b, err := suite.clientset.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{TailLines: ptr.To[int64](lines)}).DoRaw(ctx)
		GinkgoWriter.Printf("\n----- %s Pod %s (last %d lines) -----\n%s\n", what, pod.Name, lines, b)
		if err != nil {
			GinkgoWriter.Printf("(%v)\n", err)
		}
	}
}

// dumpPods writes what kubectl describe shows of a namespace's Pods: phase, conditions, and each
// container's state, last termination and restarts.
func dumpPods(ctx context.Context, ns string) {
	if ns == "" {
		return
	}
	pods := &corev1.PodList{}
	if err := suite.k8s.List(ctx, pods, client.InNamespace(ns)); err != nil {
		GinkgoWriter.Printf("listing the Pods of %s: %v\n", ns, err)
		return
	}
	GinkgoWriter.Printf("\n----- Pods in namespace %s -----\n", ns)
	for _, p := range pods.Items {
		GinkgoWriter.Printf("%s: phase %s, node %s, IP %s\n", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.PodIP)
		for _, c := range p.Status.Conditions {
			GinkgoWriter.Printf("  condition %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			GinkgoWriter.Printf("  container %s: ready %v, restarts %d, state %s", cs.Name, cs.Ready, cs.RestartCount, containerState(cs.State))
			if t := cs.LastTerminationState.Terminated; t != nil {
				GinkgoWriter.Printf(", last terminated %s (exit %d): %s", t.Reason, t.ExitCode, t.Message)
			}
			GinkgoWriter.Println()
		}
	}
}

func containerState(s corev1.ContainerState) string {
	switch {
	case s.Waiting != nil:
		return "waiting: " + s.Waiting.Reason + " " + s.Waiting.Message
	case s.Terminated != nil:
		return fmt.Sprintf("terminated: %s (exit %d) %s", s.Terminated.Reason, s.Terminated.ExitCode, s.Terminated.Message)
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.Format(time.RFC3339)
	}
	return "unknown"
}
