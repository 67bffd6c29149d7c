package gateway

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// failingBackend is the backend of a route of kind's rule whose backendRef does not resolve:
// the spec asks such requests to fail rather than fall through to a shorter route of another
// backend, with 500, and a gRPC call with UNAVAILABLE (503, which gRPC clients read so).
func failingBackend(kind gatewayv1.Kind) contract.Backend {
	if kind == kindGRPCRoute {
		return contract.Backend{Status: http.StatusServiceUnavailable}
	}
	return contract.Backend{Status: http.StatusInternalServerError}
}

// gatewayView is a Gateway of this operator as its routes see it.
type gatewayView struct {
	Key types.NamespacedName
	// Rejected is the spec's reason the Gateway is not accepted ("" when it is), Why says more.
	Rejected, Why string
	Listeners     []listenerDecision
	// Names are the Gateway's tailnet names, lower-case: its hostname and its MagicDNS name.
	Names []string
	// RouteKind is the kind of route it serves, HTTPRoute or GRPCRoute: that of the oldest
	// route naming it (RouteKindOf, "namespace/name"), as the two kinds are not merged on one
	// name. "" while no route names it.
	RouteKind   gatewayv1.Kind
	RouteKindOf string
}

// routeInputs is what routes are decided with besides their Gateways: what backendRefs
// resolve against, and the labels of the routes' namespaces, which listeners select by.
type routeInputs struct {
	// NamespaceLabels are the labels of the routes' namespaces, by name.
	NamespaceLabels map[string]labels.Set
	// Services holds the Services the routes name (one missing does not exist).
	Services map[types.NamespacedName]*corev1.Service
	// Grants are the ReferenceGrants of the namespaces of cross-namespace backendRefs.
	Grants []gatewayv1.ReferenceGrant
}

// refProblem is a backendRef that does not resolve: the spec's ResolvedRefs reason and why.
type refProblem struct{ Reason, Message string }

// parentResult is a route's status at one of its parentRefs to a Gateway of this operator.
type parentResult struct {
	Ref     gatewayv1.ParentReference
	Gateway types.NamespacedName
	// Listeners the route attaches to through this parentRef.
	Listeners []gatewayv1.SectionName
	// NotAccepted is the spec's reason the route is not accepted there ("" when it is).
	NotAccepted, Why string
}

func (p parentResult) accepted() bool { return p.NotAccepted == "" }

// routeDecision is what an HTTPRoute asks of the Gateways of this operator that it names.
type routeDecision struct {
	Parents []parentResult
	// Routes are its rules as contract routes, served by every Gateway that accepts it.
	Routes []contract.Route
	// Unresolved lists the backendRefs that do not resolve (ResolvedRefs=False).
	Unresolved []refProblem
}

// decideRoute decides an HTTPRoute's attachment to the Gateways of gateways (the Gateways of
// this operator it names; parentRefs to others are not this operator's to answer) and its
// contract routes.
func decideRoute(r *gatewayv1.HTTPRoute, gateways map[types.NamespacedName]*gatewayView, in routeInputs) routeDecision {
	routes, unsupported, unresolved := buildRules(r, in)
	d := routeDecision{Unresolved: unresolved}
	for _, ref := range r.Spec.ParentRefs {
		key, ok := gatewayRef(r.Namespace, ref)
		gv := gateways[key]
		if !ok || gv == nil {
			continue
		}
		p := parentResult{Ref: ref, Gateway: key}
		p.Listeners, p.NotAccepted, p.Why = attach(r, ref, gv, in.NamespaceLabels[r.Namespace])
		d.Parents = append(d.Parents, p)
	}
	for i := range d.Parents {
		if p := &d.Parents[i]; p.accepted() && len(unsupported) > 0 {
			p.NotAccepted, p.Why = kit.ReasonUnsupportedValue, strings.Join(unsupported, "; ")
		}
	}
	if len(unsupported) == 0 {
		d.Routes = routes
	}
	return d
}

