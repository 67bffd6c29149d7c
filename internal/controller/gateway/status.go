package gateway

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// Condition types the Gateway reconciler owns on a Gateway and its listeners, and the HTTPRoute
// reconciler on its own entries of a route's parents.
const (
	conditionProgrammed   = string(gatewayv1.GatewayConditionProgrammed)
	conditionResolvedRefs = string(gatewayv1.ListenerConditionResolvedRefs)
	conditionConflicted   = string(gatewayv1.ListenerConditionConflicted)
	// conditionFunnel says whether a Gateway that asks for Funnel is served to the internet;
	// the spec leaves domain-prefixed types to implementations.
	conditionFunnel = "tailscale.com/Funnel"
)

// gatewayFacts is what a pass found about a Gateway, which its status is computed from.
type gatewayFacts struct {
	View gatewayView
	// Attached counts, per listener, the routes attached to it.
	Attached map[gatewayv1.SectionName]int32
	// Served is the tailnet name served over HTTPS ("": not yet), and ServedBy says by what
	// when it is not the Gateway's own proxy.
	Served, ServedBy string
	// Addresses are its MagicDNS name and its tailnet IPs: its proxy's, or its Tailscale
	// Service's on a ProxyGroup.
	Addresses []gatewayv1.GatewayStatusAddress
	// States are what the proxies that serve it report.
	States []*contract.ProxyState
	// Funnel is what became of the Gateway's Funnel annotation (zero: none).
	Funnel funnelFacts
}

// funnelFacts is what became of a Gateway's Funnel annotation.
type funnelFacts struct {
	// On: the annotation asks for Funnel and the proxy is told to serve it.
	On bool
	// Refused says why the annotation is not served (nil: it is, or is "false").
	Refused *kit.Finding
	// Tags are the proxy's, which the tailnet policy must grant Funnel.
	Tags []string
}

// serving reports whether the Gateway's tailnet name is served.
func (f gatewayFacts) serving() bool { return f.Served != "" }

// servedURL is what serves the Gateway, for messages: https://<name>, or http://<name> when no
// listener serves HTTPS.
func (f gatewayFacts) servedURL() string {
	if f.View.servesHTTPS() {
		return "https://" + f.Served
	}
	return "http://" + f.Served
}

// servesHTTPS reports whether a listener the Gateway serves is HTTPS: then its proxy needs the
// certificate of its tailnet name.
func (v gatewayView) servesHTTPS() bool {
	return slices.ContainsFunc(v.Listeners, func(l listenerDecision) bool { return l.programmable() && l.Protocol == gatewayv1.HTTPSProtocolType })
}

// standalone records what the Gateway's own proxy reports (st nil: nothing yet): served once it
// serves HTTPS, or, when no listener is HTTPS, once it listens.
func (f *gatewayFacts) standalone(st *contract.ProxyState) {
	if st == nil {
		return
	}
	f.Served, f.Addresses, f.States = st.HTTPSEndpoint, addresses(st.FQDN, st.TailnetIPs), []*contract.ProxyState{st}
	if !f.View.servesHTTPS() && len(st.WebPorts) > 0 {
		f.Served = st.FQDN
	}
}

// onGroup records how ProxyGroup pg serves the Gateway as Tailscale Service svcName with VIPs
// vips: served once a replica advertises it and its certificate is not held or missing.
func (f *gatewayFacts) onGroup(pg, svcName string, vips []netip.Addr, cert certs.TailnetCert, states []*contract.ProxyState, now time.Time) {
	f.States = states
	if cert.FQDN == "" {
		return
	}
	ips := make([]string, len(vips))
	for i, a := range vips {
		ips[i] = a.String()
	}
	f.Addresses = addresses(cert.FQDN, ips)
	if groupstore.FirstAdvertising(states, svcName) != nil && (!f.View.servesHTTPS() || certs.CertPortError(cert.Hold, cert.Cur, now) == "") {
		f.Served, f.ServedBy = cert.FQDN, fmt.Sprintf(" through Tailscale Service %s on ProxyGroup %s", svcName, pg)
	}
}

