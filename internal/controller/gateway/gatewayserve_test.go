package gateway

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

var tailnetNames = []string{"gw", "gw.tailnet.ts.net"}

func listener(name string, proto gatewayv1.ProtocolType, port gatewayv1.PortNumber, mutate ...func(*gatewayv1.Listener)) gatewayv1.Listener {
	l := gatewayv1.Listener{Name: gatewayv1.SectionName(name), Protocol: proto, Port: port}
	for _, m := range mutate {
		m(&l)
	}
	return l
}

func TestDecideListeners(t *testing.T) {
	hostname := func(h string) func(*gatewayv1.Listener) {
		return func(l *gatewayv1.Listener) { l.Hostname = ptr.To(gatewayv1.Hostname(h)) }
	}
	from := func(f gatewayv1.FromNamespaces) func(*gatewayv1.Listener) {
		return func(l *gatewayv1.Listener) {
			l.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: &f}}
		}
	}
	withTLS := func(mode *gatewayv1.TLSModeType, options map[gatewayv1.AnnotationKey]gatewayv1.AnnotationValue) func(*gatewayv1.Listener) {
		return func(l *gatewayv1.Listener) {
			l.TLS = &gatewayv1.ListenerTLSConfig{Mode: mode, Options: options, CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "cert"}}}
		}
	}
	kinds := func(ks ...gatewayv1.Kind) func(*gatewayv1.Listener) {
		return func(l *gatewayv1.Listener) {
			l.AllowedRoutes = &gatewayv1.AllowedRoutes{}
			for _, k := range ks {
				l.AllowedRoutes.Kinds = append(l.AllowedRoutes.Kinds, gatewayv1.RouteGroupKind{Kind: k})
			}
		}
	}
	tests := []struct {
		name      string
		listeners []gatewayv1.Listener
		// want is each listener's NotAccepted reason ("" when served).
		want       []string
		conflicted []bool
	}{
		{"HTTPS and HTTP", []gatewayv1.Listener{listener("https", "HTTPS", 443), listener("http", "HTTP", 80)}, []string{"", ""}, nil},
		{"the tailnet names as hostnames", []gatewayv1.Listener{listener("a", "HTTPS", 443, hostname("gw.tailnet.ts.net")), listener("b", "HTTPS", 443, hostname("GW"))}, []string{"", ""}, nil},
		{"another hostname", []gatewayv1.Listener{listener("a", "HTTPS", 443, hostname("shop.example.com"))}, []string{kit.ReasonUnsupportedValue}, nil},
		{"TLS, TCP and UDP", []gatewayv1.Listener{listener("tls", "TLS", 8443), listener("tcp", "TCP", 5432), listener("udp", "UDP", 53)},
			[]string{kit.ReasonUnsupportedProtocol, kit.ReasonUnsupportedProtocol, kit.ReasonUnsupportedProtocol}, nil},
		{"other ports", []gatewayv1.Listener{listener("https", "HTTPS", 8443), listener("http", "HTTP", 8080)}, []string{"", ""}, nil},
		{"HTTP alone", []gatewayv1.Listener{listener("http", "HTTP", 80)}, []string{""}, nil},
		{"HTTP of any hostname", []gatewayv1.Listener{listener("a", "HTTP", 80, hostname("bar.com")), listener("b", "HTTP", 80, hostname("*.bar.com"))},
			[]string{"", ""}, nil},
		{"certificateRefs, another hostname", []gatewayv1.Listener{listener("https", "HTTPS", 443, hostname("shop.example.com"), withTLS(nil, nil))},
			[]string{""}, nil},
		{"tls passthrough on HTTPS", []gatewayv1.Listener{listener("https", "HTTPS", 443, withTLS(ptr.To(gatewayv1.TLSModePassthrough), nil))},
			[]string{kit.ReasonUnsupportedValue}, nil},
		{"tls options", []gatewayv1.Listener{listener("https", "HTTPS", 443, withTLS(nil, map[gatewayv1.AnnotationKey]gatewayv1.AnnotationValue{"x": "y"}))},
			[]string{kit.ReasonUnsupportedValue}, nil},
		{"tls on HTTP", []gatewayv1.Listener{listener("http", "HTTP", 80, withTLS(nil, nil))}, []string{kit.ReasonUnsupportedValue}, nil},
		{"a namespace selector", []gatewayv1.Listener{listener("https", "HTTPS", 443, func(l *gatewayv1.Listener) {
			l.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr.To(gatewayv1.NamespacesFromSelector),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}}
		})}, []string{""}, nil},
		{"Selector without a selector", []gatewayv1.Listener{listener("https", "HTTPS", 443, from(gatewayv1.NamespacesFromSelector))}, []string{kit.ReasonUnsupportedValue}, nil},
		{"an invalid selector", []gatewayv1.Listener{listener("https", "HTTPS", 443, func(l *gatewayv1.Listener) {
			l.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr.To(gatewayv1.NamespacesFromSelector),
				Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Near"}}}}}
		})}, []string{kit.ReasonUnsupportedValue}, nil},
		{"all namespaces", []gatewayv1.Listener{listener("https", "HTTPS", 443, from(gatewayv1.NamespacesFromAll))}, []string{""}, nil},
		{"a protocol conflict", []gatewayv1.Listener{listener("https", "HTTPS", 443), listener("tls", "TLS", 443)},
			[]string{kit.ReasonPortUnavailable, kit.ReasonPortUnavailable}, []bool{true, true}},
		{"invalid route kinds keep the listener", []gatewayv1.Listener{listener("https", "HTTPS", 443, kinds("TCPRoute"))}, []string{""}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decideListeners(tt.listeners, tailnetNames)
			for i, d := range got {
				if d.NotAccepted != tt.want[i] {
					t.Errorf("listener %s: NotAccepted %q (%s), want %q", d.Name, d.NotAccepted, d.Why, tt.want[i])
				}
				if d.NotAccepted != "" && d.Why == "" {
					t.Errorf("listener %s: not accepted without a message", d.Name)
				}
				if want := tt.conflicted != nil && tt.conflicted[i]; d.Conflicted != want {
					t.Errorf("listener %s: Conflicted %v, want %v", d.Name, d.Conflicted, want)
				}
			}
		})
	}
	got := decideListeners([]gatewayv1.Listener{listener("https", "HTTPS", 443, kinds("TCPRoute", "HTTPRoute"))}, tailnetNames)[0]
	if !reflect.DeepEqual(got.Kinds, []gatewayv1.Kind{kindHTTPRoute}) || !reflect.DeepEqual(got.InvalidKinds, []string{"gateway.networking.k8s.io/TCPRoute"}) {
		t.Errorf("kinds TCPRoute and HTTPRoute: Kinds %v, InvalidKinds %v", got.Kinds, got.InvalidKinds)
	}
	got = decideListeners([]gatewayv1.Listener{listener("https", "HTTPS", 443, kinds("TCPRoute"))}, tailnetNames)[0]
	if len(got.Kinds) > 0 {
		t.Errorf("kinds TCPRoute alone: %v may attach", got.Kinds)
	}
	got = decideListeners([]gatewayv1.Listener{listener("https", "HTTPS", 443)}, tailnetNames)[0]
	if !reflect.DeepEqual(got.Kinds, []gatewayv1.Kind{kindHTTPRoute, kindGRPCRoute}) {
		t.Errorf("no kinds: %v may attach, want HTTPRoute and GRPCRoute", got.Kinds)
	}
}

