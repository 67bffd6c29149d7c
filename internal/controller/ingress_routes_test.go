package controller

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/contract"
)

func svc(name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
}

func backend(name string, port any) networkingv1.IngressBackend {
	b := networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: name}}
	switch p := port.(type) {
	case int:
		b.Service.Port.Number = int32(p)
	case string:
		b.Service.Port.Name = p
	}
	return b
}

func path(p string, typ networkingv1.PathType, b networkingv1.IngressBackend) networkingv1.HTTPIngressPath {
	return networkingv1.HTTPIngressPath{Path: p, PathType: &typ, Backend: b}
}

func rule(host string, paths ...networkingv1.HTTPIngressPath) networkingv1.IngressRule {
	return networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: paths}}}
}

func TestBuildWebService(t *testing.T) {
	services := map[string]*corev1.Service{
		"web":    svc("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80}, corev1.ServicePort{Name: "admin", Port: 8080}),
		"secure": svc("secure", "10.96.0.11", corev1.ServicePort{Name: "https", Port: 8443}),
		"tls443": svc("tls443", "fd00::11", corev1.ServicePort{Name: "x", Port: 443}),
		"head":   svc("head", "None", corev1.ServicePort{Port: 80}),
		"ext": {ObjectMeta: metav1.ObjectMeta{Name: "ext"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com", Ports: []corev1.ServicePort{{Port: 5000}}}},
	}
	route := func(p string, typ contract.PathType, url string, insecure bool) contract.Route {
		return contract.Route{Path: p, PathType: typ, Backend: contract.Backend{URL: url, InsecureSkipVerify: insecure}}
	}
	cases := []struct {
		name         string
		spec         networkingv1.IngressSpec
		annotations  map[string]string
		want         []contract.Route
		wantHTTP     contract.HTTPMode
		wantFindings []string // reasons, in order
	}{
		{
			name: "default backend by port name",
			spec: networkingv1.IngressSpec{DefaultBackend: ptr.To(backend("web", "http"))},
			want: []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
		},
		{
			name: "path types kept, implementation specific is prefix, default backend after rules",
			spec: networkingv1.IngressSpec{
				DefaultBackend: ptr.To(backend("web", 80)),
				Rules: []networkingv1.IngressRule{rule("",
					path("/metrics", networkingv1.PathTypeExact, backend("web", "admin")),
					path("/api", networkingv1.PathTypePrefix, backend("web", 8080)),
					path("/old", networkingv1.PathTypeImplementationSpecific, backend("web", 80)),
				)},
			},
			want: []contract.Route{
				route("/metrics", contract.PathExact, "http://10.96.0.10:8080", false),
				route("/api", contract.PathPrefix, "http://10.96.0.10:8080", false),
				route("/old", contract.PathPrefix, "http://10.96.0.10:80", false),
				route("/", contract.PathPrefix, "http://10.96.0.10:80", false),
			},
		},
		{
			name: "https detection by port name and number, IPv6 bracketed",
			spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule("",
				path("/a", networkingv1.PathTypePrefix, backend("secure", "https")),
				path("/b", networkingv1.PathTypePrefix, backend("tls443", 443)),
			)}},
			want: []contract.Route{
				route("/a", contract.PathPrefix, "https://10.96.0.11:8443", true),
				route("/b", contract.PathPrefix, "https://[fd00::11]:443", true),
			},
		},
		{
			name:        "backend protocol annotation",
			annotations: map[string]string{AnnotationBackendProtocol: "https"},
			spec:        networkingv1.IngressSpec{DefaultBackend: ptr.To(backend("web", 8080))},
			want:        []contract.Route{route("/", contract.PathPrefix, "https://10.96.0.10:8080", false)},
		},
		{
			name:         "bad protocol annotation falls back to detection",
			annotations:  map[string]string{AnnotationBackendProtocol: "grpc"},
			spec:         networkingv1.IngressSpec{DefaultBackend: ptr.To(backend("web", 80))},
			want:         []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantFindings: []string{ReasonInvalidAnnotation},
		},
		{
			name:        "redirect annotation",
			annotations: map[string]string{AnnotationHTTPRedirect: "true"},
			spec:        networkingv1.IngressSpec{DefaultBackend: ptr.To(backend("web", 80))},
			want:        []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantHTTP:    contract.HTTPRedirect,
		},
		{
			name: "external name backend",
			spec: networkingv1.IngressSpec{DefaultBackend: ptr.To(backend("ext", 5000))},
			want: []contract.Route{route("/", contract.PathPrefix, "http://db.example.com:5000", false)},
		},
		{
			name: "every bad backend is reported and skipped, the rest served",
			spec: networkingv1.IngressSpec{
				TLS: []networkingv1.IngressTLS{{Hosts: []string{"web.tailnet.test"}}},
				Rules: []networkingv1.IngressRule{
					rule("other.example.com", path("/x", networkingv1.PathTypePrefix, backend("web", 80))),
					rule("web.tailnet.test",
						path("/missing", networkingv1.PathTypePrefix, backend("nope", 80)),
						path("/badport", networkingv1.PathTypePrefix, backend("web", 9999)),
						path("/badname", networkingv1.PathTypePrefix, backend("web", "grpc")),
						path("/headless", networkingv1.PathTypePrefix, backend("head", 80)),
						path("", networkingv1.PathTypePrefix, backend("web", 80)),
						path("/ok", networkingv1.PathTypeExact, backend("web", 80)),
						path("/ok", networkingv1.PathTypeExact, backend("web", 8080)),
						path("regex.*", networkingv1.PathTypeImplementationSpecific, backend("web", 80)),
					),
				},
			},
			want: []contract.Route{
				route("/", contract.PathPrefix, "http://10.96.0.10:80", false),
				route("/ok", contract.PathExact, "http://10.96.0.10:80", false),
			},
			wantFindings: []string{ReasonUnsupportedHost, ReasonInvalidIngressBackend, ReasonInvalidIngressBackend,
				ReasonInvalidIngressBackend, ReasonInvalidIngressBackend, ReasonPathUndefined, ReasonDuplicatePath, ReasonUnsupportedPath},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "default", Annotations: tc.annotations}, Spec: tc.spec}
			ws, findings := buildWebService(ing, services)
			if !reflect.DeepEqual(ws.Routes, tc.want) {
				t.Errorf("routes:\n got %+v\nwant %+v", ws.Routes, tc.want)
			}
			if ws.HTTP != tc.wantHTTP {
				t.Errorf("http = %q, want %q", ws.HTTP, tc.wantHTTP)
			}
			var reasons []string
			for _, f := range findings {
				reasons = append(reasons, f.reason)
			}
			if !reflect.DeepEqual(reasons, tc.wantFindings) {
				t.Errorf("findings %v, want %v (%+v)", reasons, tc.wantFindings, findings)
			}
			if len(ws.Routes) > 0 {
				if err := ws.Validate(); err != nil {
					t.Errorf("built config does not validate: %v", err)
				}
			}
		})
	}
}

