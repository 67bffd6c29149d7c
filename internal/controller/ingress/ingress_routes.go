package ingress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// RouteInputs is what an Ingress's routes are built from besides the Ingress.
type RouteInputs struct {
	// Services holds the Ingress namespace's Services that its backends name (a name missing
	// from it does not exist).
	Services map[string]*corev1.Service
	// Slices holds the EndpointSlices of those Services, by Service name.
	Slices map[string][]discoveryv1.EndpointSlice
	// Domain is the tailnet's MagicDNS domain, "" while unknown.
	Domain string
	// BackendCA is the CA bundle the Ingress names for its backends.
	BackendCA BackendCA
	// FunnelDenied is set when the operator's settings keep the Ingress's namespace off Funnel.
	FunnelDenied bool
}

// BuildWebService turns an Ingress into routes. Every backend that cannot be served is left
// out with a finding; the rest still work.
func BuildWebService(ing *networkingv1.Ingress, in RouteInputs) (contract.WebService, []kit.Finding) {
	var ws contract.WebService
	var findings []kit.Finding
	protocol := ing.Annotations[kit.AnnotationBackendProtocol]
	switch protocol {
	case "", "http", "https", "https-insecure", contract.BackendH2C:
	default:
		findings = append(findings, kit.Warnf(kit.ReasonInvalidAnnotation,
			"annotation %s=%q must be http, https, https-insecure or h2c; detecting the protocol from the port instead", kit.AnnotationBackendProtocol, protocol))
		protocol = ""
	}
	verification, protocol, tlsFindings := decideBackendTLS(ing, in.BackendCA, protocol)
	findings = append(findings, tlsFindings...)
	ws.Ingress = ing.Namespace + "/" + ing.Name
	if v, ok := ing.Annotations[kit.AnnotationHTTPRedirect]; ok {
		if on, err := strconv.ParseBool(v); err != nil {
			findings = append(findings, kit.Warnf(kit.ReasonInvalidAnnotation, "annotation %s=%q is not a boolean; no redirect", kit.AnnotationHTTPRedirect, v))
		} else if on {
			ws.HTTP = contract.HTTPRedirect
		}
	}
	// Plain HTTP beside HTTPS, as the original operator serves it; it takes port 80 from the
	// redirect.
	switch v := ing.Annotations[kit.AnnotationHTTPEndpoint]; v {
	case "", kit.HTTPEndpointDisabled:
	case kit.HTTPEndpointEnabled:
		if ws.HTTP == contract.HTTPRedirect {
			findings = append(findings, kit.Finding{Reason: kit.ReasonHTTPRedirectIgnored, Message: fmt.Sprintf(
				"annotation %s=%s serves plain HTTP on port 80, so %s is not applied", kit.AnnotationHTTPEndpoint, v, kit.AnnotationHTTPRedirect)})
		}
		ws.HTTP = contract.HTTPServe
	default:
		findings = append(findings, kit.Warnf(kit.ReasonInvalidAnnotation, "annotation %s=%q must be %q or %q; port 80 is not served plainly",
			kit.AnnotationHTTPEndpoint, v, kit.HTTPEndpointEnabled, kit.HTTPEndpointDisabled))
	}
	if f := kit.UnsupportedAnnotations("Ingress", ing.Annotations, IngressAnnotations...); f != nil {
		findings = append(findings, *f)
	}
	if v, ok := ing.Annotations[kit.AnnotationAcceptAppCaps]; ok {
		var f *kit.Finding
		ws.AcceptAppCaps, f = kit.ParseAcceptAppCaps(v)
		if f != nil {
			findings = append(findings, *f)
		}
	}
	var funnel *kit.Finding
	if ws.Funnel, funnel = kit.ParseFunnel(ing.Annotations, "Ingress", ing.Namespace, !in.FunnelDenied); funnel != nil {
		findings = append(findings, *funnel)
	}

	seen := map[string]bool{}
	add := func(host, path string, pathType contract.PathType, b networkingv1.IngressBackend, where string) {
		key := host + " " + string(pathType) + " " + path
		if seen[key] {
			findings = append(findings, kit.Warnf(kit.ReasonDuplicatePath, "%s: path %s (%s) is already routed; the first one wins", where, path, pathType))
			return
		}
		backend, f := resolveBackend(ing.Namespace, b, in, protocol, verification)
		if f != nil {
			f.Message = where + ": " + f.Message
			findings = append(findings, *f)
			if f.Warning {
				return
			}
		}
		seen[key] = true
		ws.Routes = append(ws.Routes, contract.Route{Host: host, Path: path, PathType: pathType, Backend: backend})
	}

	names := tailnetNames(ing, in.Domain)
	custom := certs.BYOHosts(ing)
	for i, rule := range ing.Spec.Rules {
		where := fmt.Sprintf("rule %d", i)
		ruleHost, ok, f := routeHost(rule.Host, names, custom)
		if !ok {
			findings = append(findings, kit.Warnf(kit.ReasonUnsupportedHost, "%s: %s", where, f))
			continue
		}
		if rule.HTTP == nil {
			continue
		}
		for j, p := range rule.HTTP.Paths {
			where := fmt.Sprintf("%s path %d", where, j)
			path := p.Path
			if path == "" {
				path = "/"
				findings = append(findings, kit.Finding{Reason: kit.ReasonPathUndefined, Message: where + ": no path given; serving it at /"})
			}
			pathType := contract.PathPrefix
			if p.PathType != nil && *p.PathType == networkingv1.PathTypeExact {
				pathType = contract.PathExact
			}
			if !strings.HasPrefix(path, "/") {
				findings = append(findings, kit.Warnf(kit.ReasonUnsupportedPath, "%s: path %q must start with /", where, path))
				continue
			}
			add(ruleHost, path, pathType, p.Backend, where)
		}
	}
	// The default backend takes what no rule matches, which is a prefix route at / unless a
	// rule already claimed /.
	if b := ing.Spec.DefaultBackend; b != nil && !seen[" "+string(contract.PathPrefix)+" /"] {
		add("", "/", contract.PathPrefix, *b, "default backend")
	}
	return ws, findings
}

