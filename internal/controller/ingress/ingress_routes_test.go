package ingress

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
)

func TestBuildWebService(t *testing.T) {
	services := map[string]*corev1.Service{
		"web":    kubeobj.Service("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80}, corev1.ServicePort{Name: "admin", Port: 8080}),
		"secure": kubeobj.Service("secure", "10.96.0.11", corev1.ServicePort{Name: "https", Port: 8443}),
		"tls443": kubeobj.Service("tls443", "fd00::11", corev1.ServicePort{Name: "x", Port: 443}),
		"head":   kubeobj.Service("head", "None", corev1.ServicePort{Port: 80}),
		"grpc":   kubeobj.Service("grpc", "10.96.0.12", corev1.ServicePort{Name: "grpc", Port: 9090, AppProtocol: ptr.To("kubernetes.io/h2c")}),
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
			spec: networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", "http"))},
			want: []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
		},
		{
			name: "path types kept, implementation specific is prefix, default backend after rules",
			spec: networkingv1.IngressSpec{
				DefaultBackend: ptr.To(kubeobj.Backend("web", 80)),
				Rules: []networkingv1.IngressRule{kubeobj.Rule("",
					kubeobj.Path("/metrics", networkingv1.PathTypeExact, kubeobj.Backend("web", "admin")),
					kubeobj.Path("/api", networkingv1.PathTypePrefix, kubeobj.Backend("web", 8080)),
					kubeobj.Path("/old", networkingv1.PathTypeImplementationSpecific, kubeobj.Backend("web", 80)),
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
			spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{kubeobj.Rule("",
				kubeobj.Path("/a", networkingv1.PathTypePrefix, kubeobj.Backend("secure", "https")),
				kubeobj.Path("/b", networkingv1.PathTypePrefix, kubeobj.Backend("tls443", 443)),
			)}},
			want: []contract.Route{
				route("/a", contract.PathPrefix, "https://10.96.0.11:8443", true),
				route("/b", contract.PathPrefix, "https://[fd00::11]:443", true),
			},
		},
		{
			name:        "backend protocol annotation",
			annotations: map[string]string{kit.AnnotationBackendProtocol: "https"},
			spec:        networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 8080))},
			want:        []contract.Route{route("/", contract.PathPrefix, "https://10.96.0.10:8080", false)},
		},
		{
			name: "h2c by the port's appProtocol",
			spec: networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("grpc", "grpc"))},
			want: []contract.Route{{Path: "/", PathType: contract.PathPrefix,
				Backend: contract.Backend{URL: "http://10.96.0.12:9090", Protocol: contract.BackendH2C}}},
		},
		{
			name:        "h2c by annotation",
			annotations: map[string]string{kit.AnnotationBackendProtocol: "h2c"},
			spec:        networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 8080))},
			want: []contract.Route{{Path: "/", PathType: contract.PathPrefix,
				Backend: contract.Backend{URL: "http://10.96.0.10:8080", Protocol: contract.BackendH2C}}},
		},
		{
			name:        "the annotation wins over appProtocol",
			annotations: map[string]string{kit.AnnotationBackendProtocol: "http"},
			spec:        networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("grpc", 9090))},
			want:        []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.12:9090", false)},
		},
		{
			name:         "an annotation of the original's not honoured here is named, the rest served",
			annotations:  map[string]string{"tailscale.com/experimental-forward-cluster-traffic-via-ingress": "true"},
			spec:         networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 80))},
			want:         []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantFindings: []string{kit.ReasonUnsupportedAnnotation},
		},
		{
			name:         "bad protocol annotation falls back to detection",
			annotations:  map[string]string{kit.AnnotationBackendProtocol: "grpc"},
			spec:         networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 80))},
			want:         []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantFindings: []string{kit.ReasonInvalidAnnotation},
		},
		{
			name:        "redirect annotation",
			annotations: map[string]string{kit.AnnotationHTTPRedirect: "true"},
			spec:        networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 80))},
			want:        []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantHTTP:    contract.HTTPRedirect,
		},
		{
			name:        "http endpoint annotation serves plain HTTP",
			annotations: map[string]string{kit.AnnotationHTTPEndpoint: "enabled"},
			spec:        networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 80))},
			want:        []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantHTTP:    contract.HTTPServe,
		},
		{
			name:         "http endpoint takes priority over the redirect, with a notice",
			annotations:  map[string]string{kit.AnnotationHTTPEndpoint: "enabled", kit.AnnotationHTTPRedirect: "true"},
			spec:         networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 80))},
			want:         []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantHTTP:     contract.HTTPServe,
			wantFindings: []string{kit.ReasonHTTPRedirectIgnored},
		},
		{
			name:        "http endpoint disabled leaves the redirect",
			annotations: map[string]string{kit.AnnotationHTTPEndpoint: "disabled", kit.AnnotationHTTPRedirect: "true"},
			spec:        networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 80))},
			want:        []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantHTTP:    contract.HTTPRedirect,
		},
		{
			name:         "a bad http endpoint value is reported and serves no plain HTTP",
			annotations:  map[string]string{kit.AnnotationHTTPEndpoint: "true"},
			spec:         networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 80))},
			want:         []contract.Route{route("/", contract.PathPrefix, "http://10.96.0.10:80", false)},
			wantFindings: []string{kit.ReasonInvalidAnnotation},
		},
		{
			name: "external name backend",
			spec: networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("ext", 5000))},
			want: []contract.Route{route("/", contract.PathPrefix, "http://db.example.com:5000", false)},
		},
		{
			name: "every bad backend is reported and skipped, the rest served",
			spec: networkingv1.IngressSpec{
				TLS: []networkingv1.IngressTLS{{Hosts: []string{"web.tailnet.test"}}},
				Rules: []networkingv1.IngressRule{
					kubeobj.Rule("other.example.com", kubeobj.Path("/x", networkingv1.PathTypePrefix, kubeobj.Backend("web", 80))),
					kubeobj.Rule("web.tailnet.test",
						kubeobj.Path("/missing", networkingv1.PathTypePrefix, kubeobj.Backend("nope", 80)),
						kubeobj.Path("/badport", networkingv1.PathTypePrefix, kubeobj.Backend("web", 9999)),
						kubeobj.Path("/badname", networkingv1.PathTypePrefix, kubeobj.Backend("web", "grpc")),
						kubeobj.Path("/headless", networkingv1.PathTypePrefix, kubeobj.Backend("head", 80)),
						kubeobj.Path("", networkingv1.PathTypePrefix, kubeobj.Backend("web", 80)),
						kubeobj.Path("/ok", networkingv1.PathTypeExact, kubeobj.Backend("web", 80)),
						kubeobj.Path("/ok", networkingv1.PathTypeExact, kubeobj.Backend("web", 8080)),
						kubeobj.Path("regex.*", networkingv1.PathTypeImplementationSpecific, kubeobj.Backend("web", 80)),
					),
				},
			},
			want: []contract.Route{
				route("/", contract.PathPrefix, "http://10.96.0.10:80", false),
				route("/ok", contract.PathExact, "http://10.96.0.10:80", false),
			},
			wantFindings: []string{kit.ReasonUnsupportedHost, kit.ReasonInvalidIngressBackend, kit.ReasonInvalidIngressBackend,
				kit.ReasonInvalidIngressBackend, kit.ReasonInvalidIngressBackend, kit.ReasonPathUndefined, kit.ReasonDuplicatePath, kit.ReasonUnsupportedPath},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "default", Annotations: tc.annotations}, Spec: tc.spec}
			ws, findings := BuildWebService(ing, RouteInputs{Services: services})
			if !reflect.DeepEqual(ws.Routes, tc.want) {
				t.Errorf("routes:\n got %+v\nwant %+v", ws.Routes, tc.want)
			}
			if ws.HTTP != tc.wantHTTP {
				t.Errorf("http = %q, want %q", ws.HTTP, tc.wantHTTP)
			}
			if ws.Ingress != "default/i" {
				t.Errorf("ingress = %q, want the Ingress's namespace/name", ws.Ingress)
			}
			var reasons []string
			for _, f := range findings {
				reasons = append(reasons, f.Reason)
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
	if got := kit.IngressHostname(ing); got != "prod-web-v2-ingress" {
		t.Errorf("hostname without TLS = %q", got)
	}
	ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"Shop.tailnet.test"}}}
	if got := kit.IngressHostname(ing); got != "shop" {
		t.Errorf("hostname from TLS = %q", got)
	}
	long := proxies.Parent{Typ: "ingress", Namespace: strings.Repeat("n", 63), Name: strings.Repeat("x", 253)}
	for _, p := range []proxies.Parent{long, {Typ: "ingress", Namespace: "a", Name: "b.c"}} {
		n := p.ProxyName()
		if len(n) > kit.MaxStatefulSetName || strings.ContainsAny(n, ".") || strings.HasSuffix(n, "-") {
			t.Errorf("proxy name %q is not a valid StatefulSet name within %d characters", n, kit.MaxStatefulSetName)
		}
	}
	other := long
	other.Typ = "svc"
	if long.ProxyName() == other.ProxyName() {
		t.Error("an Ingress and a Service of the same name share a proxy name")
	}
}