func TestRouteHosts(t *testing.T) {
	https := listenerDecision{Protocol: gatewayv1.HTTPSProtocolType}
	http := func(hostname string) listenerDecision {
		return listenerDecision{Protocol: gatewayv1.HTTPProtocolType, Hostname: hostname}
	}
	ownTLS := listenerDecision{Protocol: gatewayv1.HTTPSProtocolType, CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "cert"}}}
	tests := []struct {
		name      string
		hostnames []gatewayv1.Hostname
		listener  listenerDecision
		want      []string
	}{
		// HTTPS serves the tailnet names, as "".
		{"https, no hostnames", nil, https, []string{""}},
		{"https, the MagicDNS name", []gatewayv1.Hostname{"gw.tailnet.ts.net"}, https, []string{""}},
		{"https, the short name", []gatewayv1.Hostname{"GW"}, https, []string{""}},
		{"https, a wildcard of several labels", []gatewayv1.Hostname{"*.ts.net"}, https, []string{""}},
		{"https, a wildcard", []gatewayv1.Hostname{"*.tailnet.ts.net"}, https, []string{""}},
		{"https, a wildcard below the name", []gatewayv1.Hostname{"*.gw.tailnet.ts.net"}, https, nil},
		{"https, one of two", []gatewayv1.Hostname{"shop.example.com", "gw"}, https, []string{""}},
		{"https, another name", []gatewayv1.Hostname{"shop.example.com"}, https, nil},
		// HTTP serves any name, intersected as the spec says.
		{"http, neither has hostnames", nil, http(""), []string{""}},
		{"http, the route's", []gatewayv1.Hostname{"Shop.example.com", "*.example.org"}, http(""), []string{"shop.example.com", "*.example.org"}},
		{"http, the listener's", nil, http("bar.com"), []string{"bar.com"}},
		{"http, equal", []gatewayv1.Hostname{"bar.com"}, http("bar.com"), []string{"bar.com"}},
		{"http, disjoint", []gatewayv1.Hostname{"foo.com"}, http("bar.com"), nil},
		{"http, the listener's wildcard covers the route's", []gatewayv1.Hostname{"a.bar.com", "a.b.bar.com", "bar.com"}, http("*.bar.com"),
			[]string{"a.b.bar.com", "a.bar.com"}},
		{"http, the route's wildcard covers the listener's", []gatewayv1.Hostname{"*.bar.com"}, http("foo.bar.com"), []string{"foo.bar.com"}},
		{"http, two wildcards, the narrower", []gatewayv1.Hostname{"*.foo.bar.com"}, http("*.bar.com"), []string{"*.foo.bar.com"}},
		{"http, two wildcards, the listener's narrower", []gatewayv1.Hostname{"*.com"}, http("*.bar.com"), []string{"*.bar.com"}},
		// HTTPS with its own certificates serves any name, as HTTP does.
		{"https with certificateRefs, the route's", []gatewayv1.Hostname{"shop.example.com"}, ownTLS, []string{"shop.example.com"}},
	}
	for _, tt := range tests {
		if got := routeHosts(tt.hostnames, tt.listener, tailnetNames); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: routeHosts(%v) = %q, want %q", tt.name, tt.hostnames, got, tt.want)
		}
	}
}

func service(ns, name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
}

func backendRef(name string, port gatewayv1.PortNumber, mutate ...func(*gatewayv1.HTTPBackendRef)) gatewayv1.HTTPBackendRef {
	b := gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
		Name: gatewayv1.ObjectName(name), Port: ptr.To(port)}}}
	for _, m := range mutate {
		m(&b)
	}
	return b
}

func inNamespace(ns string) func(*gatewayv1.HTTPBackendRef) {
	return func(b *gatewayv1.HTTPBackendRef) { b.Namespace = ptr.To(gatewayv1.Namespace(ns)) }
}

func grant(ns, fromNS string, name *gatewayv1.ObjectName) gatewayv1.ReferenceGrant {
	return gatewayv1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"}, Spec: gatewayv1.ReferenceGrantSpec{
		From: []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: gatewayv1.Namespace(fromNS)}},
		To:   []gatewayv1.ReferenceGrantTo{{Group: "", Kind: "Service", Name: name}},
	}}
}

func TestResolveBackendRef(t *testing.T) {
	in := routeInputs{Services: map[types.NamespacedName]*corev1.Service{
		{Namespace: "app", Name: "web"}: service("app", "web", "10.0.0.1", corev1.ServicePort{Port: 80}, corev1.ServicePort{Port: 81, AppProtocol: ptr.To("kubernetes.io/h2c")},
			corev1.ServicePort{Port: 82, AppProtocol: ptr.To("kubernetes.io/wss")}),
		{Namespace: "app", Name: "headless"}: service("app", "headless", "None", corev1.ServicePort{Port: 80}),
		{Namespace: "other", Name: "api"}:    service("other", "api", "fd00::1", corev1.ServicePort{Port: 8080, AppProtocol: ptr.To("kubernetes.io/ws")}),
		{Namespace: "third", Name: "db"}:     service("third", "db", "10.0.0.3", corev1.ServicePort{Port: 80}),
		{Namespace: "app", Name: "ext"}: {ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "ext"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com", Ports: []corev1.ServicePort{{Port: 5000}}}},
	}, Grants: []gatewayv1.ReferenceGrant{grant("other", "app", nil), grant("third", "app", ptr.To[gatewayv1.ObjectName]("not-db"))}}
	tests := []struct {
		name    string
		ref     gatewayv1.HTTPBackendRef
		wantURL string
		reason  string
		// grpc: of a GRPCRoute, whose backends are reached over h2c.
		grpc bool
	}{
		{"a Service port", backendRef("web", 80), "http://10.0.0.1:80", "", false},
		{"a missing Service", backendRef("gone", 80), "", kit.ReasonBackendNotFound, false},
		{"a missing port", backendRef("web", 8080), "", kit.ReasonBackendNotFound, false},
		{"a headless Service", backendRef("headless", 80), "", kit.ReasonBackendNotFound, false},
		{"h2c", backendRef("web", 81), "http://10.0.0.1:81", "", false},
		{"another appProtocol", backendRef("web", 82), "", kit.ReasonUnsupportedProtocol, false},
		{"an ExternalName Service", backendRef("ext", 5000), "http://db.example.com:5000", "", false},
		{"another kind", backendRef("web", 80, func(b *gatewayv1.HTTPBackendRef) { b.Kind = ptr.To[gatewayv1.Kind]("ConfigMap") }), "", kit.ReasonInvalidKind, false},
		{"another namespace, granted", backendRef("api", 8080, inNamespace("other")), "http://[fd00::1]:8080", "", false},
		{"another namespace, granted for another name", backendRef("db", 80, inNamespace("third")), "", kit.ReasonRefNotPermitted, false},
		{"another namespace, no grant", backendRef("web", 80, inNamespace("app2")), "", kit.ReasonRefNotPermitted, false},
		{"gRPC, no appProtocol", backendRef("web", 80), "http://10.0.0.1:80", "", true},
		{"gRPC, h2c", backendRef("web", 81), "http://10.0.0.1:81", "", true},
		{"gRPC, another appProtocol", backendRef("web", 82), "", kit.ReasonUnsupportedProtocol, true},
		{"gRPC, another namespace granted to HTTPRoutes only", backendRef("api", 8080, inNamespace("other")), "", kit.ReasonRefNotPermitted, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind := kindHTTPRoute
			if tt.grpc {
				kind = kindGRPCRoute
			}
			b, p := resolveBackendRef("app", kind, tt.ref.BackendObjectReference, in)
			if reason := ""; p != nil {
				reason = p.Reason
				if reason != tt.reason {
					t.Errorf("reason %q (%s), want %q", reason, p.Message, tt.reason)
				}
			} else if tt.reason != "" {
				t.Errorf("resolved to %s, want %s", b.URL, tt.reason)
			}
			if b.URL != tt.wantURL {
				t.Errorf("URL %q, want %q", b.URL, tt.wantURL)
			}
			if wantH2C := tt.name == "h2c" || (tt.grpc && tt.reason == ""); (b.Protocol == contract.BackendH2C) != wantH2C {
				t.Errorf("protocol %q", b.Protocol)
			}
		})
	}
	// A grant from another kind or namespace grants nothing.
	other := grant("other", "app", nil)
	other.Spec.From[0].Kind = "GRPCRoute"
	if grantedTo([]gatewayv1.ReferenceGrant{other}, kindHTTPRoute, "app", "Service", types.NamespacedName{Namespace: "other", Name: "api"}) {
		t.Error("a grant to GRPCRoutes lets an HTTPRoute refer")
	}
}

