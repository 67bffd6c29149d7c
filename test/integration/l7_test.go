package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func TestL7IngressWholeFlow(t *testing.T) {
	start := time.Now()
	w := startWorld(t)
	ns := "shop"
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	web, api := newRecordingBackend(t, "web"), newRecordingBackend(t, "api")
	for _, s := range []*corev1.Service{loopbackService(ns, "web", web.port()), loopbackService(ns, "api", api.port())} {
		if err := w.k8s.Create(w.ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	svcBackend := func(name string) networkingv1.IngressBackend {
		return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: name, Port: networkingv1.ServiceBackendPort{Name: "http"}}}
	}
	exact, prefix := networkingv1.PathTypeExact, networkingv1.PathTypePrefix
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "store", Annotations: map[string]string{kit.AnnotationHTTPRedirect: "true"}},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{"store"}}},
			DefaultBackend:   ptr.To(svcBackend("web")),
			Rules: []networkingv1.IngressRule{{IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{
				{Path: "/api", PathType: &prefix, Backend: svcBackend("api")},
				{Path: "/metrics", PathType: &exact, Backend: svcBackend("api")},
			}}}}},
		},
	}
	if err := w.k8s.Create(w.ctx, ing); err != nil {
		t.Fatal(err)
	}

	// The operator writes the proxy's Secret; kube-controller-manager creates its Pod. The proxy
	// runs here in-process from that Secret, as the Pod would.
	ca := proxytest.NewCA(t)
	p := runStandaloneProxy(t, w, client.MatchingLabels{kit.LabelParentName: "store"}, proxy.Options{CertSource: ca})

	poll.Eventually(t, 60*time.Second, "Ingress status", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(ing), ing); err != nil {
			return err
		}
		if lb := ing.Status.LoadBalancer.Ingress; len(lb) != 1 || lb[0].Hostname != "store.tailnet.test" {
			return fmt.Errorf("status %+v", lb)
		}
		return nil
	})
	t.Logf("Ingress served %s after creation", time.Since(start))

	cl := joinClient(t, w, "laptop")
	httpc := &http.Client{
		Timeout:       10 * time.Second,
		Transport:     &http.Transport{DialContext: cl.Dial, TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	get := func(url string) (int, string, http.Header) {
		t.Helper()
		resp, err := httpc.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Header
	}
	base := "https://store.tailnet.test"
	for path, want := range map[string]string{
		"/":           "web /",
		"/cart/1":     "web /cart/1",
		"/api":        "api /api",
		"/api/v1/x":   "api /api/v1/x",
		"/apiary":     "web /apiary", // Prefix matches whole path elements only
		"/metrics":    "api /metrics",
		"/metrics/go": "web /metrics/go", // Exact is exact
	} {
		if code, body, _ := get(base + path); code != 200 || body != want {
			t.Errorf("GET %s = %d %q, want 200 %q", path, code, body, want)
		}
	}
	h := api.lastHeaders()
	clientIP, _ := cl.TailscaleIPs()
	if h.Get("X-Forwarded-Proto") != "https" || !strings.Contains(h.Get("X-Forwarded-For"), clientIP.String()) {
		t.Errorf("forwarding headers at the backend: %v", h)
	}
	if h.Get("Tailscale-User-Login") != "alice@example.com" || h.Get("Tailscale-User-Name") != "Alice Example" {
		t.Errorf("identity headers at the backend: login %q name %q", h.Get("Tailscale-User-Login"), h.Get("Tailscale-User-Name"))
	}
	code, _, hdr := get("http://store.tailnet.test/cart?x=1")
	if code != http.StatusMovedPermanently || hdr.Get("Location") != base+"/cart?x=1" {
		t.Errorf("port 80 = %d %q, want a 301 to https", code, hdr.Get("Location"))
	}

	// A new route reaches the running proxy without a restart.
	patch := client.MergeFrom(ing.DeepCopy())
	ing.Spec.Rules[0].HTTP.Paths = append(ing.Spec.Rules[0].HTTP.Paths, networkingv1.HTTPIngressPath{Path: "/new", PathType: &exact, Backend: svcBackend("api")})
	if err := w.k8s.Patch(w.ctx, ing, patch); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "new route", func() error {
		if _, body, _ := get(base + "/new"); body != "api /new" {
			return fmt.Errorf("got %q", body)
		}
		return nil
	})
	p.expectRunning(t, "on a route change")

	// Deleting the Ingress removes the proxy's device from the tailnet and its objects.
	st, err := contract.ParseState(mustSecret(t, w, p.secret.Name).Data)
	if err != nil || st.DeviceID == "" {
		t.Fatalf("state before delete: %+v, %v", st, err)
	}
	if err := w.k8s.Delete(w.ctx, ing); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, "cleanup", func() error {
		if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(ing), ing); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Ingress still there (%v)", err)
		}
		if _, err := w.api.Device(w.ctx, st.DeviceID); !tailnet.IsNotFound(err) {
			return fmt.Errorf("device %s still on the tailnet (%v)", st.DeviceID, err)
		}
		if err := w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: p.secret.Name}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Secret still there (%v)", err)
		}
		return nil
	})
	t.Logf("whole flow took %s", time.Since(start))
}