// What stops an Ingress from being served, and what only leaves a part of it out.
func TestDecideIngressBlocking(t *testing.T) {
	services := map[string]*corev1.Service{"web": kubeobj.Service("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80})}
	ingress := func(mutate func(*networkingv1.Ingress)) *networkingv1.Ingress {
		ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "shop"},
			Spec: networkingv1.IngressSpec{TLS: []networkingv1.IngressTLS{{Hosts: []string{"shop"}}},
				Rules: []networkingv1.IngressRule{kubeobj.Rule("", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", 80)))}}}
		if mutate != nil {
			mutate(ing)
		}
		return ing
	}
	for name, c := range map[string]struct {
		ing      *networkingv1.Ingress
		byo      certs.BYOCertificates
		reasons  []string // of the findings, in order
		blocking bool
	}{
		"served": {ing: ingress(nil)},
		"a path to a missing Service is left out": {ing: ingress(func(i *networkingv1.Ingress) {
			i.Spec.Rules[0].HTTP.Paths = append(i.Spec.Rules[0].HTTP.Paths, kubeobj.Path("/api", networkingv1.PathTypePrefix, kubeobj.Backend("api", 80)))
		}), reasons: []string{kit.ReasonInvalidIngressBackend}},
		"a bad bring-your-own Secret is left out": {ing: ingress(nil),
			byo: certs.BYOCertificates{Findings: []kit.Finding{kit.Warnf(kit.ReasonTLSSecretNotFound, "missing")}}, reasons: []string{kit.ReasonTLSSecretNotFound}},
		"no path left": {ing: ingress(func(i *networkingv1.Ingress) {
			i.Spec.Rules[0] = kubeobj.Rule("", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("api", 80)))
		}),
			reasons: []string{kit.ReasonInvalidIngressBackend, kit.ReasonNoValidBackends}, blocking: true},
		"a malformed tag": {ing: ingress(func(i *networkingv1.Ingress) { i.Annotations = map[string]string{kit.AnnotationTags: "k8s"} }),
			reasons: []string{kit.ReasonInvalidAnnotation}, blocking: true},
		"a hostname that is no DNS label": {ing: ingress(func(i *networkingv1.Ingress) { i.Spec.TLS[0].Hosts = []string{"*.example.com"} }),
			reasons: []string{kit.ReasonInvalidHostname}, blocking: true},
	} {
		t.Run(name, func(t *testing.T) {
			d := DecideIngress(c.ing, RouteInputs{Services: services}, c.byo, []string{"tag:k8s"})
			var reasons []string
			for _, f := range d.Findings {
				reasons = append(reasons, f.Reason)
			}
			if !reflect.DeepEqual(reasons, c.reasons) {
				t.Errorf("findings %v, want %v", reasons, c.reasons)
			}
			if got := kit.HasBlocking(d.Findings); got != c.blocking {
				t.Errorf("blocking = %v, want %v", got, c.blocking)
			}
			if !c.blocking && (len(d.WS.Routes) == 0 || len(d.Tags) == 0 || d.Hostname != "shop") {
				t.Errorf("decision %+v: want routes, tags and hostname shop", d)
			}
		})
	}
}

// Rule hosts users write for the tailnet name are served for every name: the TLS host as
// written, its short form, its full MagicDNS name, or a wildcard covering one of them (the
// original's issues 9548 and 10910). Custom hosts are served for themselves with a
// bring-your-own certificate, an exact one or a wildcard covering them; a wildcard rule needs a
// certificate for that wildcard.
func TestRuleHosts(t *testing.T) {
	services := map[string]*corev1.Service{"web": kubeobj.Service("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80})}
	ok := func(host string) networkingv1.IngressRule {
		return kubeobj.Rule(host, kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", 80)))
	}
	for _, tc := range []struct {
		name      string
		tls       []networkingv1.IngressTLS
		domain    string
		rule      string
		wantHost  string // the route's host
		wantFound string // the finding's reason, "" when served
	}{
		{"TLS host as written", []networkingv1.IngressTLS{{Hosts: []string{"shop"}}}, "", "shop", "", ""},
		{"FQDN rule of a short TLS host", []networkingv1.IngressTLS{{Hosts: []string{"shop"}}}, "tail1234.ts.net", "shop.tail1234.ts.net", "", ""},
		{"FQDN rule before the domain is known", []networkingv1.IngressTLS{{Hosts: []string{"shop"}}}, "", "shop.tail1234.ts.net", "", kit.ReasonUnsupportedHost},
		{"short rule of an FQDN TLS host", []networkingv1.IngressTLS{{Hosts: []string{"shop.tail1234.ts.net"}}}, "", "shop", "", ""},
		{"rule case and trailing dot", []networkingv1.IngressTLS{{Hosts: []string{"shop"}}}, "tail1234.ts.net", "Shop.tail1234.ts.net.", "", ""},
		{"default name without TLS", nil, "tail1234.ts.net", "ns-i-ingress.tail1234.ts.net", "", ""},
		{"another tailnet name", []networkingv1.IngressTLS{{Hosts: []string{"shop"}}}, "tail1234.ts.net", "cart.tail1234.ts.net", "", kit.ReasonUnsupportedHost},
		{"wildcard covering the TLS host", []networkingv1.IngressTLS{{Hosts: []string{"bar.foo.com"}}}, "", "*.foo.com", "", ""},
		{"wildcard covering the MagicDNS name", []networkingv1.IngressTLS{{Hosts: []string{"shop"}}}, "tail1234.ts.net", "*.tail1234.ts.net", "", ""},
		{"bring-your-own host", []networkingv1.IngressTLS{{Hosts: []string{"app.example.com"}, SecretName: "s"}}, "", "App.Example.com", "app.example.com", ""},
		{"host under a bring-your-own wildcard", []networkingv1.IngressTLS{{Hosts: []string{"*.example.com"}, SecretName: "s"}}, "", "app.example.com", "app.example.com", ""},
		{"two labels under a wildcard", []networkingv1.IngressTLS{{Hosts: []string{"*.example.com"}, SecretName: "s"}}, "", "a.b.example.com", "", kit.ReasonUnsupportedHost},
		{"wildcard with its certificate", []networkingv1.IngressTLS{{Hosts: []string{"*.example.com"}, SecretName: "s"}}, "", "*.example.com", "*.example.com", ""},
		{"wildcard without a certificate", []networkingv1.IngressTLS{{Hosts: []string{"app.example.com"}, SecretName: "s"}}, "", "*.example.com", "", kit.ReasonUnsupportedHost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "ns"},
				Spec: networkingv1.IngressSpec{TLS: tc.tls, Rules: []networkingv1.IngressRule{ok(tc.rule)}}}
			ws, findings := BuildWebService(ing, RouteInputs{Services: services, Domain: tc.domain})
			if tc.wantFound != "" {
				if len(ws.Routes) != 0 || len(findings) != 1 || findings[0].Reason != tc.wantFound {
					t.Fatalf("routes %+v findings %+v, want no route and a %s", ws.Routes, findings, tc.wantFound)
				}
				if strings.HasPrefix(tc.rule, "*.") && !strings.Contains(findings[0].Message, "bring-your-own certificate") {
					t.Errorf("the finding does not say how to serve a wildcard: %s", findings[0].Message)
				}
				return
			}
			if len(findings) != 0 || len(ws.Routes) != 1 || ws.Routes[0].Host != tc.wantHost {
				t.Fatalf("routes %+v findings %+v, want one route for host %q", ws.Routes, findings, tc.wantHost)
			}
			if err := ws.Validate(); err != nil {
				t.Errorf("built config does not validate: %v", err)
			}
		})
	}
}

func endpointSlice(service string, family discoveryv1.AddressType, port any, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	p := discoveryv1.EndpointPort{Protocol: ptr.To(corev1.ProtocolTCP)}
	switch v := port.(type) {
	case int:
		p.Port = ptr.To(int32(v))
	case [2]any:
		p.Name, p.Port = ptr.To(v[0].(string)), ptr.To(int32(v[1].(int)))
	}
	return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: service + "-x", Namespace: "default",
		Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: family, Ports: []discoveryv1.EndpointPort{p}, Endpoints: eps}
}

func ep(ip string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// A backend lists the ready endpoints behind its Service port, of the ClusterIP's family, with
// the Pods' port; terminating and unready ones are left out.
func TestBackendEndpoints(t *testing.T) {
	services := map[string]*corev1.Service{
		"web": kubeobj.Service("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80}, corev1.ServicePort{Name: "admin", Port: 9000}),
		"one": kubeobj.Service("one", "10.96.0.11", corev1.ServicePort{Port: 8080}),
		"v6":  kubeobj.Service("v6", "fd00::12", corev1.ServicePort{Name: "http", Port: 80}),
		"ext": {ObjectMeta: metav1.ObjectMeta{Name: "ext"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com", Ports: []corev1.ServicePort{{Port: 5000}}}},
	}
	yes, no := ptr.To(true), ptr.To(false)
	slices := map[string][]discoveryv1.EndpointSlice{
		"web": {
			endpointSlice("web", discoveryv1.AddressTypeIPv4, [2]any{"http", 8080},
				ep("10.1.0.2", yes), ep("10.1.0.1", nil), ep("10.1.0.3", no)),
			endpointSlice("web", discoveryv1.AddressTypeIPv4, [2]any{"admin", 9090}, ep("10.1.0.1", yes)),
			// During a rollout that changes the target port, two slices with their own ports.
			endpointSlice("web", discoveryv1.AddressTypeIPv4, [2]any{"http", 8081}, ep("10.1.0.9", yes)),
			endpointSlice("web", discoveryv1.AddressTypeIPv6, [2]any{"http", 8080}, ep("fd00:1::1", yes)),
			endpointSlice("web", discoveryv1.AddressTypeFQDN, [2]any{"http", 8080}, ep("pod.example.com", yes)),
		},
		"one": {endpointSlice("one", discoveryv1.AddressTypeIPv4, 8443, ep("10.1.1.1", yes))},
		"v6":  {endpointSlice("v6", discoveryv1.AddressTypeIPv6, [2]any{"http", 80}, ep("fd00:1::5", yes)), endpointSlice("v6", discoveryv1.AddressTypeIPv4, [2]any{"http", 80}, ep("10.1.2.1", yes))},
		"ext": {endpointSlice("ext", discoveryv1.AddressTypeIPv4, 5000, ep("10.1.3.1", yes))},
	}
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "default"}, Spec: networkingv1.IngressSpec{
		Rules: []networkingv1.IngressRule{kubeobj.Rule("",
			kubeobj.Path("/web", networkingv1.PathTypePrefix, kubeobj.Backend("web", "http")),
			kubeobj.Path("/admin", networkingv1.PathTypePrefix, kubeobj.Backend("web", 9000)),
			kubeobj.Path("/one", networkingv1.PathTypePrefix, kubeobj.Backend("one", 8080)),
			kubeobj.Path("/v6", networkingv1.PathTypePrefix, kubeobj.Backend("v6", 80)),
			kubeobj.Path("/ext", networkingv1.PathTypePrefix, kubeobj.Backend("ext", 5000)),
		)}}}
	ws, findings := BuildWebService(ing, RouteInputs{Services: services, Slices: slices})
	if len(findings) != 0 {
		t.Fatalf("findings %+v", findings)
	}
	want := map[string][]string{
		"/web":   {"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.9:8081"},
		"/admin": {"10.1.0.1:9090"},
		"/one":   {"10.1.1.1:8443"},
		"/v6":    {"[fd00:1::5]:80"},
		"/ext":   nil,
	}
	for _, r := range ws.Routes {
		if !reflect.DeepEqual(r.Backend.Endpoints, want[r.Path]) {
			t.Errorf("%s: endpoints %v, want %v", r.Path, r.Backend.Endpoints, want[r.Path])
		}
	}
	if err := ws.Validate(); err != nil {
		t.Errorf("built config does not validate: %v", err)
	}

	t.Run("too many", func(t *testing.T) {
		var many []discoveryv1.Endpoint
		for i := range maxEndpoints + 1 {
			many = append(many, ep(fmt.Sprintf("10.2.%d.%d", i/200, i%200+1), yes))
		}
		in := RouteInputs{Services: services, Slices: map[string][]discoveryv1.EndpointSlice{
			"web": {endpointSlice("web", discoveryv1.AddressTypeIPv4, [2]any{"http", 8080}, many...)}}}
		ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "default"},
			Spec: networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", 80))}}
		ws, findings := BuildWebService(ing, in)
		if len(ws.Routes) != 1 || ws.Routes[0].Backend.Endpoints != nil || ws.Routes[0].Backend.URL != "http://10.96.0.10:80" {
			t.Errorf("routes %+v, want the ClusterIP alone", ws.Routes)
		}
		if len(findings) != 1 || findings[0].Warning || findings[0].Reason != kit.ReasonEndpointsNotListed {
			t.Errorf("findings %+v, want one Normal %s", findings, kit.ReasonEndpointsNotListed)
		}
	})
}

// The status lists the custom hosts served with a valid certificate, never a wildcard, which the
// API refuses as a status hostname.
func TestBYOStatusLeavesOutWildcards(t *testing.T) {
	now := time.Now()
	valid := contract.CertificateStatus{Source: contract.CertSourceSecret, Serial: "1", NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)}
	got := byoStatus([]contract.CertificateRef{
		{SecretName: "wild", Hosts: []string{"*.example.com"}},
		{SecretName: "app", Hosts: []string{"app.example.com", "old.example.com"}},
	}, map[string]contract.CertificateStatus{"*.example.com": valid, "app.example.com": valid}, now)
	if len(got) != 1 || got[0].Hostname != "app.example.com" {
		t.Errorf("status %+v, want app.example.com alone", got)
	}
}