func pathMatch(typ gatewayv1.PathMatchType, v string) gatewayv1.HTTPRouteMatch {
	return gatewayv1.HTTPRouteMatch{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(typ), Value: ptr.To(v)}}
}

func weighted(b gatewayv1.HTTPBackendRef, w int32) gatewayv1.HTTPBackendRef {
	b.Weight = &w
	return b
}

func httpRoute(ns string, rules ...gatewayv1.HTTPRouteRule) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "r", Generation: 3},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "gw"}}},
			Rules:           rules,
		},
	}
}

func TestBuildRules(t *testing.T) {
	in := routeInputs{Services: map[types.NamespacedName]*corev1.Service{
		{Namespace: "app", Name: "web"}: service("app", "web", "10.0.0.1", corev1.ServicePort{Port: 80}, corev1.ServicePort{Port: 8080}),
	}}
	web := contract.Backend{URL: "http://10.0.0.1:80"}
	admin := contract.Backend{URL: "http://10.0.0.1:8080"}
	tests := []struct {
		name        string
		rules       []gatewayv1.HTTPRouteRule
		want        []contract.Route
		unsupported string
		unresolved  string
	}{
		{"no matches: every path", []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}},
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: web}}, "", ""},
		{"PathPrefix and Exact", []gatewayv1.HTTPRouteRule{
			{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchExact, "/metrics")}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 8080)}},
			{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/shop/"), pathMatch(gatewayv1.PathMatchPathPrefix, "/")},
				BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}},
		}, []contract.Route{
			{Path: "/metrics", PathType: contract.PathExact, Backend: admin},
			{Path: "/shop/", PathType: contract.PathPrefix, Backend: web},
			{Path: "/", PathType: contract.PathPrefix, Backend: web},
		}, "", ""},
		{"the first rule of a path wins", []gatewayv1.HTTPRouteRule{
			{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 8080)}},
			{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}},
		}, []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: admin}}, "", ""},
		{"a missing Service fails its rule, not another's", []gatewayv1.HTTPRouteRule{
			{Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/api")}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("gone", 80)}},
			{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}},
		}, []contract.Route{
			{Path: "/api", PathType: contract.PathPrefix, Backend: contract.Backend{Status: 500}},
			{Path: "/", PathType: contract.PathPrefix, Backend: web},
		}, "", "rule 0: Service app/gone does not exist"},
		{"header modifiers", []gatewayv1.HTTPRouteRule{{Filters: []gatewayv1.HTTPRouteFilter{
			{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
				Set: []gatewayv1.HTTPHeader{{Name: "X-Env", Value: "prod"}}, Add: []gatewayv1.HTTPHeader{{Name: "X-Via", Value: "gw"}}, Remove: []string{"X-Debug"}}},
			{Type: gatewayv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{Remove: []string{"Server"}}},
		}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}}, []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: web,
			RequestHeaders: &contract.HeaderEdits{Set: []contract.NameValue{{Name: "X-Env", Value: "prod"}}, Add: []contract.NameValue{{Name: "X-Via", Value: "gw"}},
				Remove: []string{"X-Debug"}},
			ResponseHeaders: &contract.HeaderEdits{Remove: []string{"Server"}}}}, "", ""},
		{"a filter of an identity header", []gatewayv1.HTTPRouteRule{{Filters: []gatewayv1.HTTPRouteFilter{
			{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
				Set: []gatewayv1.HTTPHeader{{Name: "tailscale-user-login", Value: "mallory@example.com"}}}},
		}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}}, nil,
			"rule 0: a RequestHeaderModifier of tailscale-user-login, which the proxy sets from the caller's tailnet identity not served yet", ""},
		{"a redirect: no backend", []gatewayv1.HTTPRouteRule{{
			Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/old")},
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
				Scheme: ptr.To("https"), Hostname: ptr.To[gatewayv1.PreciseHostname]("new.example.com"), Port: ptr.To[gatewayv1.PortNumber](8443),
				Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/new")}}}},
		}, {
			Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchExact, "/moved")},
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
				StatusCode: ptr.To(301), Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.FullPathHTTPPathModifier, ReplaceFullPath: ptr.To("/here")}}}},
		}}, []contract.Route{
			{Path: "/old", PathType: contract.PathPrefix, Redirect: &contract.Redirect{Scheme: "https", Hostname: "new.example.com", Port: 8443,
				Path: &contract.PathChange{Type: contract.PathChangePrefix, Value: "/new"}, StatusCode: 302}},
			{Path: "/moved", PathType: contract.PathExact, Redirect: &contract.Redirect{
				Path: &contract.PathChange{Type: contract.PathChangeFull, Value: "/here"}, StatusCode: 301}},
		}, "", ""},
		{"a rewrite", []gatewayv1.HTTPRouteRule{{
			Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchPathPrefix, "/api")},
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
				Hostname: ptr.To[gatewayv1.PreciseHostname]("internal.example.com"),
				Path:     &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/")}}}},
			BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)},
		}}, []contract.Route{{Path: "/api", PathType: contract.PathPrefix, Backend: web, Rewrite: &contract.Rewrite{Hostname: "internal.example.com",
			Path: &contract.PathChange{Type: contract.PathChangePrefix, Value: "/"}}}}, "", ""},
		{"a prefix rewrite of an Exact match", []gatewayv1.HTTPRouteRule{{
			Matches: []gatewayv1.HTTPRouteMatch{pathMatch(gatewayv1.PathMatchExact, "/api"), pathMatch(gatewayv1.PathMatchPathPrefix, "/v1")},
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{
				Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/")}}}},
			BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)},
		}}, nil, "ReplacePrefixMatch with a match other than PathPrefix", ""},
		{"timeouts: the shorter", []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)},
			Timeouts: &gatewayv1.HTTPRouteTimeouts{Request: ptr.To[gatewayv1.Duration]("10s"), BackendRequest: ptr.To[gatewayv1.Duration]("1500ms")}}},
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: web, TimeoutMillis: 1500}}, "", ""},
		{"timeouts: 0s is none", []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)},
			Timeouts: &gatewayv1.HTTPRouteTimeouts{Request: ptr.To[gatewayv1.Duration]("0s")}}},
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: web}}, "", ""},
		{"timeouts: not a duration", []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)},
			Timeouts: &gatewayv1.HTTPRouteTimeouts{Request: ptr.To[gatewayv1.Duration]("soon")}}}, nil, `timeout "soon" (not a duration)`, ""},
		{"another filter", []gatewayv1.HTTPRouteRule{{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterExtensionRef}},
			BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}}, nil, "rule 0: filters (ExtensionRef) not served yet", ""},
		{"mirrors: by percent, by fraction, all, and one whose Service is missing left out", []gatewayv1.HTTPRouteRule{{Filters: []gatewayv1.HTTPRouteFilter{
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: backendRef("web", 8080).BackendObjectReference, Percent: ptr.To[int32](25)}},
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: backendRef("web", 8080).BackendObjectReference,
				Fraction: &gatewayv1.Fraction{Numerator: 1, Denominator: ptr.To[int32](3)}}},
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: backendRef("web", 80).BackendObjectReference}},
			{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: backendRef("shadow", 80).BackendObjectReference}},
		}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}}, []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: web,
			Mirrors: []contract.Mirror{{Backend: admin, Numerator: 25, Denominator: 100}, {Backend: admin, Numerator: 1, Denominator: 3}, {Backend: web, Numerator: 1, Denominator: 1}}}},
			"", "rule 0: mirror: Service app/shadow does not exist"},
		{"method, header and query matches; the first of a name counts", []gatewayv1.HTTPRouteRule{{Matches: []gatewayv1.HTTPRouteMatch{{
			Path:        &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/api")},
			Headers:     []gatewayv1.HTTPHeaderMatch{{Name: "X-Env", Value: "canary"}, {Name: "x-env", Value: "other"}},
			QueryParams: []gatewayv1.HTTPQueryParamMatch{{Type: ptr.To(gatewayv1.QueryParamMatchExact), Name: "v", Value: "2"}},
			Method:      ptr.To(gatewayv1.HTTPMethodPost),
		}, {Method: ptr.To(gatewayv1.HTTPMethodPost)}}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}}, []contract.Route{
			{Path: "/api", PathType: contract.PathPrefix, Backend: web, Method: "POST",
				Headers: []contract.NameValue{{Name: "X-Env", Value: "canary"}}, Query: []contract.NameValue{{Name: "v", Value: "2"}}},
			{Path: "/", PathType: contract.PathPrefix, Backend: web, Method: "POST"},
		}, "", ""},
		{"weights: a missing Service keeps its share, weight 0 gets none", []gatewayv1.HTTPRouteRule{{Name: ptr.To[gatewayv1.SectionName]("split"),
			BackendRefs: []gatewayv1.HTTPBackendRef{weighted(backendRef("web", 80), 90), backendRef("web", 8080), weighted(backendRef("gone", 80), 9),
				weighted(backendRef("web", 80), 0)}}},
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backends: []contract.WeightedBackend{
				{Backend: web, Weight: 90}, {Backend: admin, Weight: 1}, {Backend: contract.Backend{Status: 500}, Weight: 9}}}},
			"", `rule "split": Service app/gone does not exist`},
		{"weights: one left", []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{weighted(backendRef("web", 80), 0), backendRef("web", 8080)}}},
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: admin}}, "", ""},
		{"weights: all 0", []gatewayv1.HTTPRouteRule{{BackendRefs: []gatewayv1.HTTPBackendRef{weighted(backendRef("web", 80), 0)}}},
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{Status: 500}}}, "", ""},
		{"regular expressions", []gatewayv1.HTTPRouteRule{{Matches: []gatewayv1.HTTPRouteMatch{{
			Path:        &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchRegularExpression), Value: ptr.To("/a.*")},
			Headers:     []gatewayv1.HTTPHeaderMatch{{Type: ptr.To(gatewayv1.HeaderMatchRegularExpression), Name: "x", Value: "y.*"}},
			QueryParams: []gatewayv1.HTTPQueryParamMatch{{Type: ptr.To(gatewayv1.QueryParamMatchRegularExpression), Name: "q", Value: "1+"}},
		}}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}}, []contract.Route{{Path: "/a.*", PathType: contract.PathRegularExpression,
			Headers: []contract.NameValue{{Name: "x", Value: "y.*", Type: contract.MatchRegularExpression}},
			Query:   []contract.NameValue{{Name: "q", Value: "1+", Type: contract.MatchRegularExpression}}, Backend: web}}, "", ""},
		{"a regular expression that is not RE2", []gatewayv1.HTTPRouteRule{{Matches: []gatewayv1.HTTPRouteMatch{{
			Headers: []gatewayv1.HTTPHeaderMatch{{Type: ptr.To(gatewayv1.HeaderMatchRegularExpression), Name: "x", Value: "(?<=a)b"}},
		}}, BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}}, nil,
			`rule 0: regular expression "(?<=a)b" is not RE2 syntax`, ""},
		{"no backendRefs: every request fails", []gatewayv1.HTTPRouteRule{{}},
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{Status: 500}}}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, unsupported, unresolved := buildRules(httpRoute("app", tt.rules...), in)
			if tt.unsupported == "" && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("routes:\n got %+v\nwant %+v", got, tt.want)
			}
			if u := strings.Join(unsupported, "; "); (tt.unsupported == "") != (u == "") || !strings.Contains(u, tt.unsupported) {
				t.Errorf("unsupported %q, want %q", u, tt.unsupported)
			}
			var msgs []string
			for _, u := range unresolved {
				msgs = append(msgs, u.Message)
			}
			if m := strings.Join(msgs, "; "); m != tt.unresolved {
				t.Errorf("unresolved %q, want %q", m, tt.unresolved)
			}
		})
	}
}