// gatewayRef is the Gateway a parentRef names; ok is false for another kind of parent.
func gatewayRef(routeNS string, ref gatewayv1.ParentReference) (types.NamespacedName, bool) {
	if (ref.Group != nil && *ref.Group != gatewayv1.GroupName) || (ref.Kind != nil && *ref.Kind != "Gateway") {
		return types.NamespacedName{}, false
	}
	ns := routeNS
	if ref.Namespace != nil {
		ns = string(*ref.Namespace)
	}
	return types.NamespacedName{Namespace: ns, Name: string(ref.Name)}, true
}

// attach finds the listeners of gv that a route (in a namespace of labels nsLabels) attaches to
// through ref, or the spec's reason it attaches to none.
func attach(r *gatewayv1.HTTPRoute, ref gatewayv1.ParentReference, gv *gatewayView, nsLabels labels.Set) ([]gatewayv1.SectionName, string, string) {
	kind := routeKind(r)
	if gv.Rejected != "" {
		return nil, kit.ReasonNoMatchingParent, fmt.Sprintf("Gateway %s is not accepted: %s", gv.Key, gv.Why)
	}
	if gv.RouteKind != "" && gv.RouteKind != kind {
		return nil, kit.ReasonUnsupportedValue, fmt.Sprintf("Gateway %s serves %ss (the oldest route naming it is %s %s): "+
			"HTTPRoutes and GRPCRoutes are not merged on one name, as the spec says", gv.Key, gv.RouteKind, gv.RouteKind, gv.RouteKindOf)
	}
	var named, allowed, attached []gatewayv1.SectionName
	for _, l := range gv.Listeners {
		if (ref.SectionName != nil && *ref.SectionName != l.Name) || (ref.Port != nil && *ref.Port != l.Port) || !l.served() {
			continue
		}
		named = append(named, l.Name)
		if !slices.Contains(l.Kinds, kind) || !l.admits(r.Namespace, gv.Key.Namespace, nsLabels) {
			continue
		}
		allowed = append(allowed, l.Name)
		if len(routeHosts(r.Spec.Hostnames, l, gv.Names)) > 0 {
			attached = append(attached, l.Name)
		}
	}
	switch {
	case len(named) == 0:
		return nil, kit.ReasonNoMatchingParent, fmt.Sprintf("Gateway %s has no accepted listener of that sectionName and port", gv.Key)
	case len(allowed) == 0:
		return nil, kit.ReasonNotAllowedByListeners, fmt.Sprintf("no listener of Gateway %s allows %ss from namespace %s", gv.Key, kind, r.Namespace)
	case len(attached) == 0:
		return nil, kit.ReasonNoMatchingListenerHostname, fmt.Sprintf("no hostname of the route matches a listener of Gateway %s, which serves %s",
			gv.Key, strings.Join(gv.Names, ", "))
	}
	return attached, "", ""
}

