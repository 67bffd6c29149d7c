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
	// CertificateRefs are an HTTPS listener's bring-your-own certificates.
	CertificateRefs []gatewayv1.SecretObjectReference
	// RefProblem is the spec's reason a certificateRef does not resolve ("" when every one
	// does), RefWhy says more: the listener is accepted, and not served.
	RefProblem, RefWhy string
}

// served reports whether the listener is accepted: routes attach to it.
func (l listenerDecision) served() bool { return l.NotAccepted == "" }

// programmable reports whether the proxy serves the listener: accepted, its certificates resolved.
func (l listenerDecision) programmable() bool { return l.served() && l.RefProblem == "" }

// terminatesOwnTLS reports whether the listener serves bring-your-own certificates, which may be
// of any hostname, rather than its tailnet name's.
func (l listenerDecision) terminatesOwnTLS() bool { return len(l.CertificateRefs) > 0 }

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
		if l.TLS != nil && d.served() {
			d.CertificateRefs = l.TLS.CertificateRefs
		}
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
// HTTPS are served on any port. An HTTPS listener terminates TLS with its certificateRefs, for
// any hostname, or without them with the ACME certificate of the Gateway's tailnet name, which
// must then be its hostname if it has one.
func listenerProblem(l gatewayv1.Listener, names []string) (reason, why string) {
	tls := l.TLS
	switch {
	case l.Protocol != gatewayv1.HTTPSProtocolType && l.Protocol != gatewayv1.HTTPProtocolType:
		return kit.ReasonUnsupportedProtocol, fmt.Sprintf("protocol %s is not served yet: only HTTPS and HTTP", l.Protocol)
	case tls != nil && l.Protocol == gatewayv1.HTTPProtocolType:
		return kit.ReasonUnsupportedValue, "an HTTP listener has no tls"
	case tls != nil && tls.Mode != nil && *tls.Mode != gatewayv1.TLSModeTerminate:
		return kit.ReasonUnsupportedValue, fmt.Sprintf("tls.mode %s: an HTTPS listener terminates TLS", *tls.Mode)
	case tls != nil && len(tls.Options) > 0:
		return kit.ReasonUnsupportedValue, "tls.options are not served"
	case l.Protocol == gatewayv1.HTTPSProtocolType && (tls == nil || len(tls.CertificateRefs) == 0) &&
		l.Hostname != nil && !slices.Contains(names, strings.ToLower(string(*l.Hostname))):
		return kit.ReasonUnsupportedValue, fmt.Sprintf("hostname %q has no certificate: without certificateRefs, an HTTPS listener serves the Gateway's tailnet name (%s) only",
			*l.Hostname, strings.Join(names, ", "))
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