func TestDecideRoute(t *testing.T) {
	in := routeInputs{Services: map[types.NamespacedName]*corev1.Service{
		{Namespace: "app", Name: "web"}: service("app", "web", "10.0.0.1", corev1.ServicePort{Port: 80}),
	}}
	rule := gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{backendRef("web", 80)}}
	key := types.NamespacedName{Namespace: "app", Name: "gw"}
	view := func(ls ...gatewayv1.Listener) map[types.NamespacedName]*gatewayView {
		return map[types.NamespacedName]*gatewayView{key: {Key: key, Names: tailnetNames, Listeners: decideListeners(ls, tailnetNames)}}
	}
	https, http := listener("https", "HTTPS", 443), listener("http", "HTTP", 80)
	in.NamespaceLabels = map[string]labels.Set{"app": {}, "backend": {"gateway-access": "yes"}, "other": {"gateway-access": "no"}}
	selecting := listener("https", "HTTPS", 443, func(l *gatewayv1.Listener) {
		l.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr.To(gatewayv1.NamespacesFromSelector),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"gateway-access": "yes"}}}}
	})
	tests := []struct {
		name     string
		mutate   func(*gatewayv1.HTTPRoute)
		gateways map[types.NamespacedName]*gatewayView
		// want is the reason of each parent ("" accepted), and whether routes are served.
		want   []string
		routes bool
	}{
		{"attached to every listener", nil, view(https, http), []string{""}, true},
		{"by sectionName", func(r *gatewayv1.HTTPRoute) {
			r.Spec.ParentRefs[0].SectionName = ptr.To[gatewayv1.SectionName]("https")
		}, view(https), []string{""}, true},
		{"an unknown sectionName", func(r *gatewayv1.HTTPRoute) { r.Spec.ParentRefs[0].SectionName = ptr.To[gatewayv1.SectionName]("nope") },
			view(https), []string{kit.ReasonNoMatchingParent}, false},
		{"a port of no listener", func(r *gatewayv1.HTTPRoute) { r.Spec.ParentRefs[0].Port = ptr.To[gatewayv1.PortNumber](8443) },
			view(https), []string{kit.ReasonNoMatchingParent}, false},
		{"one of HTTPS and HTTP", func(r *gatewayv1.HTTPRoute) {
			r.Spec.ParentRefs[0].SectionName = ptr.To[gatewayv1.SectionName]("https")
		},
			view(https, http), []string{""}, true},
		{"HTTPS and HTTP through two parentRefs", func(r *gatewayv1.HTTPRoute) {
			r.Spec.ParentRefs = []gatewayv1.ParentReference{{Name: "gw", SectionName: ptr.To[gatewayv1.SectionName]("https")}, {Name: "gw", Port: ptr.To[gatewayv1.PortNumber](80)}}
		}, view(https, http), []string{"", ""}, true},
		{"another namespace, listener Same", func(r *gatewayv1.HTTPRoute) {
			r.Namespace = "other"
			r.Spec.ParentRefs[0].Namespace = ptr.To[gatewayv1.Namespace]("app")
		}, view(https), []string{kit.ReasonNotAllowedByListeners}, false},
		{"another namespace, listener All", func(r *gatewayv1.HTTPRoute) {
			r.Namespace = "other"
			r.Spec.ParentRefs[0].Namespace = ptr.To[gatewayv1.Namespace]("app")
		}, view(listener("https", "HTTPS", 443, func(l *gatewayv1.Listener) {
			l.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr.To(gatewayv1.NamespacesFromAll)}}
		})), []string{""}, true},
		{"another namespace, selected by its labels", func(r *gatewayv1.HTTPRoute) {
			r.Namespace = "backend"
			r.Spec.ParentRefs[0].Namespace = ptr.To[gatewayv1.Namespace]("app")
		}, view(selecting), []string{""}, true},
		{"another namespace, not selected", func(r *gatewayv1.HTTPRoute) {
			r.Namespace = "other"
			r.Spec.ParentRefs[0].Namespace = ptr.To[gatewayv1.Namespace]("app")
		}, view(selecting), []string{kit.ReasonNotAllowedByListeners}, false},
		{"the Gateway's namespace, not selected", nil, view(selecting), []string{kit.ReasonNotAllowedByListeners}, false},
		{"another hostname", func(r *gatewayv1.HTTPRoute) { r.Spec.Hostnames = []gatewayv1.Hostname{"shop.example.com"} },
			view(https), []string{kit.ReasonNoMatchingListenerHostname}, false},
		{"a filter", func(r *gatewayv1.HTTPRoute) {
			r.Spec.Rules[0].Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterExtensionRef}}
		}, view(https), []string{kit.ReasonUnsupportedValue}, false},
		{"a Gateway not accepted", nil, map[types.NamespacedName]*gatewayView{key: {Key: key, Rejected: kit.ReasonGatewayInvalid, Why: "HA"}},
			[]string{kit.ReasonNoMatchingParent}, false},
		{"another controller's Gateway", nil, map[types.NamespacedName]*gatewayView{}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httpRoute("app", *rule.DeepCopy())
			if tt.mutate != nil {
				tt.mutate(r)
			}
			d := decideRoute(r, tt.gateways, in)
			var got []string
			for _, p := range d.Parents {
				got = append(got, p.NotAccepted)
				if !p.accepted() && p.Why == "" {
					t.Errorf("parent %v not accepted without a message", p.Ref)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parents %q, want %q", got, tt.want)
			}
			// Routes are served by a Gateway only through an accepted parent; unsupported
			// rules withhold them from every Gateway.
			served := false
			for _, p := range d.Parents {
				served = served || (p.accepted() && len(d.Routes) > 0)
			}
			if served != tt.routes {
				t.Errorf("served %v, want %v", served, tt.routes)
			}
		})
	}
}

