package controller

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/tsingress/tsingress/internal/contract"
)

// finding is a problem (or notice) met while deciding what to serve, reported as an Event. A
// blocking finding stops the object from being served as it stands (what serves it already is
// left alone); another leaves out only what it is about (a route, a custom host).
type finding struct {
	warning  bool
	blocking bool
	reason   string
	message  string
}

func warnf(reason, format string, a ...any) finding {
	return finding{warning: true, reason: reason, message: fmt.Sprintf(format, a...)}
}

func blockf(reason, format string, a ...any) finding {
	f := warnf(reason, format, a...)
	f.blocking = true
	return f
}

// hasBlocking reports whether a finding stops an object from being served.
func hasBlocking(fs []finding) bool {
	return slices.ContainsFunc(fs, func(f finding) bool { return f.blocking })
}

// firstBlocking is the first finding that stops an object from being served.
func firstBlocking(fs []finding) finding {
	i := slices.IndexFunc(fs, func(f finding) bool { return f.blocking })
	return fs[i]
}

// ingressHostname is the tailnet hostname of an Ingress: the first label of its first TLS host,
// else <namespace>-<name>-ingress.
func ingressHostname(ing *networkingv1.Ingress) string {
	if h := tlsHost(ing); h != "" {
		return strings.ToLower(strings.SplitN(h, ".", 2)[0])
	}
	return truncateLabel(dnsLabelish(ing.Namespace + "-" + ing.Name + "-ingress"))
}

// tlsHost is the first host of the first TLS entry that is not a bring-your-own certificate's.
func tlsHost(ing *networkingv1.Ingress) string {
	for _, t := range ing.Spec.TLS {
		if !isBYO(t) && len(t.Hosts) > 0 {
			return t.Hosts[0]
		}
	}
	return ""
}

func truncateLabel(s string) string {
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-")
}

// buildWebService turns an Ingress into routes. services holds the Ingress namespace's Services
// that its backends name (a name missing from it does not exist). Every backend that cannot be
// served is left out with a finding; the rest still work.
func buildWebService(ing *networkingv1.Ingress, services map[string]*corev1.Service) (contract.WebService, []finding) {
	var ws contract.WebService
	var findings []finding
	protocol := ing.Annotations[AnnotationBackendProtocol]
	switch protocol {
	case "", "http", "https", "https-insecure":
	default:
		findings = append(findings, warnf(ReasonInvalidAnnotation,
			"annotation %s=%q must be http, https or https-insecure; detecting the protocol from the port instead", AnnotationBackendProtocol, protocol))
		protocol = ""
	}
	if v, ok := ing.Annotations[AnnotationHTTPRedirect]; ok {
		if on, err := strconv.ParseBool(v); err != nil {
			findings = append(findings, warnf(ReasonInvalidAnnotation, "annotation %s=%q is not a boolean; no redirect", AnnotationHTTPRedirect, v))
		} else if on {
			ws.HTTP = contract.HTTPRedirect
		}
	}

	seen := map[string]bool{}
	add := func(host, path string, pathType contract.PathType, b networkingv1.IngressBackend, where string) {
		key := host + " " + string(pathType) + " " + path
		if seen[key] {
			findings = append(findings, warnf(ReasonDuplicatePath, "%s: path %s (%s) is already routed; the first one wins", where, path, pathType))
			return
		}
		backend, f := resolveBackend(ing.Namespace, b, services, protocol)
		if f != nil {
			f.message = where + ": " + f.message
			findings = append(findings, *f)
			return
		}
		seen[key] = true
		ws.Routes = append(ws.Routes, contract.Route{Host: host, Path: path, PathType: pathType, Backend: backend})
	}

	host, custom := tlsHost(ing), byoHosts(ing)
	for i, rule := range ing.Spec.Rules {
		where := fmt.Sprintf("rule %d", i)
		// A rule for a custom host is routed for that host only; one for the tailnet name, or
		// without a host, for every name.
		ruleHost := ""
		switch {
		case custom[strings.ToLower(rule.Host)]:
			ruleHost = strings.ToLower(rule.Host)
		case rule.Host != "" && !strings.EqualFold(rule.Host, host):
			findings = append(findings, warnf(ReasonUnsupportedHost,
				"%s: host %q is not served: a tailscale Ingress serves its first TLS host (%q) and the custom hosts of TLS entries with a secretName", where, rule.Host, host))
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
				findings = append(findings, finding{reason: ReasonPathUndefined, message: where + ": no path given; serving it at /"})
			}
			pathType := contract.PathPrefix
			if p.PathType != nil && *p.PathType == networkingv1.PathTypeExact {
				pathType = contract.PathExact
			}
			if !strings.HasPrefix(path, "/") {
				findings = append(findings, warnf(ReasonUnsupportedPath, "%s: path %q must start with /", where, path))
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

// resolveBackend finds the address of an Ingress backend: the Service's ClusterIP (or, for
// an ExternalName Service, its DNS name) and the Service port.
func resolveBackend(namespace string, b networkingv1.IngressBackend, services map[string]*corev1.Service, protocol string) (contract.Backend, *finding) {
	fail := func(format string, a ...any) (contract.Backend, *finding) {
		f := warnf(ReasonInvalidIngressBackend, format, a...)
		return contract.Backend{}, &f
	}
	if b.Service == nil {
		return fail("only Service backends are supported")
	}
	svc := services[b.Service.Name]
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
	port, portName, ok := servicePort(svc, b.Service.Port)
	if !ok {
		want := b.Service.Port.Name
		if want == "" {
			want = strconv.Itoa(int(b.Service.Port.Number))
		}
		return fail("backend Service %s/%s has no port %s", namespace, svc.Name, want)
	}
	scheme, insecure := "http", false
	switch {
	case protocol == "https":
		scheme = "https"
	case protocol == "https-insecure", protocol == "" && (port == 443 || portName == "https"):
		scheme, insecure = "https", true
	}
	return contract.Backend{URL: scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(port))), InsecureSkipVerify: insecure}, nil
}

func servicePort(svc *corev1.Service, want networkingv1.ServiceBackendPort) (int32, string, bool) {
	for _, p := range svc.Spec.Ports {
		if (want.Name != "" && p.Name == want.Name) || (want.Name == "" && p.Port == want.Number) {
			return p.Port, p.Name, true
		}
	}
	return 0, "", false
}

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
