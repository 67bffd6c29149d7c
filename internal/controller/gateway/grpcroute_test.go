package gateway

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

func grpcRoute(rules ...gatewayv1.GRPCRouteRule) *gatewayv1.GRPCRoute {
	return &gatewayv1.GRPCRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "g", Generation: 2},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: "gw"}}},
			Rules:           rules,
		},
	}
}

func grpcRule(m *gatewayv1.GRPCMethodMatch, headers ...gatewayv1.GRPCHeaderMatch) gatewayv1.GRPCRouteRule {
	return gatewayv1.GRPCRouteRule{
		Matches: []gatewayv1.GRPCRouteMatch{{Method: m, Headers: headers}},
		BackendRefs: []gatewayv1.GRPCBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
			Name: "grpc", Port: ptr.To[gatewayv1.PortNumber](5000)}}}},
	}
}

func method(t gatewayv1.GRPCMethodMatchType, service, name string) *gatewayv1.GRPCMethodMatch {
	m := &gatewayv1.GRPCMethodMatch{Type: &t}
	if service != "" {
		m.Service = &service
	}
	if name != "" {
		m.Method = &name
	}
	return m
}

func TestGRPCRouteRules(t *testing.T) {
	in := routeInputs{Services: map[types.NamespacedName]*corev1.Service{
		{Namespace: "app", Name: "grpc"}: service("app", "grpc", "10.0.0.5", corev1.ServicePort{Port: 5000}),
	}}
	h2c := contract.Backend{URL: "http://10.0.0.5:5000", Protocol: contract.BackendH2C}
	exact, regex := gatewayv1.GRPCMethodMatchExact, gatewayv1.GRPCMethodMatchRegularExpression
	tests := []struct {
		name string
		rule gatewayv1.GRPCRouteRule
		want []contract.Route
		// unsupported is a part of the refusal's message ("": served).
		unsupported string
	}{
		{"service and method", grpcRule(method(exact, "grpc.health.v1.Health", "Check")),
			[]contract.Route{{Path: "/grpc.health.v1.Health/Check", PathType: contract.PathExact, Backend: h2c}}, ""},
		{"service alone", grpcRule(method(exact, "grpc.health.v1.Health", "")),
			[]contract.Route{{Path: "/grpc.health.v1.Health", PathType: contract.PathPrefix, Backend: h2c}}, ""},
		{"no method match", grpcRule(nil),
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: h2c}}, ""},
		{"with a header", grpcRule(method(exact, "pkg.Svc", "Get"), gatewayv1.GRPCHeaderMatch{Name: "x-tenant", Value: "a"}),
			[]contract.Route{{Path: "/pkg.Svc/Get", PathType: contract.PathExact, Headers: []contract.NameValue{{Name: "x-tenant", Value: "a"}}, Backend: h2c}}, ""},
		{"a method without a service", grpcRule(method(exact, "", "Get")),
			[]contract.Route{{Path: "/[^/]+/Get", PathType: contract.PathRegularExpression, Backend: h2c}}, ""},
		{"a RegularExpression service", grpcRule(method(regex, "pkg\\..*", "")),
			[]contract.Route{{Path: "/pkg\\..*/[^/]+", PathType: contract.PathRegularExpression, Backend: h2c}}, ""},
		{"a RegularExpression header", grpcRule(nil, gatewayv1.GRPCHeaderMatch{Type: ptr.To(gatewayv1.GRPCHeaderMatchRegularExpression), Name: "x", Value: "a.*"}),
			[]contract.Route{{Path: "/", PathType: contract.PathPrefix, Headers: []contract.NameValue{{Name: "x", Value: "a.*", Type: contract.MatchRegularExpression}}, Backend: h2c}}, ""},
		{"a RegularExpression method that is not RE2", grpcRule(method(regex, "", "(?!Get)")), nil, "not RE2 syntax"},
		{"a header modifier", func() gatewayv1.GRPCRouteRule {
			r := grpcRule(method(exact, "pkg.Svc", ""))
			r.Filters = []gatewayv1.GRPCRouteFilter{{Type: gatewayv1.GRPCRouteFilterRequestHeaderModifier,
				RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Set: []gatewayv1.HTTPHeader{{Name: "x-via", Value: "gw"}}}}}
			return r
		}(), []contract.Route{{Path: "/pkg.Svc", PathType: contract.PathPrefix, Backend: h2c,
			RequestHeaders: &contract.HeaderEdits{Set: []contract.NameValue{{Name: "x-via", Value: "gw"}}}}}, ""},
		{"a mirror, over h2c", func() gatewayv1.GRPCRouteRule {
			r := grpcRule(nil)
			r.Filters = []gatewayv1.GRPCRouteFilter{{Type: gatewayv1.GRPCRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{
				BackendRef: r.BackendRefs[0].BackendObjectReference, Percent: ptr.To[int32](10)}}}
			return r
		}(), []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: h2c, Mirrors: []contract.Mirror{{Backend: h2c, Numerator: 10, Denominator: 100}}}}, ""},
		{"another filter", func() gatewayv1.GRPCRouteRule {
			r := grpcRule(nil)
			r.Filters = []gatewayv1.GRPCRouteFilter{{Type: gatewayv1.GRPCRouteFilterExtensionRef}}
			return r
		}(), nil, "ExtensionRef"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := grpcAsHTTP(grpcRoute(tt.rule))
			if routeKind(r) != kindGRPCRoute || r.Namespace != "app" || r.Generation != 2 {
				t.Fatalf("converted route %s %s/%s at %d", routeKind(r), r.Namespace, r.Name, r.Generation)
			}
			routes, unsupported, unresolved := buildRules(r, in)
			if len(unresolved) > 0 {
				t.Fatalf("unresolved %+v", unresolved)
			}
			if tt.unsupported != "" {
				if len(unsupported) != 1 || !strings.Contains(unsupported[0], tt.unsupported) {
					t.Fatalf("unsupported %q, want one naming %q", unsupported, tt.unsupported)
				}
				return
			}
			if len(unsupported) > 0 {
				t.Fatalf("unsupported %q", unsupported)
			}
			if !reflect.DeepEqual(routes, tt.want) {
				t.Errorf("routes %+v, want %+v", routes, tt.want)
			}
		})
	}
}