func TestDecideGateway(t *testing.T) {
	gw := func(mutate func(*gatewayv1.Gateway)) *gatewayv1.Gateway {
		g := &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "gw"},
			Spec: gatewayv1.GatewaySpec{GatewayClassName: "tailscale", Listeners: []gatewayv1.Listener{listener("https", "HTTPS", 443)}}}
		if mutate != nil {
			mutate(g)
		}
		return g
	}
	annotate := func(k, v string) func(*gatewayv1.Gateway) {
		return func(g *gatewayv1.Gateway) { g.Annotations = map[string]string{k: v} }
	}
	tests := []struct {
		name   string
		gw     *gatewayv1.Gateway
		in     gatewayInputs
		reason string
	}{
		{"served", gw(nil), gatewayInputs{}, ""},
		{"on a ProxyGroup", gw(annotate(kit.AnnotationProxyGroup, "pg")), gatewayInputs{onGroup: true, group: &tsv1alpha1.ProxyGroup{}}, ""},
		{"on a missing ProxyGroup", gw(annotate(kit.AnnotationProxyGroup, "pg")),
			gatewayInputs{onGroup: true, groupFinding: ptr.To(kit.Blockf(kit.ReasonProxyGroupNotFound, "ProxyGroup %q does not exist", "pg"))}, kit.ReasonProxyGroupNotFound},
		{"hostname taken on a ProxyGroup", gw(annotate(kit.AnnotationProxyGroup, "pg")),
			gatewayInputs{onGroup: true, group: &tsv1alpha1.ProxyGroup{}, takenBy: "Ingress app/web"}, kit.ReasonDuplicateHostname},
		{"ProxyClass not ready", gw(nil), gatewayInputs{classNotReady: `ProxyClass "x" does not exist`}, kit.ReasonInvalidParameters},
		{"addresses", gw(func(g *gatewayv1.Gateway) { g.Spec.Addresses = []gatewayv1.GatewaySpecAddress{{Value: "10.0.0.1"}} }), gatewayInputs{}, kit.ReasonUnsupportedAddress},
		{"infrastructure", gw(func(g *gatewayv1.Gateway) { g.Spec.Infrastructure = &gatewayv1.GatewayInfrastructure{} }), gatewayInputs{}, kit.ReasonGatewayInvalid},
		{"bad tags", gw(annotate(kit.AnnotationTags, "k8s")), gatewayInputs{}, kit.ReasonGatewayInvalid},
		{"bad hostname", gw(annotate(kit.AnnotationHostname, "a.b")), gatewayInputs{}, kit.ReasonGatewayInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, _ := decideGateway(tt.gw, tt.in, []string{"tag:k8s"})
			if v.Rejected != tt.reason || (v.Rejected != "" && v.Why == "") {
				t.Errorf("rejected %q (%s), want %q", v.Rejected, v.Why, tt.reason)
			}
		})
	}
	// Its names: the hostname, the MagicDNS name, and the names the proxy reports.
	v, tags := decideGateway(gw(nil), gatewayInputs{domain: "tailnet.ts.net", state: &contract.ProxyState{FQDN: "app-gw-gateway-1.tailnet.ts.net"}}, []string{"tag:k8s"})
	want := []string{"app-gw-gateway", "app-gw-gateway-1", "app-gw-gateway-1.tailnet.ts.net", "app-gw-gateway.tailnet.ts.net"}
	if !reflect.DeepEqual(v.Names, want) || !reflect.DeepEqual(tags, []string{"tag:k8s"}) {
		t.Errorf("names %v, tags %v; want %v, [tag:k8s]", v.Names, tags, want)
	}
}

