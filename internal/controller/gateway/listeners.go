package gateway

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

const kindHTTPRoute gatewayv1.Kind = "HTTPRoute"

// routeKinds are the route kinds served, on HTTPS and HTTP listeners alike.
var routeKinds = []gatewayv1.Kind{kindHTTPRoute, kindGRPCRoute}

// listenerDecision is what a Gateway's listener is served as: NotAccepted is "" when it is
// served, else the spec's reason it is not (Why says more).
type listenerDecision struct {
	Name     gatewayv1.SectionName
	Port     gatewayv1.PortNumber
	Protocol gatewayv1.ProtocolType
	// Hostname is the listener's hostname ("" when unset).
	Hostname         string
	NotAccepted, Why string
	// Conflicted: another listener takes the same port with another protocol.
	Conflicted bool
	// InvalidKinds are the route kinds allowedRoutes names that this operator does not serve.
	InvalidKinds []string
	// Kinds are the route kinds that may attach: HTTPRoute and GRPCRoute, or those of them
	// allowedRoutes.kinds names.
	Kinds []gatewayv1.Kind
	// AllNamespaces: routes of every namespace may attach, not only the Gateway's.
	AllNamespaces bool
	// Selector, when set, selects the namespaces whose routes may attach, by their labels.
	Selector labels.Selector
}

func (l listenerDecision) served() bool { return l.NotAccepted == "" }

// admits reports whether routes of namespace ns (labelled nsLabels) may attach to the listener
// of a Gateway of namespace gatewayNS.
func (l listenerDecision) admits(ns, gatewayNS string, nsLabels labels.Set) bool {
	switch {
	case l.Selector != nil:
		return l.Selector.Matches(nsLabels)
	case l.AllNamespaces:
		return true
	}
	return ns == gatewayNS
}

// decideListeners decides which listeners the Gateway's proxy serves. names are the Gateway's
// tailnet names (its hostname, and its MagicDNS name once the tailnet's domain is known): the
// only names a listener may have, since no other certificate is served yet.
func decideListeners(listeners []gatewayv1.Listener, names []string) []listenerDecision {
	out := make([]listenerDecision, 0, len(listeners))
	for _, l := range listeners {
		d := listenerDecision{Name: l.Name, Port: l.Port, Protocol: l.Protocol, Kinds: routeKinds}
		if l.Hostname != nil {
			d.Hostname = string(*l.Hostname)
		}
		d.NotAccepted, d.Why = listenerProblem(l, names)
		for _, o := range listeners {
			if o.Port == l.Port && o.Protocol != l.Protocol {
				d.Conflicted = true
				d.NotAccepted, d.Why = kit.ReasonPortUnavailable, fmt.Sprintf("port %d is also given to listener %q with protocol %s", l.Port, o.Name, o.Protocol)
			}
		}
		if ar := l.AllowedRoutes; ar != nil {
			d.AllNamespaces = ar.Namespaces != nil && ar.Namespaces.From != nil && *ar.Namespaces.From == gatewayv1.NamespacesFromAll
			if ar.Namespaces != nil && ar.Namespaces.From != nil && *ar.Namespaces.From == gatewayv1.NamespacesFromSelector && d.served() {
				d.Selector, d.NotAccepted, d.Why = namespaceSelector(ar.Namespaces.Selector)
			}
			if len(ar.Kinds) > 0 {
				d.Kinds = nil
				for _, k := range ar.Kinds {
					if (k.Group == nil || *k.Group == gatewayv1.GroupName) && slices.Contains(routeKinds, k.Kind) {
						d.Kinds = append(d.Kinds, k.Kind)
					} else {
						d.InvalidKinds = append(d.InvalidKinds, kindString(k))
					}
				}
			}
		}
		out = append(out, d)
	}
	return out
}

// listenerProblem says why a listener, taken alone, cannot be served ("" when it can). HTTP and
// HTTPS are served on any port; an HTTPS listener's hostname must be a tailnet name of the
// Gateway, the only names it has a certificate of.
func listenerProblem(l gatewayv1.Listener, names []string) (reason, why string) {
	switch {
	case l.Protocol != gatewayv1.HTTPSProtocolType && l.Protocol != gatewayv1.HTTPProtocolType:
		return kit.ReasonUnsupportedProtocol, fmt.Sprintf("protocol %s is not served yet: only HTTPS and HTTP", l.Protocol)
	case l.Protocol == gatewayv1.HTTPSProtocolType && l.Hostname != nil && !slices.Contains(names, strings.ToLower(string(*l.Hostname))):
		return kit.ReasonUnsupportedValue, fmt.Sprintf("hostname %q is not served over HTTPS: an HTTPS listener serves the Gateway's tailnet name (%s) only, until certificateRefs are served",
			*l.Hostname, strings.Join(names, ", "))
	case l.TLS != nil:
		return kit.ReasonUnsupportedValue, "tls (certificateRefs, options) is not served yet: leave it unset to serve the tailnet name with its ACME certificate"
	}
	return "", ""
}

// namespaceSelector is the selector of allowedRoutes.namespaces, or why it is not one.
func namespaceSelector(sel *metav1.LabelSelector) (labels.Selector, string, string) {
	if sel == nil {
		return nil, kit.ReasonUnsupportedValue, "allowedRoutes.namespaces.from: Selector needs a selector"
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, kit.ReasonUnsupportedValue, fmt.Sprintf("allowedRoutes.namespaces.selector: %v", err)
	}
	return s, "", ""
}

func kindString(k gatewayv1.RouteGroupKind) string {
	if k.Group == nil {
		return gatewayv1.GroupName + "/" + string(k.Kind)
	}
	return string(*k.Group) + "/" + string(k.Kind)
}