// TestGRPCAndHTTPRoutesNotMerged checks that a Gateway serves the kind of the oldest route that
// names it, and refuses the other kind.
func TestGRPCAndHTTPRoutesNotMerged(t *testing.T) {
	key := types.NamespacedName{Namespace: "app", Name: "gw"}
	in := routeInputs{Services: map[types.NamespacedName]*corev1.Service{
		{Namespace: "app", Name: "grpc"}: service("app", "grpc", "10.0.0.5", corev1.ServicePort{Port: 5000}),
	}}
	for _, tt := range []struct {
		serves gatewayv1.Kind
		want   string
	}{{kindGRPCRoute, ""}, {kindHTTPRoute, kit.ReasonUnsupportedValue}, {"", ""}} {
		gv := &gatewayView{Key: key, Names: tailnetNames, Listeners: decideListeners([]gatewayv1.Listener{listener("https", "HTTPS", 443)}, tailnetNames),
			RouteKind: tt.serves, RouteKindOf: "app/older"}
		d := decideRoute(grpcAsHTTP(grpcRoute(grpcRule(nil))), map[types.NamespacedName]*gatewayView{key: gv}, in)
		if len(d.Parents) != 1 || d.Parents[0].NotAccepted != tt.want {
			t.Fatalf("Gateway serving %q: parents %+v, want reason %q", tt.serves, d.Parents, tt.want)
		}
		if tt.want != "" && !strings.Contains(d.Parents[0].Why, "app/older") {
			t.Errorf("message %q does not name the route the Gateway serves", d.Parents[0].Why)
		}
	}
	// A listener that allows HTTPRoutes alone does not take a GRPCRoute.
	only := listener("https", "HTTPS", 443, func(l *gatewayv1.Listener) {
		l.AllowedRoutes = &gatewayv1.AllowedRoutes{Kinds: []gatewayv1.RouteGroupKind{{Kind: kindHTTPRoute}}}
	})
	gv := &gatewayView{Key: key, Names: tailnetNames, Listeners: decideListeners([]gatewayv1.Listener{only}, tailnetNames)}
	d := decideRoute(grpcAsHTTP(grpcRoute(grpcRule(nil))), map[types.NamespacedName]*gatewayView{key: gv}, in)
	if d.Parents[0].NotAccepted != kit.ReasonNotAllowedByListeners || !strings.Contains(d.Parents[0].Why, "GRPCRoutes") {
		t.Errorf("on an HTTPRoute-only listener: %+v", d.Parents[0])
	}
}

// TestBackendKeys checks that a route names the Services of its mirrors too: they are read and
// watched as its backends are.
func TestBackendKeys(t *testing.T) {
	r := grpcAsHTTP(grpcRoute(grpcRule(nil)))
	r.Spec.Rules[0].Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{
		BackendRef: gatewayv1.BackendObjectReference{Name: "shadow", Namespace: ptr.To[gatewayv1.Namespace]("other"), Port: ptr.To[gatewayv1.PortNumber](80)}}}}
	want := []types.NamespacedName{{Namespace: "app", Name: "grpc"}, {Namespace: "other", Name: "shadow"}}
	if got := backendKeys(r); !reflect.DeepEqual(got, want) {
		t.Errorf("backendKeys = %v, want %v", got, want)
	}
}
