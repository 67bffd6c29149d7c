package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/gateway"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// TestGatewayWholeFlow serves a Gateway with an HTTPRoute through a real proxy on the local
// tailnet: HTTPS and HTTP requests from a tailnet client reach the route's backends, a rule
// whose Service is missing fails instead of falling through, and deleting the Gateway removes
// its proxy.
func TestGatewayWholeFlow(t *testing.T) {
	start := time.Now()
	w := startWorld(t)
	// The operator started without the Gateway API CRDs; it serves Gateways once they are in.
	if err := w.cp.InstallCRDs(filepath.Join("..", "..", "config", "gateway-api")); err != nil {
		t.Fatal(err)
	}
	gw, err := client.New(w.cp.Config, client.Options{Scheme: w.k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := "shop"
	web, api := newRecordingBackend(t, "web"), newRecordingBackend(t, "api")
	prefix, exact := gatewayv1.PathMatchPathPrefix, gatewayv1.PathMatchExact
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		loopbackService(ns, "web", web.port()), loopbackService(ns, "api", api.port()),
		&gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "tailscale"}, Spec: gatewayv1.GatewayClassSpec{ControllerName: gateway.ControllerName}},
		kubeobj.Gateway(ns, "edge", "tailscale", kubeobj.Listener("https", gatewayv1.HTTPSProtocolType, 443), kubeobj.Listener("http", gatewayv1.HTTPProtocolType, 80)),
		kubeobj.HTTPRoute(ns, "store", "edge",
			kubeobj.HTTPRule(prefix, "/api", "", "api", int(api.port())),
			kubeobj.HTTPRule(exact, "/metrics", "", "api", int(api.port())),
			kubeobj.HTTPRule(prefix, "/gone", "", "gone", 80),
			kubeobj.HTTPRule(prefix, "/", "", "web", int(web.port()))),
	} {
		if err := gw.Create(w.ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// The proxy runs in-process from the Secret the operator writes, as its Pod would.
	ca := proxytest.NewCA(t)
	p := runStandaloneProxy(t, w, client.MatchingLabels{kit.LabelParentName: "edge", kit.LabelParentType: proxies.ParentTypeGateway}, proxy.Options{CertSource: ca})

	const fqdn = "shop-edge-gateway.tailnet.test"
	edge := &gatewayv1.Gateway{}
	poll.Eventually(t, 60*time.Second, "Gateway programmed", func() error {
		if err := gw.Get(w.ctx, client.ObjectKey{Namespace: ns, Name: "edge"}, edge); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(edge.Status.Conditions, "Programmed"); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("Programmed %+v", c)
		}
		if a := edge.Status.Addresses; len(a) < 2 || a[0].Value != fqdn {
			return fmt.Errorf("addresses %+v", a)
		}
		return nil
	})
	t.Logf("Gateway programmed %s after creation", time.Since(start))

	cl := joinClient(t, w, "laptop")
	httpc := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{DialContext: cl.Dial, TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}},
	}
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := httpc.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, base := range []string{"https://" + fqdn, "http://" + fqdn} {
		for path, want := range map[string]string{
			"/":           "web /",
			"/api/v1":     "api /api/v1",
			"/apiary":     "web /apiary", // PathPrefix matches whole path elements
			"/metrics":    "api /metrics",
			"/metrics/go": "web /metrics/go", // Exact is exact
		} {
			if code, body := get(base + path); code != http.StatusOK || body != want {
				t.Errorf("GET %s%s = %d %q, want 200 %q", base, path, code, body, want)
			}
		}
	}
	// The rule whose Service is missing fails rather than reach the / rule's backend.
	if code, body := get("https://" + fqdn + "/gone/x"); code != http.StatusInternalServerError {
		t.Errorf("GET /gone/x = %d %q, want 500", code, body)
	}
	if h := api.lastHeaders(); h.Get("Tailscale-User-Login") != "alice@example.com" {
		t.Errorf("identity headers at the backend: %v", h)
	}

	// Deleting the Gateway removes its proxy's device from the tailnet and its objects.
	st, err := contract.ParseState(mustSecret(t, w, p.secret.Name).Data)
	if err != nil || st.DeviceID == "" {
		t.Fatalf("state before delete: %+v, %v", st, err)
	}
	if err := gw.Delete(w.ctx, edge); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, "cleanup", func() error {
		if err := gw.Get(w.ctx, client.ObjectKeyFromObject(edge), edge); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Gateway still there (%v)", err)
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