// gatewayStatus computes a Gateway's status from a pass's facts; conditions of other types
// are kept.
func gatewayStatus(status gatewayv1.GatewayStatus, f gatewayFacts, gen int64) gatewayv1.GatewayStatus {
	status = *status.DeepCopy()
	for _, c := range status.Conditions {
		// Written at a newer generation than the one read: the object read is stale.
		if (c.Type == conditionAccepted || c.Type == conditionProgrammed) && c.ObservedGeneration > gen {
			return status
		}
	}
	v := f.View
	served := slices.ContainsFunc(v.Listeners, listenerDecision.served)
	allServed := !slices.ContainsFunc(v.Listeners, func(l listenerDecision) bool { return !l.served() })
	accepted := v.Rejected == "" && served
	switch {
	case v.Rejected != "":
		kit.SetCondition(&status.Conditions, conditionAccepted, false, v.Rejected, v.Why, gen)
	case !served:
		kit.SetCondition(&status.Conditions, conditionAccepted, false, kit.ReasonListenersNotValid, "no listener can be served", gen)
	case !allServed:
		kit.SetCondition(&status.Conditions, conditionAccepted, true, kit.ReasonListenersNotValid, "some listeners cannot be served; see their conditions", gen)
	default:
		kit.SetCondition(&status.Conditions, conditionAccepted, true, kit.ReasonGatewayClassAccepted, "accepted by "+string(ControllerName), gen)
	}
	switch {
	case !accepted:
		kit.SetCondition(&status.Conditions, conditionProgrammed, false, kit.ReasonGatewayInvalid, "the Gateway is not accepted", gen)
	case f.serving():
		kit.SetCondition(&status.Conditions, conditionProgrammed, true, kit.ReasonProgrammed, "serving "+f.servedURL()+f.ServedBy, gen)
	default:
		kit.SetCondition(&status.Conditions, conditionProgrammed, false, kit.ReasonPending, "waiting for the proxy to join the tailnet and serve its name", gen)
	}
	funnelCondition(&status.Conditions, f, gen)
	status.Addresses = f.Addresses
	listeners := make([]gatewayv1.ListenerStatus, 0, len(v.Listeners))
	for _, l := range v.Listeners {
		ls := gatewayv1.ListenerStatus{Name: l.Name, SupportedKinds: []gatewayv1.RouteGroupKind{}}
		if i := slices.IndexFunc(status.Listeners, func(s gatewayv1.ListenerStatus) bool { return s.Name == l.Name }); i >= 0 {
			ls.Conditions = status.Listeners[i].Conditions
		}
		listenerConditions(&ls.Conditions, l, accepted && f.serving(), accepted, gen)
		if l.Protocol == gatewayv1.HTTPSProtocolType || l.Protocol == gatewayv1.HTTPProtocolType {
			for _, k := range l.Kinds {
				ls.SupportedKinds = append(ls.SupportedKinds, gatewayv1.RouteGroupKind{Group: ptr.To(gatewayv1.Group(gatewayv1.GroupName)), Kind: k})
			}
		}
		if accepted && l.served() {
			ls.AttachedRoutes = f.Attached[l.Name]
		}
		listeners = append(listeners, ls)
	}
	status.Listeners = listeners
	return status
}

// funnelCondition sets, for a Gateway that asks for Funnel, whether its tailnet name is served
// to the internet; it removes the condition from a Gateway that does not ask.
func funnelCondition(conds *[]metav1.Condition, f gatewayFacts, gen int64) {
	switch {
	case f.Funnel.Refused != nil:
		kit.SetCondition(conds, conditionFunnel, false, f.Funnel.Refused.Reason, f.Funnel.Refused.Message, gen)
	case !f.Funnel.On:
		meta.RemoveStatusCondition(conds, conditionFunnel)
	case !f.serving():
		kit.SetCondition(conds, conditionFunnel, false, kit.ReasonPending, "waiting for the proxy to serve the Gateway's tailnet name", gen)
	default:
		fqdn := f.Served
		public, problem := kit.FunnelOutcome(fqdn, f.States)
		reason, msg := kit.FunnelProblem(fqdn, f.Funnel.Tags, problem)
		switch {
		case public:
			kit.SetCondition(conds, conditionFunnel, true, kit.ReasonFunnelEnabled, "serving https://"+fqdn+" to the internet through Funnel", gen)
		case reason != "":
			kit.SetCondition(conds, conditionFunnel, false, reason, msg, gen)
		default:
			kit.SetCondition(conds, conditionFunnel, false, kit.ReasonPending, "waiting for the proxy to set Funnel up", gen)
		}
	}
}