// IngressAnnotations are the tailscale.com/ annotations honoured on an Ingress.
var IngressAnnotations = []string{kit.AnnotationAcceptAppCaps, kit.AnnotationBackendCA, kit.AnnotationBackendProtocol,
	kit.AnnotationBackendServerName, kit.AnnotationFunnel,
	kit.AnnotationHTTPEndpoint, kit.AnnotationHTTPRedirect, kit.LabelProxyClass, kit.AnnotationProxyGroup, kit.AnnotationTags}

// tailnetNames are the names a rule host may use for an Ingress's tailnet name, lower-cased:
// the first TLS host as written, its short form (the device hostname) and, once the tailnet's
// domain is known, the full MagicDNS name. Users write either form in rules (the original's
// issues 9548 and 10910).
func tailnetNames(ing *networkingv1.Ingress, domain string) []string {
	hostname := kit.IngressHostname(ing)
	names := []string{hostname}
	if h := strings.ToLower(strings.TrimSuffix(kit.TLSHost(ing), ".")); h != "" && h != hostname {
		names = append(names, h)
	}
	if domain != "" {
		names = append(names, hostname+"."+strings.ToLower(strings.TrimSuffix(domain, ".")))
	}
	return names
}

// routeHost decides how a rule's host is served: for that host only (a bring-your-own host, or
// one a bring-your-own wildcard covers), for every name (no host, or a name of the tailnet name,
// or a wildcard covering one), or not at all, with why.
func routeHost(ruleHost string, tailnet []string, custom map[string]bool) (host string, ok bool, why string) {
	h := strings.ToLower(strings.TrimSuffix(ruleHost, "."))
	switch {
	case h == "":
		return "", true, ""
	case custom[h]:
		return h, true, ""
	case !contract.IsWildcard(h) && custom["*."+parentDomain(h)]:
		return h, true, ""
	}
	for _, n := range tailnet {
		if h == n || (contract.IsWildcard(h) && parentDomain(n) == h[2:]) {
			return "", true, ""
		}
	}
	if contract.IsWildcard(h) {
		return "", false, fmt.Sprintf("wildcard host %q is served only with a bring-your-own certificate for it: list %q in a TLS entry "+
			"with a secretName whose kubernetes.io/tls Secret holds a certificate for it (cert-manager issues wildcard certificates)", ruleHost, h)
	}
	return "", false, fmt.Sprintf("host %q is not served: a tailscale Ingress serves its tailnet name (%s) and the custom hosts of TLS entries with a secretName",
		ruleHost, strings.Join(tailnet, ", "))
}