func TestIngressHostnameAndProxyName(t *testing.T) {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "web.v2", Namespace: "prod"}}
	if got := ingressHostname(ing); got != "prod-web-v2-ingress" {
		t.Errorf("hostname without TLS = %q", got)
	}
	ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"Shop.tailnet.test"}}}
	if got := ingressHostname(ing); got != "shop" {
		t.Errorf("hostname from TLS = %q", got)
	}
	long := parent{typ: "ingress", namespace: strings.Repeat("n", 63), name: strings.Repeat("x", 253)}
	for _, p := range []parent{long, {typ: "ingress", namespace: "a", name: "b.c"}} {
		n := p.proxyName()
		if len(n) > maxStatefulSetName || strings.ContainsAny(n, ".") || strings.HasSuffix(n, "-") {
			t.Errorf("proxy name %q is not a valid StatefulSet name within %d characters", n, maxStatefulSetName)
		}
	}
	other := long
	other.typ = "svc"
	if long.proxyName() == other.proxyName() {
		t.Error("an Ingress and a Service of the same name share a proxy name")
	}
}

// What stops an Ingress from being served, and what only leaves a part of it out.
func TestDecideIngressBlocking(t *testing.T) {
	services := map[string]*corev1.Service{"web": svc("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80})}
	ingress := func(mutate func(*networkingv1.Ingress)) *networkingv1.Ingress {
		ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shop"},
			Spec: networkingv1.IngressSpec{TLS: []networkingv1.IngressTLS{{Hosts: []string{"shop"}}},
				Rules: []networkingv1.IngressRule{rule("", path("/", networkingv1.PathTypePrefix, backend("web", 80)))}}}
		if mutate != nil {
			mutate(ing)
		}
		return ing
	}
	for name, c := range map[string]struct {
		ing      *networkingv1.Ingress
		byo      byoCertificates
		reasons  []string // of the findings, in order
		blocking bool
	}{
		"served": {ing: ingress(nil)},
		"a path to a missing Service is left out": {ing: ingress(func(i *networkingv1.Ingress) {
			i.Spec.Rules[0].HTTP.Paths = append(i.Spec.Rules[0].HTTP.Paths, path("/api", networkingv1.PathTypePrefix, backend("api", 80)))
		}), reasons: []string{ReasonInvalidIngressBackend}},
		"a bad bring-your-own Secret is left out": {ing: ingress(nil),
			byo: byoCertificates{findings: []finding{warnf(ReasonTLSSecretNotFound, "missing")}}, reasons: []string{ReasonTLSSecretNotFound}},
		"no path left": {ing: ingress(func(i *networkingv1.Ingress) {
			i.Spec.Rules[0] = rule("", path("/", networkingv1.PathTypePrefix, backend("api", 80)))
		}),
			reasons: []string{ReasonInvalidIngressBackend, ReasonNoValidBackends}, blocking: true},
		"a malformed tag": {ing: ingress(func(i *networkingv1.Ingress) { i.Annotations = map[string]string{AnnotationTags: "k8s"} }),
			reasons: []string{ReasonInvalidAnnotation}, blocking: true},
		"a hostname that is no DNS label": {ing: ingress(func(i *networkingv1.Ingress) { i.Spec.TLS[0].Hosts = []string{"*.example.com"} }),
			reasons: []string{ReasonInvalidHostname}, blocking: true},
	} {
		t.Run(name, func(t *testing.T) {
			d := decideIngress(c.ing, services, c.byo, []string{"tag:k8s"})
			var reasons []string
			for _, f := range d.findings {
				reasons = append(reasons, f.reason)
			}
			if !reflect.DeepEqual(reasons, c.reasons) {
				t.Errorf("findings %v, want %v", reasons, c.reasons)
			}
			if got := hasBlocking(d.findings); got != c.blocking {
				t.Errorf("blocking = %v, want %v", got, c.blocking)
			}
			if !c.blocking && (len(d.ws.Routes) == 0 || len(d.tags) == 0 || d.hostname != "shop") {
				t.Errorf("decision %+v: want routes, tags and hostname shop", d)
			}
		})
	}
}