func condition(t *testing.T, conds []metav1.Condition, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, conds)
	}
	return *c
}

func TestGatewayStatus(t *testing.T) {
	listeners := decideListeners([]gatewayv1.Listener{listener("https", "HTTPS", 443), listener("tls", "TLS", 8443)}, tailnetNames)
	serving := &contract.ProxyState{FQDN: "gw.tailnet.ts.net", TailnetIPs: []string{"100.64.0.1", "fd7a::1", "junk"}, HTTPSEndpoint: "gw.tailnet.ts.net"}
	httpOnly := decideListeners([]gatewayv1.Listener{listener("http", "HTTP", 80)}, tailnetNames)
	listening := &contract.ProxyState{FQDN: "gw.tailnet.ts.net", TailnetIPs: []string{"100.64.0.1", "fd7a::1"}, WebPorts: []int{80}}
	standalone := func(f gatewayFacts, st *contract.ProxyState) gatewayFacts {
		f.standalone(st)
		return f
	}
	now := time.Now()
	vips := []netip.Addr{netip.MustParseAddr("100.100.0.5"), netip.MustParseAddr("fd7a::5")}
	cert := certs.TailnetCert{FQDN: "gw.tailnet.ts.net"}
	advertising := []*contract.ProxyState{nil, {Advertised: []string{"svc:gw"}}}
	onGroup := func(f gatewayFacts, cert certs.TailnetCert, states []*contract.ProxyState) gatewayFacts {
		f.onGroup("pg", "svc:gw", vips, cert, states, now)
		return f
	}
	held := cert
	held.Hold = &contract.IssuanceHold{Reason: kit.ReasonCertificateIssueFailed}
	tests := []struct {
		name  string
		facts gatewayFacts
		// want: Gateway Accepted and Programmed reasons, then each listener's Accepted and
		// Programmed reasons.
		want      []string
		addresses int
		attached  []int32
	}{
		{"served, one listener not", standalone(gatewayFacts{View: gatewayView{Listeners: listeners}, Attached: map[gatewayv1.SectionName]int32{"https": 2}}, serving),
			[]string{kit.ReasonListenersNotValid, kit.ReasonProgrammed, kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed, kit.ReasonUnsupportedProtocol, kit.ReasonGatewayInvalid},
			3, []int32{2, 0}},
		{"waiting for the proxy", gatewayFacts{View: gatewayView{Listeners: listeners[:1]}},
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonPending, kit.ReasonGatewayClassAccepted, kit.ReasonPending}, 0, []int32{0}},
		{"rejected", standalone(gatewayFacts{View: gatewayView{Rejected: kit.ReasonGatewayInvalid, Why: "bad", Listeners: listeners[:1]}}, serving),
			[]string{kit.ReasonGatewayInvalid, kit.ReasonGatewayInvalid, kit.ReasonGatewayClassAccepted, kit.ReasonGatewayInvalid}, 3, []int32{0}},
		{"on a ProxyGroup, advertised", onGroup(gatewayFacts{View: gatewayView{Listeners: listeners[:1]}, Attached: map[gatewayv1.SectionName]int32{"https": 1}}, cert, advertising),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed, kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed}, 3, []int32{1}},
		{"on a ProxyGroup, no replica advertises yet", onGroup(gatewayFacts{View: gatewayView{Listeners: listeners[:1]}}, cert, []*contract.ProxyState{{}, nil}),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonPending, kit.ReasonGatewayClassAccepted, kit.ReasonPending}, 3, []int32{0}},
		{"on a ProxyGroup, certificate held", onGroup(gatewayFacts{View: gatewayView{Listeners: listeners[:1]}}, held, advertising),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonPending, kit.ReasonGatewayClassAccepted, kit.ReasonPending}, 3, []int32{0}},
		{"on a ProxyGroup, tailnet domain unknown", onGroup(gatewayFacts{View: gatewayView{Listeners: listeners[:1]}}, certs.TailnetCert{}, advertising),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonPending, kit.ReasonGatewayClassAccepted, kit.ReasonPending}, 0, []int32{0}},
		// Plain HTTP alone needs no certificate: served once the proxy listens.
		{"HTTP alone, listening", standalone(gatewayFacts{View: gatewayView{Listeners: httpOnly}}, listening),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed, kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed}, 3, []int32{0}},
		{"HTTP alone, not listening yet", standalone(gatewayFacts{View: gatewayView{Listeners: httpOnly}}, &contract.ProxyState{FQDN: "gw.tailnet.ts.net"}),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonPending, kit.ReasonGatewayClassAccepted, kit.ReasonPending}, 1, []int32{0}},
		{"HTTPS, listening but no certificate yet", standalone(gatewayFacts{View: gatewayView{Listeners: listeners[:1]}}, listening),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonPending, kit.ReasonGatewayClassAccepted, kit.ReasonPending}, 3, []int32{0}},
		{"HTTP alone on a ProxyGroup, certificate held", onGroup(gatewayFacts{View: gatewayView{Listeners: httpOnly}}, held, advertising),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed, kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed}, 3, []int32{0}},
		{"a certificateRef that does not resolve", standalone(gatewayFacts{View: withRefProblems(gatewayView{Listeners: listeners[:1]},
			map[gatewayv1.SectionName]refProblem{"https": {kit.ReasonInvalidCertificateRef, "TLS Secret app/cert does not exist"}})}, serving),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed, kit.ReasonGatewayClassAccepted, kit.ReasonGatewayInvalid}, 3, []int32{0}},
		// An HTTPS listener that is not served waits for no certificate.
		{"HTTP, beside an HTTPS listener whose certificateRef does not resolve", standalone(gatewayFacts{View: withRefProblems(
			gatewayView{Listeners: decideListeners([]gatewayv1.Listener{listener("http", "HTTP", 80), listener("https", "HTTPS", 443)}, tailnetNames)},
			map[gatewayv1.SectionName]refProblem{"https": {kit.ReasonInvalidCertificateRef, "missing"}})}, listening),
			[]string{kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed, kit.ReasonGatewayClassAccepted, kit.ReasonProgrammed, kit.ReasonGatewayClassAccepted, kit.ReasonGatewayInvalid}, 3, []int32{0, 0}},
		{"no listener served", gatewayFacts{View: gatewayView{Listeners: listeners[1:]}},
			[]string{kit.ReasonListenersNotValid, kit.ReasonGatewayInvalid, kit.ReasonUnsupportedProtocol, kit.ReasonGatewayInvalid}, 0, []int32{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := gatewayStatus(gatewayv1.GatewayStatus{}, tt.facts, 4)
			got := []string{condition(t, st.Conditions, conditionAccepted).Reason, condition(t, st.Conditions, conditionProgrammed).Reason}
			var attached []int32
			for _, l := range st.Listeners {
				got = append(got, condition(t, l.Conditions, conditionAccepted).Reason, condition(t, l.Conditions, conditionProgrammed).Reason)
				attached = append(attached, l.AttachedRoutes)
				if len(l.Conditions) != 4 {
					t.Errorf("listener %s: %d conditions, want Accepted, Programmed, ResolvedRefs and Conflicted", l.Name, len(l.Conditions))
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("reasons %q, want %q", got, tt.want)
			}
			if !reflect.DeepEqual(attached, tt.attached) {
				t.Errorf("attachedRoutes %v, want %v", attached, tt.attached)
			}
			if len(st.Addresses) != tt.addresses {
				t.Errorf("addresses %+v, want %d", st.Addresses, tt.addresses)
			}
			for _, c := range st.Conditions {
				if c.ObservedGeneration != 4 {
					t.Errorf("%s at generation %d, want 4", c.Type, c.ObservedGeneration)
				}
			}
		})
	}
	st := gatewayStatus(gatewayv1.GatewayStatus{}, standalone(gatewayFacts{View: gatewayView{Listeners: listeners}}, serving), 1)
	if a := st.Addresses[0]; *a.Type != gatewayv1.HostnameAddressType || a.Value != "gw.tailnet.ts.net" {
		t.Errorf("first address %+v, want the MagicDNS name", a)
	}
	grouped := gatewayStatus(gatewayv1.GatewayStatus{}, onGroup(gatewayFacts{View: gatewayView{Listeners: listeners}}, cert, advertising), 1)
	if a := grouped.Addresses; a[0].Value != "gw.tailnet.ts.net" || a[1].Value != "100.100.0.5" || a[2].Value != "fd7a::5" || *a[2].Type != gatewayv1.IPAddressType {
		t.Errorf("addresses on a ProxyGroup %+v, want the MagicDNS name and the VIPs", a)
	}
	if c := condition(t, grouped.Conditions, conditionProgrammed); !strings.Contains(c.Message, "Tailscale Service svc:gw on ProxyGroup pg") {
		t.Errorf("Programmed message %q does not name the Tailscale Service and group", c.Message)
	}
	if k := st.Listeners[0].SupportedKinds; len(k) != 2 || k[0].Kind != kindHTTPRoute || k[1].Kind != kindGRPCRoute {
		t.Errorf("HTTPS supportedKinds %+v", k)
	}
	if k := st.Listeners[1].SupportedKinds; len(k) != 0 {
		t.Errorf("TLS supportedKinds %+v, want none", k)
	}
	// A status written at a newer generation is left alone.
	newer := gatewayv1.GatewayStatus{Conditions: []metav1.Condition{{Type: conditionAccepted, Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 5}}}
	if got := gatewayStatus(newer, gatewayFacts{View: gatewayView{Rejected: kit.ReasonGatewayInvalid}}, 4); !reflect.DeepEqual(got, newer) {
		t.Errorf("a stale read changed the status: %+v", got)
	}
}