// parentDomain is host without its first label ("" for a single label).
func parentDomain(host string) string {
	_, parent, _ := strings.Cut(host, ".")
	return parent
}

// maxEndpoints bounds the endpoints listed per backend, so that a large Service cannot swell
// the proxy config (a ProxyGroup's ConfigMap holds every Ingress of the group): beyond it the
// proxy reaches the ClusterIP and kube-proxy balances.
const maxEndpoints = 128

// resolveBackend finds the address of an Ingress backend: the Service's ClusterIP (or, for
// an ExternalName Service, its DNS name) and the Service port, with the ready endpoints behind
// that port. A finding that is no warning leaves the backend usable.
func resolveBackend(namespace string, b networkingv1.IngressBackend, in RouteInputs, protocol string, verification backendTLS) (contract.Backend, *kit.Finding) {
	fail := func(format string, a ...any) (contract.Backend, *kit.Finding) {
		f := kit.Warnf(kit.ReasonInvalidIngressBackend, format, a...)
		return contract.Backend{}, &f
	}
	if b.Service == nil {
		return fail("only Service backends are supported")
	}
	svc := in.Services[b.Service.Name]
	if svc == nil {
		return fail("backend Service %s/%s does not exist", namespace, b.Service.Name)
	}
	var host string
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		host = svc.Spec.ExternalName
	case svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return fail("backend Service %s/%s has no ClusterIP (headless Services are not supported)", namespace, svc.Name)
	default:
		host = svc.Spec.ClusterIP
	}
	sp, ok := servicePort(svc, b.Service.Port)
	if !ok {
		want := b.Service.Port.Name
		if want == "" {
			want = strconv.Itoa(int(b.Service.Port.Number))
		}
		return fail("backend Service %s/%s has no port %s", namespace, svc.Name, want)
	}
	port, portName := sp.Port, sp.Name
	scheme, insecure, h2c := "http", false, false
	switch {
	case protocol == "https":
		scheme = "https"
	case protocol == "https-insecure", protocol == "" && (port == 443 || portName == "https"):
		scheme, insecure = "https", true
	case protocol == contract.BackendH2C, protocol == "" && ptr.Deref(sp.AppProtocol, "") == appProtocolH2C:
		h2c = true
	}
	backend := contract.Backend{URL: scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(port))), InsecureSkipVerify: insecure}
	if h2c {
		backend.Protocol = contract.BackendH2C
	}
	if scheme == "https" && !insecure {
		if f := verification.verify(&backend, namespace, svc); f != nil {
			return contract.Backend{}, f
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return backend, nil
	}
	eps := readyEndpoints(svc, portName, in.Slices[svc.Name])
	if len(eps) > maxEndpoints {
		return backend, &kit.Finding{Reason: kit.ReasonEndpointsNotListed, Message: fmt.Sprintf(
			"backend Service %s/%s has %d ready endpoints, more than the %d the proxy balances across; it is reached through its ClusterIP",
			namespace, svc.Name, len(eps), maxEndpoints)}
	}
	backend.Endpoints = eps
	return backend, nil
}

