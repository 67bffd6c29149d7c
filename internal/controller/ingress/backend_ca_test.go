package ingress

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func TestBackendCAAndServerName(t *testing.T) {
	bundle := proxytest.NewCA(t).RootPEM()
	services := map[string]*corev1.Service{
		"app": kubeobj.Service("app", "10.96.0.20", corev1.ServicePort{Name: "web", Port: 8443}),
		"tls": kubeobj.Service("tls", "10.96.0.21", corev1.ServicePort{Name: "https", Port: 443}),
		"ext": {ObjectMeta: metav1.ObjectMeta{Name: "ext"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeExternalName, ExternalName: "api.example.com", Ports: []corev1.ServicePort{{Port: 443}}}},
	}
	good := BackendCA{ConfigMap: "shop-ca", PEM: bundle}
	for _, tc := range []struct {
		name         string
		backend      string
		annotations  map[string]string
		ca           BackendCA
		want         *contract.Backend // nil: left out
		wantFindings []string
	}{
		{name: "a CA makes a backend on any port verified https, for its Service's name", backend: "app", ca: good,
			annotations: map[string]string{kit.AnnotationBackendCA: "shop-ca"},
			want:        &contract.Backend{URL: "https://10.96.0.20:8443", CABundle: bundle, ServerName: "app.shop.svc"}},
		{name: "on port 443 too, which is otherwise unverified", backend: "tls", ca: good,
			annotations: map[string]string{kit.AnnotationBackendCA: "shop-ca"},
			want:        &contract.Backend{URL: "https://10.96.0.21:443", CABundle: bundle, ServerName: "tls.shop.svc"}},
		{name: "a server name of the user's", backend: "app", ca: good,
			annotations: map[string]string{kit.AnnotationBackendCA: "shop-ca", kit.AnnotationBackendServerName: "app.internal.example"},
			want:        &contract.Backend{URL: "https://10.96.0.20:8443", CABundle: bundle, ServerName: "app.internal.example"}},
		{name: "an ExternalName Service is verified for its external name", backend: "ext", ca: good,
			annotations: map[string]string{kit.AnnotationBackendCA: "shop-ca"},
			want:        &contract.Backend{URL: "https://api.example.com:443", CABundle: bundle}},
		{name: "a server name alone verifies against the system's roots", backend: "tls",
			annotations: map[string]string{kit.AnnotationBackendServerName: "tls.example.com"},
			want:        &contract.Backend{URL: "https://10.96.0.21:443", ServerName: "tls.example.com"}},
		{name: "a CA that cannot be used leaves the backend out, never unverified", backend: "app",
			ca:          BackendCA{ConfigMap: "shop-ca", Problem: "ConfigMap shop/shop-ca does not exist"},
			annotations: map[string]string{kit.AnnotationBackendCA: "shop-ca"}, wantFindings: []string{kit.ReasonInvalidBackendCA}},
		{name: "a CA with a protocol that is not verified https is named and not used", backend: "app", ca: good,
			annotations:  map[string]string{kit.AnnotationBackendCA: "shop-ca", kit.AnnotationBackendProtocol: "https-insecure"},
			want:         &contract.Backend{URL: "https://10.96.0.20:8443", InsecureSkipVerify: true},
			wantFindings: []string{kit.ReasonInvalidAnnotation}},
		{name: "a server name with http is named and not used", backend: "app",
			annotations:  map[string]string{kit.AnnotationBackendServerName: "app.shop.svc", kit.AnnotationBackendProtocol: "http"},
			want:         &contract.Backend{URL: "http://10.96.0.20:8443"},
			wantFindings: []string{kit.ReasonInvalidAnnotation}},
		{name: "a server name that is no DNS name falls back to the default", backend: "app", ca: good,
			annotations:  map[string]string{kit.AnnotationBackendCA: "shop-ca", kit.AnnotationBackendServerName: "not a name"},
			want:         &contract.Backend{URL: "https://10.96.0.20:8443", CABundle: bundle, ServerName: "app.shop.svc"},
			wantFindings: []string{kit.ReasonInvalidAnnotation}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "shop", Annotations: tc.annotations},
				Spec: networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend(tc.backend, 0))}}
			ing.Spec.DefaultBackend.Service.Port = networkingv1.ServiceBackendPort{Number: services[tc.backend].Spec.Ports[0].Port}
			ws, findings := BuildWebService(ing, RouteInputs{Services: services, BackendCA: tc.ca})
			var got *contract.Backend
			if len(ws.Routes) == 1 {
				got = &ws.Routes[0].Backend
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("backend:\n got %+v\nwant %+v", got, tc.want)
			}
			var reasons []string
			for _, f := range findings {
				reasons = append(reasons, f.Reason)
			}
			if !reflect.DeepEqual(reasons, tc.wantFindings) {
				t.Errorf("findings %v (%+v), want %v", reasons, findings, tc.wantFindings)
			}
			if tc.want != nil {
				cfg := contract.WebService{Routes: ws.Routes}
				if err := cfg.Validate(); err != nil {
					t.Errorf("the proxy would refuse it: %v", err)
				}
			}
		})
	}
}

func TestReadBackendCA(t *testing.T) {
	bundle := proxytest.NewCA(t).RootPEM()
	cm := func(name string, data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}, Data: data}
	}
	api := fake.NewClientBuilder().WithObjects(
		cm("good", map[string]string{BackendCAKey: bundle}),
		cm("other-key", map[string]string{"trust-bundle.pem": bundle}),
		cm("not-pem", map[string]string{BackendCAKey: "hello"}),
	).Build()
	for _, tc := range []struct {
		annotation, wantPEM, wantProblem string
	}{
		{annotation: ""},
		{annotation: "good", wantPEM: bundle},
		{annotation: "missing", wantProblem: "ConfigMap shop/missing does not exist"},
		{annotation: "other-key", wantProblem: "has no key ca.crt"},
		{annotation: "not-pem", wantProblem: "holds no PEM certificate"},
		{annotation: "Not_A_Name", wantProblem: "is not a ConfigMap name"},
	} {
		t.Run(tc.annotation, func(t *testing.T) {
			ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "shop",
				Annotations: map[string]string{kit.AnnotationBackendCA: tc.annotation}}}
			got, err := readBackendCA(t.Context(), api, ing)
			if err != nil {
				t.Fatal(err)
			}
			if got.ConfigMap != tc.annotation || got.PEM != tc.wantPEM || (tc.wantProblem == "") != (got.Problem == "") ||
				!strings.Contains(got.Problem, tc.wantProblem) {
				t.Errorf("got %+v, want PEM %t, problem %q", got, tc.wantPEM != "", tc.wantProblem)
			}
		})
	}
}
