package gateway

import (
	"regexp"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

const kindGRPCRoute gatewayv1.Kind = "GRPCRoute"

// routeKind is the kind of a route as the reconcilers see it: an HTTPRoute, or a GRPCRoute seen
// as one (grpcAsHTTP).
func routeKind(r *gatewayv1.HTTPRoute) gatewayv1.Kind {
	if r.Kind == string(kindGRPCRoute) {
		return kindGRPCRoute
	}
	return kindHTTPRoute
}

// grpcAsHTTP is a GRPCRoute as the HTTPRoute it is served as: a gRPC call is an HTTP/2 POST to
// /<service>/<method>, so a method match is a path match (service and method: Exact
// "/service/method"; service alone: PathPrefix "/service", whole path elements), its header
// matches and filters are HTTPRoute ones, and its backends are reached over h2c (its kind,
// set in TypeMeta, says so to buildRules). A method without a service, and RegularExpression
// method matches, are RegularExpression path matches.
func grpcAsHTTP(g *gatewayv1.GRPCRoute) *gatewayv1.HTTPRoute {
	r := &gatewayv1.HTTPRoute{
		TypeMeta:   metav1.TypeMeta{APIVersion: gatewayv1.GroupVersion.String(), Kind: string(kindGRPCRoute)},
		ObjectMeta: g.ObjectMeta,
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: g.Spec.CommonRouteSpec,
			Hostnames:       g.Spec.Hostnames,
		},
	}
	for _, rule := range g.Spec.Rules {
		hr := gatewayv1.HTTPRouteRule{Name: rule.Name, SessionPersistence: rule.SessionPersistence, Filters: grpcFilters(rule.Filters)}
		for _, m := range rule.Matches {
			hm := gatewayv1.HTTPRouteMatch{Path: grpcPath(m.Method)}
			for _, h := range m.Headers {
				t := gatewayv1.HeaderMatchExact
				if h.Type != nil && *h.Type == gatewayv1.GRPCHeaderMatchRegularExpression {
					t = gatewayv1.HeaderMatchRegularExpression
				}
				hm.Headers = append(hm.Headers, gatewayv1.HTTPHeaderMatch{Type: &t, Name: gatewayv1.HTTPHeaderName(h.Name), Value: h.Value})
			}
			hr.Matches = append(hr.Matches, hm)
		}
		for _, b := range rule.BackendRefs {
			hr.BackendRefs = append(hr.BackendRefs, gatewayv1.HTTPBackendRef{BackendRef: b.BackendRef, Filters: grpcFilters(b.Filters)})
		}
		r.Spec.Rules = append(r.Spec.Rules, hr)
	}
	return r
}

// grpcPath is the path match of a gRPC method match (nil: every call).
func grpcPath(m *gatewayv1.GRPCMethodMatch) *gatewayv1.HTTPPathMatch {
	if m == nil {
		return nil
	}
	service, method := ptr.Deref(m.Service, ""), ptr.Deref(m.Method, "")
	exact := m.Type == nil || *m.Type == gatewayv1.GRPCMethodMatchExact
	switch {
	case exact && service != "" && method != "":
		return &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchExact), Value: ptr.To("/" + service + "/" + method)}
	case exact && service != "":
		return &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/" + service)}
	}
	if exact {
		service, method = "[^/]+", regexp.QuoteMeta(method)
	}
	if service == "" {
		service = "[^/]+"
	}
	if method == "" {
		method = "[^/]+"
	}
	return &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchRegularExpression), Value: ptr.To("/" + service + "/" + method)}
}

// grpcFilters are gRPC filters as HTTPRoute ones: the same types, fields and meaning.
func grpcFilters(fs []gatewayv1.GRPCRouteFilter) []gatewayv1.HTTPRouteFilter {
	var out []gatewayv1.HTTPRouteFilter
	for _, f := range fs {
		out = append(out, gatewayv1.HTTPRouteFilter{
			Type:                   gatewayv1.HTTPRouteFilterType(f.Type),
			RequestHeaderModifier:  f.RequestHeaderModifier,
			ResponseHeaderModifier: f.ResponseHeaderModifier,
			RequestMirror:          f.RequestMirror,
			ExtensionRef:           f.ExtensionRef,
		})
	}
	return out
}