// readyEndpoints lists, sorted, the "ip:port" of the ready endpoints behind a Service port, of
// the ClusterIP's family, from the Service's EndpointSlices. EndpointSlices name their ports
// after the Service's; the number is the Pod's port.
func readyEndpoints(svc *corev1.Service, portName string, epSlices []discoveryv1.EndpointSlice) []string {
	family := discoveryv1.AddressTypeIPv4
	if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err == nil && ip.Is6() {
		family = discoveryv1.AddressTypeIPv6
	}
	var out []string
	for _, sl := range epSlices {
		if sl.AddressType != family {
			continue
		}
		var port int32
		for _, p := range sl.Ports {
			if ptr.Deref(p.Name, "") == portName && p.Port != nil && ptr.Deref(p.Protocol, corev1.ProtocolTCP) == corev1.ProtocolTCP {
				port = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			// Ready is unset when unknown, which consumers take as ready; a terminating
			// endpoint is not ready.
			if !ptr.Deref(ep.Conditions.Ready, true) || len(ep.Addresses) == 0 {
				continue
			}
			if ip, err := netip.ParseAddr(ep.Addresses[0]); err == nil {
				out = append(out, netip.AddrPortFrom(ip, uint16(port)).String())
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func servicePort(svc *corev1.Service, want networkingv1.ServiceBackendPort) (corev1.ServicePort, bool) {
	for _, p := range svc.Spec.Ports {
		if (want.Name != "" && p.Name == want.Name) || (want.Name == "" && p.Port == want.Number) {
			return p, true
		}
	}
	return corev1.ServicePort{}, false
}

// appProtocolH2C is the Kubernetes-defined appProtocol of a Service port that speaks HTTP/2
// without TLS (KEP-3726), as gRPC servers do.
const appProtocolH2C = "kubernetes.io/h2c"

// backendServiceNames lists the Services an Ingress routes to, for lookups and watches.
func backendServiceNames(ing *networkingv1.Ingress) []string {
	var names []string
	addB := func(b *networkingv1.IngressBackend) {
		if b != nil && b.Service != nil {
			names = append(names, b.Service.Name)
		}
	}
	addB(ing.Spec.DefaultBackend)
	for _, r := range ing.Spec.Rules {
		if r.HTTP != nil {
			for i := range r.HTTP.Paths {
				addB(&r.HTTP.Paths[i].Backend)
			}
		}
	}
	return names
}

// gatherRouteInputs reads what an Ingress's routes are built from: through c, cached, and api,
// not.
func gatherRouteInputs(ctx context.Context, c client.Client, api client.Reader, ing *networkingv1.Ingress, domain string) (RouteInputs, error) {
	in := RouteInputs{Domain: domain}
	var err error
	if in.Services, err = backendServices(ctx, c, ing); err != nil {
		return in, err
	}
	if in.BackendCA, err = readBackendCA(ctx, api, ing); err != nil {
		return in, err
	}
	in.Slices, err = backendEndpointSlices(ctx, c, ing)
	return in, err
}

// backendEndpointSlices fetches the EndpointSlices of the Services an Ingress routes to.
func backendEndpointSlices(ctx context.Context, c client.Client, ing *networkingv1.Ingress) (map[string][]discoveryv1.EndpointSlice, error) {
	out := map[string][]discoveryv1.EndpointSlice{}
	for _, name := range backendServiceNames(ing) {
		if _, done := out[name]; done {
			continue
		}
		list := &discoveryv1.EndpointSliceList{}
		if err := c.List(ctx, list, client.InNamespace(ing.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
			return nil, fmt.Errorf("listing the EndpointSlices of backend Service %s/%s: %w", ing.Namespace, name, err)
		}
		out[name] = list.Items
	}
	return out, nil
}

// ingressesForEndpointSlice maps an EndpointSlice to the Ingresses kept by keep that route to
// its Service: a change of ready endpoints changes their routes.
func ingressesForEndpointSlice(c client.Client, keep func(*networkingv1.Ingress) bool) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		svc := o.GetLabels()[discoveryv1.LabelServiceName]
		if svc == "" {
			return nil
		}
		list := &networkingv1.IngressList{}
		if err := c.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{indexIngressBackends: svc}); err != nil {
			return nil
		}
		return ingressRequests(list.Items, keep)
	}
}