// routeHosts are the hosts a route with hostnames serves on listener l of a Gateway whose
// tailnet names are names: the intersection of the route's hostnames and the listener's, as the
// spec defines it, "" standing for every host; none when they do not intersect. An HTTPS
// listener without certificateRefs serves the tailnet names only (it has no other
// certificate), so its routes' hostnames must be among them, and it serves them as "".
func routeHosts(hostnames []gatewayv1.Hostname, l listenerDecision, names []string) []string {
	route := make([]string, len(hostnames))
	for i, h := range hostnames {
		route[i] = strings.ToLower(string(h))
	}
	listener := strings.ToLower(l.Hostname)
	switch {
	case l.Protocol == gatewayv1.HTTPSProtocolType && !l.terminatesOwnTLS():
		// Only tailnet names, which only the proxy's requests carry: "" serves them all.
		if listener != "" {
			names = []string{listener}
		}
		if len(route) == 0 || slices.ContainsFunc(route, func(h string) bool { return slices.ContainsFunc(names, covering(h)) }) {
			return []string{""}
		}
		return nil
	case listener == "" && len(route) == 0:
		return []string{""}
	case listener == "":
		return route
	case len(route) == 0:
		return []string{listener}
	}
	var out []string
	for _, h := range route {
		switch {
		case covering(listener)(h): // the route's is the narrower
			out = append(out, h)
		case covering(h)(listener):
			out = append(out, listener)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// covering returns whether a hostname is host itself or, when host is a wildcard, one it
// covers: one label or more in place of the "*", or a narrower wildcard.
func covering(host string) func(string) bool {
	return func(h string) bool {
		return h == host || (contract.IsWildcard(host) && strings.HasSuffix(h, host[1:]) && len(h) > len(host)-1)
	}
}

// buildRules turns a route's rules into contract routes. A rule using what the proxy cannot
// serve is listed in unsupported (the route is then not served at all rather than served
// differently); a rule whose backendRef does not resolve is served by failingBackend.
func buildRules(r *gatewayv1.HTTPRoute, in routeInputs) (routes []contract.Route, unsupported []string, unresolved []refProblem) {
	seen := map[string]bool{}
	for i, rule := range r.Spec.Rules {
		where := fmt.Sprintf("rule %d", i)
		if rule.Name != nil {
			where = fmt.Sprintf("rule %q", *rule.Name)
		}
		if why := ruleUnsupported(rule); len(why) > 0 {
			unsupported = append(unsupported, where+": "+strings.Join(why, ", ")+" not served yet")
			continue
		}
		if bad := badExpressions(rule); len(bad) > 0 {
			unsupported = append(unsupported, where+": "+strings.Join(bad, ", "))
			continue
		}
		f := ruleFilters(rule.Filters)
		var backend contract.Backend
		var split []contract.WeightedBackend
		if f.redirect == nil { // a redirecting rule has no backendRefs
			var problems []refProblem
			backend, split, problems = ruleBackends(r.Namespace, routeKind(r), rule.BackendRefs, in)
			for _, p := range problems {
				p.Message = where + ": " + p.Message
				unresolved = append(unresolved, p)
			}
		}
		matches := rule.Matches
		if len(matches) == 0 {
			matches = []gatewayv1.HTTPRouteMatch{{}}
		}
		mirrors, problems := ruleMirrors(r.Namespace, routeKind(r), rule.Filters, in)
		for _, p := range problems {
			p.Message = where + ": mirror: " + p.Message
			unresolved = append(unresolved, p)
		}
		for _, m := range matches {
			rt := matchRoute(m)
			rt.Backend, rt.Backends, rt.Mirrors = backend, split, mirrors
			rt.TimeoutMillis, _ = ruleTimeout(rule.Timeouts) // checked by ruleUnsupported
			rt.RequestHeaders, rt.ResponseHeaders, rt.Redirect, rt.Rewrite = f.request, f.response, f.redirect, f.rewrite
			// The first rule of a match wins, as the spec's precedence orders rules of one route.
			if key := rt.MatchKey(); !seen[key] {
				seen[key] = true
				routes = append(routes, rt)
			}
		}
	}
	return routes, unsupported, unresolved
}

// ruleTimeout is a rule's timeout in milliseconds: the shorter of its request and backend
// request timeouts (the proxy does not retry, so one backend request is the whole request);
// 0 is none, as is a timeout of 0s.
func ruleTimeout(t *gatewayv1.HTTPRouteTimeouts) (int64, error) {
	if t == nil {
		return 0, nil
	}
	var shortest time.Duration
	for _, d := range []*gatewayv1.Duration{t.Request, t.BackendRequest} {
		if d == nil {
			continue
		}
		v, err := time.ParseDuration(string(*d))
		if err != nil || v < 0 {
			return 0, fmt.Errorf("timeout %q (not a duration)", *d)
		}
		if v > 0 && (shortest == 0 || v < shortest) {
			shortest = v
		}
	}
	return shortest.Milliseconds(), nil
}

// ruleBackends resolves a rule's backendRefs into its one backend, or the split of its
// requests across several by weight. A backendRef that does not resolve keeps its share, sent
// to failingBackend, as the spec asks; one of weight 0 gets none, and a rule without
// backendRefs, or whose weights are all 0, answers every request as one that does not resolve.
func ruleBackends(routeNS string, kind gatewayv1.Kind, refs []gatewayv1.HTTPBackendRef, in routeInputs) (contract.Backend, []contract.WeightedBackend, []refProblem) {
	var split []contract.WeightedBackend
	var problems []refProblem
	for _, ref := range refs {
		b, problem := resolveBackendRef(routeNS, kind, ref.BackendObjectReference, in)
		if problem != nil {
			problems = append(problems, *problem)
			b = failingBackend(kind)
		}
		if w := int(ptr.Deref(ref.Weight, 1)); w > 0 {
			split = append(split, contract.WeightedBackend{Backend: b, Weight: w})
		}
	}
	switch len(split) {
	case 0:
		return failingBackend(kind), nil, problems
	case 1:
		return split[0].Backend, nil, problems
	}
	return contract.Backend{}, split, problems
}

// matchRoute is a contract route of one HTTPRoute match, without its backend. Of a header or
// query parameter named twice only the first counts, as the spec says.
func matchRoute(m gatewayv1.HTTPRouteMatch) contract.Route {
	rt := contract.Route{Path: "/", PathType: contract.PathPrefix}
	if m.Path != nil {
		if m.Path.Value != nil {
			rt.Path = *m.Path.Value
		}
		switch ptr.Deref(m.Path.Type, gatewayv1.PathMatchPathPrefix) {
		case gatewayv1.PathMatchExact:
			rt.PathType = contract.PathExact
		case gatewayv1.PathMatchRegularExpression:
			rt.PathType = contract.PathRegularExpression
		}
	}
	if m.Method != nil {
		rt.Method = string(*m.Method)
	}
	for _, h := range m.Headers {
		if !slices.ContainsFunc(rt.Headers, func(nv contract.NameValue) bool { return strings.EqualFold(nv.Name, string(h.Name)) }) {
			rt.Headers = append(rt.Headers, contract.NameValue{Name: string(h.Name), Value: h.Value,
				Type: matchType(ptr.Deref(h.Type, gatewayv1.HeaderMatchExact) == gatewayv1.HeaderMatchRegularExpression)})
		}
	}
	for _, q := range m.QueryParams {
		if !slices.ContainsFunc(rt.Query, func(nv contract.NameValue) bool { return nv.Name == string(q.Name) }) {
			rt.Query = append(rt.Query, contract.NameValue{Name: string(q.Name), Value: q.Value,
				Type: matchType(ptr.Deref(q.Type, gatewayv1.QueryParamMatchExact) == gatewayv1.QueryParamMatchRegularExpression)})
		}
	}
	return rt
}

// ruleMirrors resolves a rule's RequestMirror filters: each mirror's backendRef, and its share
// of the requests (percent, or fraction, else all). A mirror whose backendRef does not resolve
// is left out, and the rule served without it.
func ruleMirrors(routeNS string, kind gatewayv1.Kind, fs []gatewayv1.HTTPRouteFilter, in routeInputs) ([]contract.Mirror, []refProblem) {
	var mirrors []contract.Mirror
	var problems []refProblem
	for _, f := range fs {
		m := f.RequestMirror
		if f.Type != gatewayv1.HTTPRouteFilterRequestMirror || m == nil {
			continue
		}
		b, problem := resolveBackendRef(routeNS, kind, m.BackendRef, in)
		if problem != nil {
			problems = append(problems, *problem)
			continue
		}
		mirror := contract.Mirror{Backend: b, Numerator: 1, Denominator: 1}
		switch {
		case m.Percent != nil:
			mirror.Numerator, mirror.Denominator = int(*m.Percent), 100
		case m.Fraction != nil:
			mirror.Numerator, mirror.Denominator = int(m.Fraction.Numerator), int(ptr.Deref(m.Fraction.Denominator, 100))
		}
		mirrors = append(mirrors, mirror)
	}
	return mirrors, problems
}

// matchType is a header or query match's contract type.
func matchType(regex bool) contract.MatchType {
	if regex {
		return contract.MatchRegularExpression
	}
	return ""
}

// filters are a rule's filters as the contract says them.
type filters struct {
	request, response *contract.HeaderEdits
	redirect          *contract.Redirect
	rewrite           *contract.Rewrite
}

func ruleFilters(fs []gatewayv1.HTTPRouteFilter) filters {
	var out filters
	for _, f := range fs {
		switch {
		case f.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil:
			out.request = toEdits(f.RequestHeaderModifier)
		case f.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && f.ResponseHeaderModifier != nil:
			out.response = toEdits(f.ResponseHeaderModifier)
		case f.Type == gatewayv1.HTTPRouteFilterRequestRedirect && f.RequestRedirect != nil:
			rd := f.RequestRedirect
			out.redirect = &contract.Redirect{Scheme: ptr.Deref(rd.Scheme, ""), Hostname: string(ptr.Deref(rd.Hostname, "")),
				Port: int(ptr.Deref(rd.Port, 0)), Path: pathChange(rd.Path), StatusCode: ptr.Deref(rd.StatusCode, http.StatusFound)}
		case f.Type == gatewayv1.HTTPRouteFilterURLRewrite && f.URLRewrite != nil:
			out.rewrite = &contract.Rewrite{Hostname: string(ptr.Deref(f.URLRewrite.Hostname, "")), Path: pathChange(f.URLRewrite.Path)}
		}
	}
	return out
}

func pathChange(m *gatewayv1.HTTPPathModifier) *contract.PathChange {
	switch {
	case m == nil:
		return nil
	case m.Type == gatewayv1.FullPathHTTPPathModifier:
		return &contract.PathChange{Type: contract.PathChangeFull, Value: ptr.Deref(m.ReplaceFullPath, "/")}
	default:
		return &contract.PathChange{Type: contract.PathChangePrefix, Value: ptr.Deref(m.ReplacePrefixMatch, "/")}
	}
}

// replacesPrefix reports whether a filter replaces the prefix a match matched.
func replacesPrefix(f gatewayv1.HTTPRouteFilter) bool {
	isPrefix := func(m *gatewayv1.HTTPPathModifier) bool {
		return m != nil && m.Type == gatewayv1.PrefixMatchHTTPPathModifier
	}
	return (f.RequestRedirect != nil && isPrefix(f.RequestRedirect.Path)) || (f.URLRewrite != nil && isPrefix(f.URLRewrite.Path))
}

func toEdits(f *gatewayv1.HTTPHeaderFilter) *contract.HeaderEdits {
	e := &contract.HeaderEdits{Remove: f.Remove}
	for _, h := range f.Set {
		e.Set = append(e.Set, contract.NameValue{Name: string(h.Name), Value: h.Value})
	}
	for _, h := range f.Add {
		e.Add = append(e.Add, contract.NameValue{Name: string(h.Name), Value: h.Value})
	}
	return e
}

// servedFilters are the filter types the proxy serves.
var servedFilters = []gatewayv1.HTTPRouteFilterType{gatewayv1.HTTPRouteFilterRequestHeaderModifier, gatewayv1.HTTPRouteFilterResponseHeaderModifier,
	gatewayv1.HTTPRouteFilterRequestRedirect, gatewayv1.HTTPRouteFilterURLRewrite, gatewayv1.HTTPRouteFilterRequestMirror}

// filterUnsupported lists what a rule's filters ask that the proxy does not serve.
func filterUnsupported(filters []gatewayv1.HTTPRouteFilter) []string {
	var why, other []string
	for _, f := range filters {
		if !slices.Contains(servedFilters, f.Type) {
			other = append(other, string(f.Type))
			continue
		}
		if m := f.RequestHeaderModifier; m != nil {
			names := slices.Concat(m.Remove, headerNames(m.Set), headerNames(m.Add))
			if i := slices.IndexFunc(names, contract.IsIdentityHeader); i >= 0 {
				why = append(why, fmt.Sprintf("a RequestHeaderModifier of %s, which the proxy sets from the caller's tailnet identity", names[i]))
			}
		}
	}
	if len(other) > 0 {
		why = append(why, "filters ("+strings.Join(other, ", ")+")")
	}
	return why
}

func headerNames(hs []gatewayv1.HTTPHeader) []string {
	var out []string
	for _, h := range hs {
		out = append(out, string(h.Name))
	}
	return out
}

// ruleUnsupported lists what a rule asks that the proxy cannot serve yet.
func ruleUnsupported(rule gatewayv1.HTTPRouteRule) []string {
	why := filterUnsupported(rule.Filters)
	if slices.ContainsFunc(rule.Filters, replacesPrefix) && slices.ContainsFunc(rule.Matches, func(m gatewayv1.HTTPRouteMatch) bool {
		return m.Path != nil && m.Path.Type != nil && *m.Path.Type != gatewayv1.PathMatchPathPrefix
	}) {
		why = append(why, "ReplacePrefixMatch with a match other than PathPrefix")
	}
	if _, err := ruleTimeout(rule.Timeouts); err != nil {
		why = append(why, err.Error())
	}
	if rule.Retry != nil {
		why = append(why, "retry")
	}
	if rule.SessionPersistence != nil {
		why = append(why, "sessionPersistence")
	}
	if slices.ContainsFunc(rule.BackendRefs, func(b gatewayv1.HTTPBackendRef) bool { return len(b.Filters) > 0 }) {
		why = append(why, "backendRef filters")
	}
	return slices.Compact(why)
}

// badExpressions lists the regular expressions of a rule's matches that do not compile (RE2
// syntax, as the proxy matches them).
func badExpressions(rule gatewayv1.HTTPRouteRule) []string {
	var bad []string
	for _, m := range rule.Matches {
		rt := matchRoute(m)
		for _, nv := range slices.Concat([]contract.NameValue{{Value: rt.Path, Type: matchType(rt.PathType == contract.PathRegularExpression)}}, rt.Headers, rt.Query) {
			if _, err := contract.CompileMatch(nv.Value); nv.Type != "" && err != nil {
				bad = append(bad, fmt.Sprintf("regular expression %q is not RE2 syntax: %v", nv.Value, err))
			}
		}
	}
	return bad
}

// appProtocols are the backend Service port appProtocols the proxy serves to each route kind,
// and how it speaks to them: plain HTTP/1.1, WebSockets (passed through as HTTP/1.1 Upgrades),
// and HTTP/2 without TLS, which a GRPCRoute's backends are reached over unless their port says
// otherwise.
var appProtocols = map[gatewayv1.Kind]map[string]string{
	kindHTTPRoute: {"": "", "http": "", "kubernetes.io/ws": "", "kubernetes.io/h2c": contract.BackendH2C},
	kindGRPCRoute: {"": contract.BackendH2C, "kubernetes.io/h2c": contract.BackendH2C},
}

// resolveBackendRef finds the backend a route of kind's backendRef names: a Service port,
// reached through the Service's ClusterIP (its ready endpoints are not listed yet: kube-proxy
// balances).
func resolveBackendRef(routeNS string, kind gatewayv1.Kind, b gatewayv1.BackendObjectReference, in routeInputs) (contract.Backend, *refProblem) {
	fail := func(reason, format string, a ...any) (contract.Backend, *refProblem) {
		return contract.Backend{}, &refProblem{Reason: reason, Message: fmt.Sprintf(format, a...)}
	}
	if (b.Group != nil && *b.Group != "") || (b.Kind != nil && *b.Kind != "Service") {
		return fail(kit.ReasonInvalidKind, "backendRef to a %s: only Services are served", kindOf(b))
	}
	key := types.NamespacedName{Namespace: routeNS, Name: string(b.Name)}
	if b.Namespace != nil && string(*b.Namespace) != routeNS {
		key.Namespace = string(*b.Namespace)
		if !grantedTo(in.Grants, kind, routeNS, "Service", key) {
			return fail(kit.ReasonRefNotPermitted, "backendRef to Service %s: no ReferenceGrant in namespace %s lets %ss of namespace %s refer to it",
				key, key.Namespace, kind, routeNS)
		}
	}
	svc := in.Services[key]
	if svc == nil {
		return fail(kit.ReasonBackendNotFound, "Service %s does not exist", key)
	}
	// An ExternalName Service is reached by its name, as for Ingress backends (the spec leaves
	// them to the implementation).
	host := svc.Spec.ExternalName
	if svc.Spec.Type != corev1.ServiceTypeExternalName {
		if host = svc.Spec.ClusterIP; host == "" || host == corev1.ClusterIPNone {
			return fail(kit.ReasonBackendNotFound, "Service %s has no ClusterIP (headless Services are not served)", key)
		}
	}
	if b.Port == nil {
		return fail(kit.ReasonBackendNotFound, "backendRef to Service %s has no port", key)
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == *b.Port })
	if i < 0 {
		return fail(kit.ReasonBackendNotFound, "Service %s has no port %d", key, *b.Port)
	}
	protocol, ok := appProtocols[kind][ptr.Deref(svc.Spec.Ports[i].AppProtocol, "")]
	if !ok {
		served := "http, kubernetes.io/ws, kubernetes.io/h2c"
		if kind == kindGRPCRoute {
			served = "none (h2c) or kubernetes.io/h2c"
		}
		return fail(kit.ReasonUnsupportedProtocol, "Service %s port %d has appProtocol %s; served to %ss: %s",
			key, *b.Port, *svc.Spec.Ports[i].AppProtocol, kind, served)
	}
	return contract.Backend{URL: "http://" + net.JoinHostPort(host, strconv.Itoa(int(*b.Port))), Protocol: protocol}, nil
}

func kindOf(b gatewayv1.BackendObjectReference) string {
	kind := "Service"
	if b.Kind != nil {
		kind = string(*b.Kind)
	}
	if b.Group != nil && *b.Group != "" {
		return string(*b.Group) + "/" + kind
	}
	return kind
}

// grantedTo reports whether a ReferenceGrant of grants lets objects of kind fromKind in namespace
// fromNS refer to the core object of kind toKind at key.
func grantedTo(grants []gatewayv1.ReferenceGrant, fromKind gatewayv1.Kind, fromNS string, toKind gatewayv1.Kind, key types.NamespacedName) bool {
	for _, g := range grants {
		if g.Namespace != key.Namespace {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gatewayv1.ReferenceGrantFrom) bool {
			return f.Group == gatewayv1.GroupName && f.Kind == fromKind && string(f.Namespace) == fromNS
		})
		to := slices.ContainsFunc(g.Spec.To, func(t gatewayv1.ReferenceGrantTo) bool {
			return t.Group == "" && t.Kind == toKind && (t.Name == nil || string(*t.Name) == key.Name)
		})
		if from && to {
			return true
		}
	}
	return false
}

// backendKeys lists the Services a route's backendRefs and mirrors name, for lookups and
// watches.
func backendKeys(r *gatewayv1.HTTPRoute) []types.NamespacedName {
	var refs []gatewayv1.BackendObjectReference
	for _, rule := range r.Spec.Rules {
		for _, b := range rule.BackendRefs {
			refs = append(refs, b.BackendObjectReference)
		}
		for _, f := range rule.Filters {
			if f.RequestMirror != nil {
				refs = append(refs, f.RequestMirror.BackendRef)
			}
		}
	}
	var out []types.NamespacedName
	for _, b := range refs {
		if (b.Group != nil && *b.Group != "") || (b.Kind != nil && *b.Kind != "Service") {
			continue
		}
		key := types.NamespacedName{Namespace: r.Namespace, Name: string(b.Name)}
		if b.Namespace != nil {
			key.Namespace = string(*b.Namespace)
		}
		out = append(out, key)
	}
	return out
}