// listenerConditions sets a listener's Accepted, Programmed, ResolvedRefs and Conflicted.
func listenerConditions(conds *[]metav1.Condition, l listenerDecision, serving, gatewayAccepted bool, gen int64) {
	if l.served() {
		kit.SetCondition(conds, conditionAccepted, true, kit.ReasonGatewayClassAccepted, "served", gen)
	} else {
		kit.SetCondition(conds, conditionAccepted, false, l.NotAccepted, l.Why, gen)
	}
	switch {
	case !l.served() || !gatewayAccepted:
		kit.SetCondition(conds, conditionProgrammed, false, kit.ReasonGatewayInvalid, "not served", gen)
	case l.RefProblem != "":
		kit.SetCondition(conds, conditionProgrammed, false, kit.ReasonGatewayInvalid, "not served: "+l.RefWhy, gen)
	case serving:
		kit.SetCondition(conds, conditionProgrammed, true, kit.ReasonProgrammed, "served by the proxy", gen)
	default:
		kit.SetCondition(conds, conditionProgrammed, false, kit.ReasonPending, "waiting for the proxy", gen)
	}
	switch {
	case l.RefProblem != "":
		kit.SetCondition(conds, conditionResolvedRefs, false, l.RefProblem, l.RefWhy, gen)
	case len(l.InvalidKinds) > 0:
		kit.SetCondition(conds, conditionResolvedRefs, false, kit.ReasonInvalidRouteKinds,
			fmt.Sprintf("allowedRoutes.kinds names %v; served: HTTPRoute, GRPCRoute", l.InvalidKinds), gen)
	default:
		kit.SetCondition(conds, conditionResolvedRefs, true, kit.ReasonResolvedRefs, "every reference resolves", gen)
	}
	if l.Conflicted {
		kit.SetCondition(conds, conditionConflicted, true, kit.ReasonProtocolConflict, l.Why, gen)
	} else {
		kit.SetCondition(conds, conditionConflicted, false, kit.ReasonNoConflicts, "no conflict", gen)
	}
}

// addresses are a MagicDNS name and tailnet IPs.
func addresses(fqdn string, ips []string) []gatewayv1.GatewayStatusAddress {
	if fqdn == "" {
		return nil
	}
	out := []gatewayv1.GatewayStatusAddress{{Type: ptr.To(gatewayv1.HostnameAddressType), Value: fqdn}}
	for _, ip := range ips {
		if _, err := netip.ParseAddr(ip); err == nil {
			out = append(out, gatewayv1.GatewayStatusAddress{Type: ptr.To(gatewayv1.IPAddressType), Value: ip})
		}
	}
	return out
}

// routeStatus computes a route's status from its decision: this controller's entry for each
// parentRef to a Gateway of this operator, others' entries kept as they are.
func routeStatus(status gatewayv1.RouteStatus, d routeDecision, gen int64) gatewayv1.RouteStatus {
	status = *status.DeepCopy()
	var parents []gatewayv1.RouteParentStatus
	mine := map[int]bool{}
	for i, p := range status.Parents {
		if p.ControllerName == ControllerName {
			mine[i] = true
			for _, c := range p.Conditions {
				if c.ObservedGeneration > gen {
					return status // stale read
				}
			}
			continue
		}
		parents = append(parents, p)
	}
	for _, p := range d.Parents {
		ps := gatewayv1.RouteParentStatus{ParentRef: p.Ref, ControllerName: ControllerName}
		for i := range mine {
			if reflect.DeepEqual(status.Parents[i].ParentRef, p.Ref) {
				ps.Conditions = status.Parents[i].Conditions
			}
		}
		if p.accepted() {
			kit.SetCondition(&ps.Conditions, conditionAccepted, true, kit.ReasonGatewayClassAccepted, fmt.Sprintf("attached to listeners %v", p.Listeners), gen)
		} else {
			kit.SetCondition(&ps.Conditions, conditionAccepted, false, p.NotAccepted, p.Why, gen)
		}
		if len(d.Unresolved) > 0 {
			kit.SetCondition(&ps.Conditions, conditionResolvedRefs, false, d.Unresolved[0].Reason, unresolvedMessage(d.Unresolved), gen)
		} else {
			kit.SetCondition(&ps.Conditions, conditionResolvedRefs, true, kit.ReasonResolvedRefs, "every backendRef resolves", gen)
		}
		parents = append(parents, ps)
	}
	if parents == nil && len(status.Parents) > 0 {
		parents = []gatewayv1.RouteParentStatus{} // the API requires the list, empty or not
	}
	status.Parents = parents
	return status
}

// unresolvedMessage says which backendRefs do not resolve, and what their requests get.
func unresolvedMessage(ps []refProblem) string {
	msg := ""
	for i, p := range ps {
		if i > 0 {
			msg += "; "
		}
		msg += p.Message
	}
	return msg + " (requests to such a rule fail with 500, or UNAVAILABLE for gRPC)"
}
