package kubeobj

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Gateway is a Gateway of class in namespace ns with listeners.
func Gateway(ns, name, class string, listeners ...gatewayv1.Listener) *gatewayv1.Gateway {
	return &gatewayv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: gatewayv1.ObjectName(class), Listeners: listeners}}
}

// Listener is a Gateway listener without hostname.
func Listener(name string, protocol gatewayv1.ProtocolType, port int) gatewayv1.Listener {
	return gatewayv1.Listener{Name: gatewayv1.SectionName(name), Protocol: protocol, Port: gatewayv1.PortNumber(port)}
}

// HTTPRoute is an HTTPRoute in namespace ns attached to Gateway gateway (of its namespace).
func HTTPRoute(ns, name, gateway string, rules ...gatewayv1.HTTPRouteRule) *gatewayv1.HTTPRoute {
	return &gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: gatewayv1.ObjectName(gateway)}}},
			Rules:           rules,
		}}
}

// HTTPRule routes a path (of typ) to port of Service service; namespace "" is the route's.
func HTTPRule(typ gatewayv1.PathMatchType, path, namespace, service string, port int) gatewayv1.HTTPRouteRule {
	ref := gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
		Name: gatewayv1.ObjectName(service), Port: ptr.To(gatewayv1.PortNumber(port))}}}
	if namespace != "" {
		ref.Namespace = ptr.To(gatewayv1.Namespace(namespace))
	}
	return gatewayv1.HTTPRouteRule{
		Matches:     []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(typ), Value: ptr.To(path)}}},
		BackendRefs: []gatewayv1.HTTPBackendRef{ref},
	}
}

// GRPCRoute routes the calls of a gRPC service (and method, unless "") to port of Service
// service, attached to Gateway gateway.
func GRPCRoute(ns, name, gateway, grpcService, method, service string, port int) *gatewayv1.GRPCRoute {
	m := &gatewayv1.GRPCMethodMatch{Service: &grpcService}
	if method != "" {
		m.Method = &method
	}
	return &gatewayv1.GRPCRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gatewayv1.GRPCRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{{Name: gatewayv1.ObjectName(gateway)}}},
			Rules: []gatewayv1.GRPCRouteRule{{
				Matches: []gatewayv1.GRPCRouteMatch{{Method: m}},
				BackendRefs: []gatewayv1.GRPCBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
					Name: gatewayv1.ObjectName(service), Port: ptr.To(gatewayv1.PortNumber(port))}}}},
			}},
		}}
}