func TestRouteStatus(t *testing.T) {
	other := gatewayv1.RouteParentStatus{ParentRef: gatewayv1.ParentReference{Name: "gw"}, ControllerName: "example.com/other",
		Conditions: []metav1.Condition{{Type: conditionAccepted, Status: metav1.ConditionTrue, Reason: "Accepted"}}}
	gone := gatewayv1.RouteParentStatus{ParentRef: gatewayv1.ParentReference{Name: "gone"}, ControllerName: ControllerName,
		Conditions: []metav1.Condition{{Type: conditionAccepted, Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 1}}}
	cur := gatewayv1.RouteStatus{Parents: []gatewayv1.RouteParentStatus{other, gone}}
	d := routeDecision{
		Parents: []parentResult{
			{Ref: gatewayv1.ParentReference{Name: "gw"}, Listeners: []gatewayv1.SectionName{"https"}},
			{Ref: gatewayv1.ParentReference{Name: "gw2"}, NotAccepted: kit.ReasonNoMatchingParent, Why: "no listener"},
		},
		Unresolved: []refProblem{{Reason: kit.ReasonBackendNotFound, Message: "rule 0: Service app/gone does not exist"}},
	}
	st := routeStatus(cur, d, 2)
	if len(st.Parents) != 3 || !reflect.DeepEqual(st.Parents[0], other) {
		t.Fatalf("parents %+v: want the other controller's entry kept as it was, then ours", st.Parents)
	}
	for i, want := range []string{kit.ReasonGatewayClassAccepted, kit.ReasonNoMatchingParent} {
		p := st.Parents[i+1]
		if p.ControllerName != ControllerName || p.ParentRef.Name != d.Parents[i].Ref.Name {
			t.Errorf("entry %d: %+v", i+1, p)
		}
		if c := condition(t, p.Conditions, conditionAccepted); c.Reason != want || c.ObservedGeneration != 2 {
			t.Errorf("entry %d Accepted %+v, want %s at generation 2", i+1, c, want)
		}
		if c := condition(t, p.Conditions, conditionResolvedRefs); c.Reason != kit.ReasonBackendNotFound || !strings.Contains(c.Message, "500") {
			t.Errorf("entry %d ResolvedRefs %+v", i+1, c)
		}
	}
	// No parent of ours left: only the other controller's entry stays.
	if st := routeStatus(cur, routeDecision{}, 2); !reflect.DeepEqual(st.Parents, []gatewayv1.RouteParentStatus{other}) {
		t.Errorf("parents %+v, want the other controller's alone", st.Parents)
	}
	if st := routeStatus(gatewayv1.RouteStatus{Parents: []gatewayv1.RouteParentStatus{gone}}, routeDecision{}, 2); st.Parents == nil || len(st.Parents) != 0 {
		t.Errorf("parents %#v, want an empty list (the API requires one)", st.Parents)
	}
	if st := routeStatus(gatewayv1.RouteStatus{}, routeDecision{}, 2); st.Parents != nil {
		t.Errorf("parents %#v of a route that never had one of ours, want it left alone", st.Parents)
	}
	// A stale read (our entry at a newer generation) changes nothing.
	if st := routeStatus(cur, d, 0); !reflect.DeepEqual(st, cur) {
		t.Errorf("a stale read changed the status: %+v", st)
	}
}

