//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/test/framework"
)

// newBackend gives the namespace the echo backend's Service (framework.BackendName) with an
// HTTP port named http. Where no workload Pods run (the local environment), it is an
// ExternalName for the environment's backend; elsewhere agnhost runs behind it.
func newBackend(ctx context.Context, ns string) {
	GinkgoHelper()
	if suite.localBackend == "" {
		suite.StartBackend(ctx, ns, suite.backendImage)
		return
	}
	host, port, err := net.SplitHostPort(suite.localBackend)
	Expect(err).NotTo(HaveOccurred(), "E2E_LOCAL_BACKEND")
	p, err := strconv.Atoi(port)
	Expect(err).NotTo(HaveOccurred(), "E2E_LOCAL_BACKEND")
	suite.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: framework.BackendName},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: host,
			Ports: []corev1.ServicePort{{Name: "http", Port: int32(p)}}},
	})
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
		DialContext: suite.Dial, TLSClientConfig: &tls.Config{RootCAs: suite.roots}}}
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
	want := framework.Token()
	got, err := get(ctx, hc, base+"/echo?msg="+want, nil)
	if err == nil && got != want {
		err = fmt.Errorf("echoed %q, want %q", got, want)
	}
	return err
}

// get returns the body of a 200 answer to a GET of url with the given request headers.
func get(ctx context.Context, hc *http.Client, url string, header http.Header) (string, error) {
	body, _, err := do(ctx, hc, http.MethodGet, url, header)
	return body, err
}

// do returns the body and headers of a 200 answer to a request of url with the given headers.
func do(ctx context.Context, hc *http.Client, method, url string, header http.Header) (string, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return "", nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), resp.Header, err
}

// expectUDPEcho waits until a datagram to dst comes back echoed.
func expectUDPEcho(ctx context.Context, dst netip.AddrPort) {
	GinkgoHelper()
	want := framework.Token()
	Eventually(ctx, func() (string, error) {
		c, err := suite.Dial(ctx, "udp", dst.String())
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
		g.Expect(suite.K8s.List(ctx, events, client.InNamespace(obj.GetNamespace()))).To(Succeed())
		var reasons []string
		for _, e := range events.Items {
			if e.InvolvedObject.Name == obj.GetName() && e.InvolvedObject.UID == obj.GetUID() && e.Type == corev1.EventTypeWarning {
				reasons = append(reasons, e.Reason)
			}
		}
		return reasons
	}).Should(ContainElement(reason), "a Warning Event %s on %s", reason, obj.GetName())
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
	sel, err := labels.Parse(selector)
	Expect(err).NotTo(HaveOccurred())
	pods := &corev1.PodList{}
	if err := suite.ListEach(ctx, pods, proxyNamespaces(), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		GinkgoWriter.Printf("listing the %s Pods: %v\n", what, err)
		return
	}
	for _, pod := range pods.Items {
		b, err := suite.Clientset.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{TailLines: ptr.To[int64](lines)}).DoRaw(ctx)
		GinkgoWriter.Printf("\n----- %s Pod %s (last %d lines) -----\n%s\n", what, pod.Name, lines, b)
		if err != nil {
			GinkgoWriter.Printf("(%v)\n", err)
		}
	}
}

// proxyParent selects the objects of obj's standalone proxy (parent type typ, e.g. "ingress").
func proxyParent(typ string, obj client.Object) client.MatchingLabels {
	return client.MatchingLabels{kit.LabelParentName: obj.GetName(), kit.LabelParentNS: obj.GetNamespace(), kit.LabelParentType: typ}
}

// proxyDevice waits for obj's standalone proxy to join the tailnet and returns its device's ID,
// checked against the tailnet's API.
func proxyDevice(ctx context.Context, typ string, obj client.Object) string {
	GinkgoHelper()
	var deviceID string
	Eventually(ctx, func(g Gomega) {
		list := &appsv1.StatefulSetList{}
		g.Expect(suite.ListEach(ctx, list, proxyNamespaces(), proxyParent(typ, obj))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1))
		state := &corev1.Secret{}
		g.Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: suite.opNS, Name: list.Items[0].Name + "-0"}, state)).To(Succeed())
		st, err := contract.ParseState(state.Data)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(st.DeviceID).NotTo(BeEmpty(), "the proxy's device")
		deviceID = st.DeviceID
	}).Should(Succeed(), "the proxy's StatefulSet of %s %s and its device in the state Secret", typ, obj.GetName())
	_, err := suite.API.Device(ctx, deviceID)
	Expect(err).NotTo(HaveOccurred(), "the device on the tailnet")
	return deviceID
}

// expectProxyGone waits until obj, being deleted, is gone with its standalone proxy: no
// StatefulSet, no Secret, and its device off the tailnet.
func expectProxyGone(ctx context.Context, typ string, obj client.Object, deviceID string) {
	GinkgoHelper()
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Satisfy(apierrors.IsNotFound), "the %s", typ)
		list := &appsv1.StatefulSetList{}
		g.Expect(suite.ListEach(ctx, list, proxyNamespaces(), proxyParent(typ, obj))).To(Succeed())
		g.Expect(list.Items).To(BeEmpty(), "StatefulSets")
		secrets := &corev1.SecretList{}
		g.Expect(suite.K8s.List(ctx, secrets, client.InNamespace(suite.opNS), proxyParent(typ, obj))).To(Succeed())
		g.Expect(secrets.Items).To(BeEmpty(), "Secrets")
		_, err := suite.API.Device(ctx, deviceID)
		g.Expect(tailnet.IsNotFound(err)).To(BeTrue(), "the device %s is still on the tailnet (%v)", deviceID, err)
	}).Should(Succeed(), "the proxy and device of %s %s gone", typ, obj.GetName())
}
