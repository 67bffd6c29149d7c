package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// tailscale.com/http-endpoint: enabled on an HA Ingress, whole flow: the ProxyGroup's replica
// serves the Ingress over plain HTTP on port 80 beside HTTPS, although the redirect annotation
// is set too, and the status lists port 80. The group's ProxyClass enables metrics: the
// replica counts both requests under the Ingress and reports the service it advertises, and
// the group owns its metrics Service and ServiceMonitor. Without the annotation port 80 redirects again and the
// status lists 443 alone.
func TestHAIngressHTTPEndpoint(t *testing.T) {
	w := startWorld(t)
	const ns, pg, host, svcName = "shop", "pg", "ha-web", "svc:ha-web"
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	backend := newRecordingBackend(t, "web")
	if err := w.k8s.Create(w.ctx, loopbackService(ns, "web", backend.port())); err != nil {
		t.Fatal(err)
	}
	installServiceMonitorCRD(t, w)
	if err := w.k8s.Create(w.ctx, &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "monitored"},
		Spec: tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true,
			ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true}}}}); err != nil {
		t.Fatal(err)
	}
	group := &tsv1alpha1.ProxyGroup{
		ObjectMeta: metav1.ObjectMeta{Name: pg},
		Spec:       tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress, Replicas: ptr.To[int32](1), ProxyClass: "monitored"},
	}
	if err := w.k8s.Create(w.ctx, group); err != nil {
		t.Fatal(err)
	}
	ing := webIngress(ns, "store", host, map[string]string{
		kit.AnnotationProxyGroup: pg, kit.AnnotationHTTPEndpoint: "enabled", kit.AnnotationHTTPRedirect: "true"})
	if err := w.k8s.Create(w.ctx, ing); err != nil {
		t.Fatal(err)
	}

	ca := proxytest.NewCA(t)
	r := newHAReplica(t, w, pg, 0, ca, "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.opts.HealthListener = ln
	r.start()
	fqdn := host + "." + w.lt.Domain
	ports := func(want ...int32) func() error {
		return func() error {
			if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(ing), ing); err != nil {
				return err
			}
			lb := ing.Status.LoadBalancer.Ingress
			if len(lb) != 1 || lb[0].Hostname != fqdn {
				return fmt.Errorf("status %+v", lb)
			}
			var got []int32
			for _, p := range lb[0].Ports {
				got = append(got, p.Port)
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("status ports %v, want %v", got, want)
			}
			return nil
		}
	}
	poll.Eventually(t, 60*time.Second, "Ingress status with ports 443 and 80", ports(443, 80))
	poll.Eventually(t, 30*time.Second, "replica advertising", func() error { return r.advertises(w, svcName) })

	cl := joinClient(t, w, "laptop")
	httpc := &http.Client{
		Timeout:       10 * time.Second,
		Transport:     &http.Transport{DialContext: cl.Dial, TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	get := func(url string) (int, string, error) {
		resp, err := httpc.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	for url, want := range map[string]string{"http://" + fqdn + "/plain": "web /plain", "https://" + fqdn + "/secure": "web /secure"} {
		poll.Eventually(t, 30*time.Second, "GET "+url, func() error {
			code, body, err := get(url)
			if err != nil || code != http.StatusOK || body != want {
				return fmt.Errorf("%d %q %v", code, body, err)
			}
			return nil
		})
	}

	poll.Eventually(t, 30*time.Second, "the replica's metrics and the group's metrics Service", func() error {
		code, fs, err := scrapeProxy(ln.Addr().String())
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("/metrics: %d %v", code, err)
		}
		for _, check := range []error{
			fs.expectValue("tsingress_proxy_http_requests_total", map[string]string{"ingress": "shop/store", "route": "/", "code": "200"}, ">= 2", func(v float64) bool { return v >= 2 }),
			fs.expectValue("tsingress_proxy_service_advertised", map[string]string{"service": svcName}, "1", func(v float64) bool { return v == 1 }),
			fs.expectValue("tsingress_proxy_config_generation", map[string]string{"document": "serve-config"}, ">= 1", func(v float64) bool { return v >= 1 }),
		} {
			if check != nil {
				return check
			}
		}
		svc := &corev1.Service{}
		sm := &unstructured.Unstructured{}
		sm.SetAPIVersion("monitoring.coreos.com/v1")
		sm.SetKind("ServiceMonitor")
		for _, obj := range []client.Object{svc, sm} {
			if err := w.k8s.Get(w.ctx, client.ObjectKey{Namespace: w.opNS, Name: pg + "-metrics"}, obj); err != nil {
				return err
			}
			if ref := metav1.GetControllerOf(obj); ref == nil || ref.Kind != "ProxyGroup" || ref.Name != pg {
				return fmt.Errorf("the metrics %T is not the ProxyGroup's: %+v", obj, ref)
			}
		}
		return nil
	})

	// Without the annotation the redirect takes port 80 back; without both, the status lists 443
	// alone.
	patch := client.MergeFrom(ing.DeepCopy())
	delete(ing.Annotations, kit.AnnotationHTTPEndpoint)
	if err := w.k8s.Patch(w.ctx, ing, patch); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "port 80 redirecting", func() error {
		code, _, err := get("http://" + fqdn + "/plain")
		if err != nil || code != http.StatusMovedPermanently {
			return fmt.Errorf("%d %v", code, err)
		}
		return nil
	})
	patch = client.MergeFrom(ing.DeepCopy())
	delete(ing.Annotations, kit.AnnotationHTTPRedirect)
	if err := w.k8s.Patch(w.ctx, ing, patch); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "status without port 80", ports(443))
}