// TestSampleGateway checks that the sample Gateway and HTTPRoute are served as they are.
func TestSampleGateway(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "samples", "gateway-api", "gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("%d documents, want the Gateway and the HTTPRoute", len(docs))
	}
	g, route := &gatewayv1.Gateway{}, &gatewayv1.HTTPRoute{}
	if err := yaml.UnmarshalStrict([]byte(docs[0]), g); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), route); err != nil {
		t.Fatal(err)
	}
	v, _ := decideGateway(g, gatewayInputs{domain: "tailnet.ts.net"}, []string{"tag:k8s"})
	if v.Rejected != "" || slices.ContainsFunc(v.Listeners, func(l listenerDecision) bool { return !l.served() }) {
		t.Fatalf("sample Gateway not served: %+v", v)
	}
	svc := service("default", "hello", "10.0.0.1", corev1.ServicePort{Port: 80})
	d := decideRoute(route, map[types.NamespacedName]*gatewayView{v.Key: &v},
		routeInputs{Services: map[types.NamespacedName]*corev1.Service{{Namespace: "default", Name: "hello"}: svc}})
	if len(d.Parents) != 1 || !d.Parents[0].accepted() || len(d.Routes) != 2 || len(d.Unresolved) > 0 {
		t.Errorf("sample HTTPRoute: %+v", d)
	}
}

func TestGatewayFunnelCondition(t *testing.T) {
	listeners := decideListeners([]gatewayv1.Listener{listener("https", "HTTPS", 443)}, tailnetNames)
	const fqdn = "gw.tailnet.ts.net"
	serving := func(fs *contract.FunnelStatus) *contract.ProxyState {
		st := &contract.ProxyState{FQDN: fqdn, HTTPSEndpoint: fqdn}
		if fs != nil {
			st.Funnel = map[string]contract.FunnelStatus{fqdn: *fs}
		}
		return st
	}
	denied := kit.Warnf(kit.ReasonFunnelNamespaceNotPermitted, "not in --funnel-namespaces")
	tests := []struct {
		name   string
		funnel funnelFacts
		state  *contract.ProxyState
		// want is the condition's status and reason; "" for no condition.
		want, reason string
	}{
		{"not asked", funnelFacts{}, serving(nil), "", ""},
		{"refused by the operator", funnelFacts{Refused: &denied}, serving(nil), "False", kit.ReasonFunnelNamespaceNotPermitted},
		{"the proxy not serving yet", funnelFacts{On: true}, nil, "False", kit.ReasonPending},
		{"the proxy silent about Funnel", funnelFacts{On: true}, serving(nil), "False", kit.ReasonPending},
		{"public", funnelFacts{On: true}, serving(&contract.FunnelStatus{Public: true}), "True", kit.ReasonFunnelEnabled},
		{"the tailnet refuses", funnelFacts{On: true, Tags: []string{"tag:k8s"}},
			serving(&contract.FunnelStatus{Reason: contract.FunnelNotPermitted, Message: "no funnel attribute"}), "False", kit.ReasonFunnelNotPermitted},
		{"the proxy failed", funnelFacts{On: true}, serving(&contract.FunnelStatus{Reason: contract.FunnelFailed, Message: "boom"}), "False", kit.ReasonFunnelFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Each starts from a Gateway that had Funnel on, so "not asked" must remove it.
			before := gatewayv1.GatewayStatus{Conditions: []metav1.Condition{{Type: conditionFunnel, Status: metav1.ConditionTrue, Reason: kit.ReasonFunnelEnabled}}}
			f := gatewayFacts{View: gatewayView{Listeners: listeners}, Funnel: tt.funnel}
			f.standalone(tt.state)
			st := gatewayStatus(before, f, 2)
			c := meta.FindStatusCondition(st.Conditions, conditionFunnel)
			if tt.want == "" {
				if c != nil {
					t.Fatalf("condition %+v on a Gateway that does not ask for Funnel", *c)
				}
				return
			}
			if c == nil || string(c.Status) != tt.want || c.Reason != tt.reason {
				t.Fatalf("condition %+v, want %s %s", c, tt.want, tt.reason)
			}
			if tt.reason == kit.ReasonFunnelNotPermitted && !strings.Contains(c.Message, `"tag:k8s"`) {
				t.Errorf("message %q does not say which tags the policy must grant funnel", c.Message)
			}
		})
	}
}

func TestWebService(t *testing.T) {
	route := func(host, path string) contract.Route {
		return contract.Route{Host: host, Path: path, PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://10.0.0.1:80"}}
	}
	notFound := []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{Status: 404}}}
	a, b := []contract.Route{route("", "/a")}, []contract.Route{route("", "/b")}
	https, http := listener("https", "HTTPS", 443), listener("http", "HTTP", 80)
	tests := []struct {
		name      string
		listeners []gatewayv1.Listener
		byPort    map[gatewayv1.PortNumber][]contract.Route
		want      contract.WebService
	}{
		{"HTTPS alone: routes, as an older proxy reads", []gatewayv1.Listener{https}, map[gatewayv1.PortNumber][]contract.Route{443: a},
			contract.WebService{Routes: a}},
		{"HTTPS and HTTP of the same routes: routes, http serve", []gatewayv1.Listener{https, http}, map[gatewayv1.PortNumber][]contract.Route{443: a, 80: a},
			contract.WebService{Routes: a, HTTP: contract.HTTPServe}},
		{"HTTPS and HTTP of other routes: ports", []gatewayv1.Listener{https, http}, map[gatewayv1.PortNumber][]contract.Route{443: a, 80: b},
			contract.WebService{Ports: []contract.WebPort{{Port: 80, Routes: b}, {Port: 443, TLS: true, Routes: a}}}},
		{"HTTP alone: ports", []gatewayv1.Listener{http}, map[gatewayv1.PortNumber][]contract.Route{80: a},
			contract.WebService{Ports: []contract.WebPort{{Port: 80, Routes: a}}}},
		{"a wildcard host: ports", []gatewayv1.Listener{https}, map[gatewayv1.PortNumber][]contract.Route{443: {route("*.example.com", "/")}},
			contract.WebService{Ports: []contract.WebPort{{Port: 443, TLS: true, Routes: []contract.Route{route("*.example.com", "/")}}}}},
		{"listeners sharing a port, one without routes: 404", []gatewayv1.Listener{listener("x", "HTTP", 8080, func(l *gatewayv1.Listener) {
			l.Hostname = ptr.To[gatewayv1.Hostname]("x.example.com")
		}), listener("y", "HTTP", 8080), https}, map[gatewayv1.PortNumber][]contract.Route{8080: b},
			contract.WebService{Ports: []contract.WebPort{{Port: 443, TLS: true, Routes: notFound}, {Port: 8080, Routes: b}}}},
		{"a listener not served has no port", []gatewayv1.Listener{https, listener("tcp", "TCP", 5432)}, map[gatewayv1.PortNumber][]contract.Route{},
			contract.WebService{Routes: notFound}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := webService(gatewayView{Listeners: decideListeners(tt.listeners, tailnetNames)}, tt.byPort, nil)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("webService =\n%+v\nwant\n%+v", got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("invalid: %v", err)
			}
		})
	}
}
