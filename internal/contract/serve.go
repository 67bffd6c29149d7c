package contract

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// PathType is how a route's path matches a request path, as networking.k8s.io/v1 defines it.
type PathType string

const (
	// PathExact matches the path exactly (case-sensitive).
	PathExact PathType = "Exact"
	// PathPrefix matches on whole path elements: /foo matches /foo and /foo/bar, not /foobar.
	PathPrefix PathType = "Prefix"
	// PathRegularExpression matches when the RE2 expression matches the whole path (a Gateway
	// API RegularExpression match). Schema v7.
	PathRegularExpression PathType = "RegularExpression"
)

// MatchType is how a header or query match compares values: exactly (""), or by an RE2
// expression matching the whole value (schema v7).
type MatchType string

const MatchRegularExpression MatchType = "RegularExpression"

// maxExpression bounds a regular expression's length, as the Gateway API bounds the values.
const maxExpression = 1024

// CompileMatch compiles a route's regular expression so that it matches whole values only.
func CompileMatch(expr string) (*regexp.Regexp, error) {
	if len(expr) > maxExpression {
		return nil, fmt.Errorf("regular expression of %d bytes, more than %d", len(expr), maxExpression)
	}
	return regexp.Compile(`^(?:` + expr + `)$`)
}

// HTTPMode says what a web service does on plain HTTP (port 80).
type HTTPMode string

const (
	HTTPOff      HTTPMode = ""         // no port 80
	HTTPRedirect HTTPMode = "redirect" // 301 to the same URL on https
	HTTPServe    HTTPMode = "serve"    // serve the same routes over plain HTTP too
)

// WebService is the Serve config of one name: HTTPS on 443 with routes to backends, and port 80
// as HTTP says; or, with Ports, the ports it lists.
type WebService struct {
	// HTTP is what port 80 does.
	HTTP HTTPMode `json:"http,omitempty"`
	// Routes, matched most specific first: exact matches, then the longest prefix.
	Routes []Route `json:"routes,omitempty"`
	// Ports, in place of Routes and HTTP, are the ports served, each with its protocol and
	// routes: a Gateway's listeners. Schema v8: an older proxy would serve port 443 only.
	Ports []WebPort `json:"ports,omitempty"`
	// TLS says where certificates come from besides ACME for the tailnet name. Schema v2.
	TLS WebTLS `json:"tls,omitzero"`
	// Ingress is the namespace/name of the Ingress served, which labels the proxy's request
	// metrics. Optional in any version: an older proxy ignores it.
	Ingress string `json:"ingress,omitempty"`
	// Funnel also serves the tailnet name (the proxy's, or the Tailscale Service's) to the
	// internet through Tailscale Funnel, on port 443, once the tailnet's policy lets the proxy.
	// Optional in any version: a proxy that does not know it serves the tailnet only, and
	// reports no StateFunnel, which the operator shows as Funnel not on yet.
	Funnel bool `json:"funnel,omitempty"`
	// AcceptAppCaps are the app capabilities ("example.com/cap/admin") the tailnet policy grants
	// a caller that the proxy passes to backends, in the Tailscale-App-Capabilities header as
	// Tailscale Serve sends it. Serve config v4, proxy config v5: an older proxy would pass none.
	AcceptAppCaps []string `json:"acceptAppCaps,omitempty"`
}

// WebPort is a port of a web service and the routes served on it.
type WebPort struct {
	Port int `json:"port"`
	// TLS serves HTTPS, with the web service's certificates; else plain HTTP.
	TLS bool `json:"tls,omitempty"`
	// Routes are matched as WebService.Routes are, except that a wildcard host covers one
	// label or more in place of the "*" (a.example.com and a.b.example.com), as a Gateway API
	// hostname's does.
	Routes []Route `json:"routes"`
}

// ListenPorts are the ports the web service serves.
func (w *WebService) ListenPorts() []int {
	if len(w.Ports) > 0 {
		ports := make([]int, len(w.Ports))
		for i, p := range w.Ports {
			ports[i] = p.Port
		}
		return ports
	}
	if w.HTTP != HTTPOff {
		return []int{443, 80}
	}
	return []int{443}
}

// ServesTLS reports whether a port of the web service serves HTTPS, which needs the tailnet
// name's certificate.
func (w *WebService) ServesTLS() bool {
	return len(w.Ports) == 0 || slices.ContainsFunc(w.Ports, func(p WebPort) bool { return p.TLS })
}

// AllRoutes lists the routes of every port.
func (w *WebService) AllRoutes() []Route {
	routes := w.Routes
	for _, p := range w.Ports {
		routes = append(slices.Clip(routes), p.Routes...)
	}
	return routes
}

// WebTLS configures the certificates of a web service.
type WebTLS struct {
	// Hold stops new ACME issuance for the tailnet name (the operator's rate-limit guard): a
	// cached certificate is still served, but none is requested.
	Hold *IssuanceHold `json:"hold,omitempty"`
	// Certificates are bring-your-own certificates, served by SNI for the hosts each names.
	Certificates []CertificateRef `json:"certificates,omitempty"`
}

// IsZero lets omitzero leave out TLS settings that say nothing: an empty list of certificates
// says what none does, and a document must read back as it was written (found by fuzzing).
func (t WebTLS) IsZero() bool { return t.Hold == nil && len(t.Certificates) == 0 }

// IssuanceHold says why, and until when, no certificate may be requested from the CA.
type IssuanceHold struct {
	Reason  string    `json:"reason"`
	Message string    `json:"message,omitempty"`
	Until   time.Time `json:"until,omitzero"`
}

// CertificateRef is a kubernetes.io/tls Secret in the proxy's namespace (the operator copies a
// user's Secret there) and the hosts it is served for.
type CertificateRef struct {
	SecretName string   `json:"secretName"`
	Hosts      []string `json:"hosts"`
}

// minVersion is the oldest schema version that can express the web service: v8 for ports, v7 for regular
// expressions and backends answering a fixed status, v6 for method,
// header and query matches, header edits, redirects, rewrites, splits and timeouts, v5 for backend CAs and server names, v4 for app capabilities and backend protocols, v3 for wildcard hosts, v2 for certificate settings and route hosts. Endpoints
// are an optional addition that older readers ignore (they reach the Service's ClusterIP
// instead), so they need no version.
func (w *WebService) minVersion() int {
	if len(w.Ports) > 0 {
		return 8
	}
	if slices.ContainsFunc(w.Routes, Route.needsV7) {
		return 7
	}
	if slices.ContainsFunc(w.Routes, Route.needsV6) {
		return 6
	}
	if slices.ContainsFunc(w.Routes, func(r Route) bool { return r.Backend.verifiesTLS() }) {
		return 5
	}
	if len(w.AcceptAppCaps) > 0 || slices.ContainsFunc(w.Routes, func(r Route) bool { return r.Backend.Protocol != "" }) {
		return 4
	}
	v := 1
	if w.TLS.Hold != nil || len(w.TLS.Certificates) > 0 {
		v = 2
	}
	for _, r := range w.Routes {
		if r.Host != "" {
			v = max(v, 2)
		}
		if IsWildcard(r.Host) {
			return 3
		}
	}
	for _, c := range w.TLS.Certificates {
		if slices.ContainsFunc(c.Hosts, IsWildcard) {
			return 3
		}
	}
	return v
}

// Route sends requests whose path matches to a backend. The request path is passed on
// unchanged, as Kubernetes Ingress semantics require.
type Route struct {
	// Host limits the route to requests for that host (a bring-your-own certificate's host);
	// empty matches every host. Schema v2. A wildcard, "*.example.com", matches exactly one
	// label in its place (a.example.com, not example.com or a.b.example.com). Schema v3.
	Host     string   `json:"host,omitempty"`
	Path     string   `json:"path"`
	PathType PathType `json:"pathType"`
	Backend  Backend  `json:"backend"`
	// Method, Headers and Query narrow the route further (a Gateway API HTTPRoute's matches): the
	// request's method, each header's value (the name case-insensitive) and each query
	// parameter's first value must be exactly those given. Schema v6: an older proxy would send
	// every method and header to the route.
	Method  string      `json:"method,omitempty"`
	Headers []NameValue `json:"headers,omitempty"`
	Query   []NameValue `json:"query,omitempty"`
	// RequestHeaders edits the request's headers before it reaches the backend, and
	// ResponseHeaders the response's before it reaches the client. The caller's identity headers
	// are set after the request's edits, so that no edit can forge them. Schema v6.
	RequestHeaders  *HeaderEdits `json:"requestHeaders,omitempty"`
	ResponseHeaders *HeaderEdits `json:"responseHeaders,omitempty"`
	// Redirect answers the route's requests with a redirect, and the route has no backend.
	// Schema v6.
	Redirect *Redirect `json:"redirect,omitempty"`
	// Rewrite changes the Host and the path a request reaches the backend with. Schema v6.
	Rewrite *Rewrite `json:"rewrite,omitempty"`
	// Backends, in place of Backend, split the route's requests across several backends, each
	// its weight's share of them. Schema v6.
	Backends []WeightedBackend `json:"backends,omitempty"`
	// TimeoutMillis bounds the time from a request to its response's header: past it the
	// proxy gives up and answers 504. 0 is no bound. Schema v6.
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
	// Mirrors each get a copy of their share of the route's requests, as the route's backend
	// gets them; their responses are dropped. Schema v7: an older proxy would send none.
	Mirrors []Mirror `json:"mirrors,omitempty"`
}

// Mirror is a server that gets a copy of Numerator/Denominator of a route's requests.
type Mirror struct {
	Backend     Backend `json:"backend"`
	Numerator   int     `json:"numerator"`
	Denominator int     `json:"denominator"`
}

// WeightedBackend is a backend and its share of a route's requests, weight/(sum of weights).
type WeightedBackend struct {
	Backend Backend `json:"backend"`
	Weight  int     `json:"weight"`
}

// BackendsOf lists a route's backends: its one Backend, or those it splits requests across.
func (r Route) BackendsOf() []Backend {
	if len(r.Backends) == 0 {
		if r.Redirect != nil {
			return nil
		}
		return []Backend{r.Backend}
	}
	out := make([]Backend, len(r.Backends))
	for i, b := range r.Backends {
		out[i] = b.Backend
	}
	return out
}

// Redirect is a redirect's target: what it does not name is the request's own.
type Redirect struct {
	// Scheme is http or https; "" keeps the request's.
	Scheme string `json:"scheme,omitempty"`
	// Hostname replaces the request's host.
	Hostname string `json:"hostname,omitempty"`
	// Port is the target's port; 0 is the scheme's well-known port, or the request's port when
	// the scheme is kept. A scheme's well-known port is left out of the Location.
	Port int `json:"port,omitempty"`
	// Path replaces the request's path, or the part of it the route's Prefix path matched.
	Path *PathChange `json:"path,omitempty"`
	// StatusCode is 301 or 302.
	StatusCode int `json:"statusCode"`
}

// Rewrite is how a request's Host and path change on the way to the backend.
type Rewrite struct {
	Hostname string      `json:"hostname,omitempty"`
	Path     *PathChange `json:"path,omitempty"`
}

// PathChange replaces a request's path: the whole of it (Full), or the part the route's
// Prefix path matched (Prefix).
type PathChange struct {
	Type  PathChangeType `json:"type"`
	Value string         `json:"value"`
}

// PathChangeType says which part of the path a PathChange replaces.
type PathChangeType string

const (
	PathChangeFull   PathChangeType = "Full"
	PathChangePrefix PathChangeType = "Prefix"
)

// NameValue is a header or query parameter and its value; in a match, Type says how the value
// compares (never in an edit).
type NameValue struct {
	Name  string    `json:"name"`
	Value string    `json:"value"`
	Type  MatchType `json:"type,omitempty"`
}

// HeaderEdits are applied in order: Set replaces a header's values, Add appends a value, Remove
// deletes a header.
type HeaderEdits struct {
	Set    []NameValue `json:"set,omitempty"`
	Add    []NameValue `json:"add,omitempty"`
	Remove []string    `json:"remove,omitempty"`
}

// needsV7 reports whether a route uses what schema v7 added: regular expressions, and backends
// answering a fixed status.
func (r Route) needsV7() bool {
	regex := func(m NameValue) bool { return m.Type != "" }
	return r.PathType == PathRegularExpression || slices.ContainsFunc(r.Headers, regex) || slices.ContainsFunc(r.Query, regex) || len(r.Mirrors) > 0 ||
		slices.ContainsFunc(r.BackendsOf(), func(b Backend) bool { return b.Status != 0 })
}

// needsV6 reports whether a route uses what schema v6 added.
func (r Route) needsV6() bool {
	return r.Method != "" || len(r.Headers) > 0 || len(r.Query) > 0 || r.RequestHeaders != nil || r.ResponseHeaders != nil ||
		r.Redirect != nil || r.Rewrite != nil || len(r.Backends) > 0 || r.TimeoutMillis != 0
}

// MatchKey identifies what a route matches: two routes of one key in a web service would be
// ambiguous, and the first is served.
func (r Route) MatchKey() string {
	return fmt.Sprint(r.Host, " ", r.PathType, " ", r.Path, " ", r.Method, " ", r.Headers, " ", r.Query)
}

// Backend is an upstream HTTP server, normally a Service's ClusterIP and port.
type Backend struct {
	// URL is scheme://host:port with scheme http or https.
	URL string `json:"url"`
	// InsecureSkipVerify accepts any certificate from an https backend: in-cluster backends
	// rarely have certificates for their ClusterIP.
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
	// Endpoints are the Service's ready endpoints, "ip:port": the proxy balances requests across
	// them and reaches URL's host only when none is usable. Optional, in any version: a reader
	// that does not know the field sends everything to URL.
	Endpoints []string `json:"endpoints,omitempty"`
	// Protocol is how requests reach an http backend: "" for HTTP/1.1, BackendH2C for HTTP/2
	// without TLS (gRPC servers, the Service port's appProtocol kubernetes.io/h2c). Schema v4:
	// an older proxy would speak HTTP/1.1 to a server that answers only HTTP/2. (An https
	// backend speaks HTTP/2 when it offers it, in any version.)
	Protocol string `json:"protocol,omitempty"`
	// CABundle is PEM: the CA certificates an https backend's certificate must chain to, in
	// place of the system's roots. Schema v5: an older proxy would verify against the
	// system's roots and fail every request.
	CABundle string `json:"caBundle,omitempty"`
	// ServerName is the name an https backend's certificate is verified for, in place of
	// URL's host (a ClusterIP, which certificates rarely name). Schema v5.
	ServerName string `json:"serverName,omitempty"`
	// Status, in place of every other field, answers each request the backend gets with this
	// status (400 to 599) and reaches no server: what a Gateway API rule whose backendRef does
	// not resolve is served with (500, or 503 for gRPC's UNAVAILABLE), and a Gateway without
	// routes (404). Schema v7: an older proxy would try to reach a server.
	Status int `json:"status,omitempty"`
}

// ValidCABundle reports whether bundle holds at least one PEM certificate.
func ValidCABundle(bundle string) bool { return x509.NewCertPool().AppendCertsFromPEM([]byte(bundle)) }

// verifiesTLS reports whether a backend's TLS settings need schema v5.
func (b Backend) verifiesTLS() bool { return b.CABundle != "" || b.ServerName != "" }

// BackendH2C is the protocol of a backend that speaks HTTP/2 without TLS.
const BackendH2C = "h2c"

// Validate checks the web service's routes.
func (w *WebService) Validate() error {
	var errs []error
	switch w.HTTP {
	case HTTPOff, HTTPRedirect, HTTPServe:
	default:
		errs = append(errs, fmt.Errorf("http mode %q must be empty, redirect or serve", w.HTTP))
	}
	if len(w.Ports) > 0 {
		errs = append(errs, w.validatePorts()...)
	} else if len(w.Routes) == 0 {
		errs = append(errs, errors.New("no routes"))
	}
	errs = append(errs, validateRoutes(w.Routes)...)
	for _, c := range w.AcceptAppCaps {
		if !ValidAppCapability(c) {
			errs = append(errs, fmt.Errorf("app capability %q must look like example.com/cap/name", c))
		}
	}
	if w.TLS.Hold != nil && w.TLS.Hold.Reason == "" {
		errs = append(errs, errors.New("an issuance hold needs a reason"))
	}
	for _, c := range w.TLS.Certificates {
		if c.SecretName == "" || len(c.Hosts) == 0 {
			errs = append(errs, fmt.Errorf("certificate %q needs a Secret name and hosts", c.SecretName))
		}
		for _, h := range c.Hosts {
			if !ValidHost(h) {
				errs = append(errs, fmt.Errorf("certificate %s: host %q is not a DNS name or a wildcard", c.SecretName, h))
			}
		}
	}
	return errors.Join(errs...)
}

// validatePorts checks a web service of ports.
func (w *WebService) validatePorts() []error {
	var errs []error
	if len(w.Routes) > 0 || w.HTTP != HTTPOff {
		errs = append(errs, errors.New("a web service of ports has no routes or http mode of its own"))
	}
	seen := map[int]bool{}
	for _, p := range w.Ports {
		if p.Port < 1 || p.Port > 65535 || seen[p.Port] {
			errs = append(errs, fmt.Errorf("port %d is not a port, or is given twice", p.Port))
		}
		seen[p.Port] = true
		if len(p.Routes) == 0 {
			errs = append(errs, fmt.Errorf("port %d: no routes", p.Port))
		}
		for _, err := range validateRoutes(p.Routes) {
			errs = append(errs, fmt.Errorf("port %d: %w", p.Port, err))
		}
	}
	if w.Funnel && !slices.ContainsFunc(w.Ports, func(p WebPort) bool { return p.Port == 443 && p.TLS }) {
		errs = append(errs, errors.New("funnel needs HTTPS on port 443"))
	}
	return errs
}

// validateRoutes checks the routes of one port: each valid, none matching what another does.
func validateRoutes(routes []Route) []error {
	var errs []error
	seen := map[string]bool{}
	for _, r := range routes {
		key := r.MatchKey()
		if seen[key] {
			errs = append(errs, fmt.Errorf("route %s %s%s appears twice", r.PathType, r.Host, r.Path))
		}
		seen[key] = true
		if err := r.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Validate checks one route.
func (r *Route) Validate() error {
	if r.Host != "" && !ValidHost(r.Host) {
		return fmt.Errorf("route %s: host %q is not a DNS name or a wildcard", r.Path, r.Host)
	}
	switch r.PathType {
	case PathExact, PathPrefix:
		if !strings.HasPrefix(r.Path, "/") {
			return fmt.Errorf("route path %q must start with /", r.Path)
		}
	case PathRegularExpression:
		if _, err := CompileMatch(r.Path); err != nil {
			return fmt.Errorf("route path %q: %w", r.Path, err)
		}
	default:
		return fmt.Errorf("route %s: path type %q must be Exact, Prefix or RegularExpression", r.Path, r.PathType)
	}
	if r.TimeoutMillis < 0 {
		return fmt.Errorf("route %s: timeout %d ms is negative", r.Path, r.TimeoutMillis)
	}
	if r.Redirect != nil {
		return r.validateRedirect()
	}
	if len(r.Backends) > 0 {
		if err := r.validateSplit(); err != nil {
			return err
		}
	} else if err := r.Backend.validate(); err != nil {
		return fmt.Errorf("route %s: %w", r.Path, err)
	}
	if err := r.validatePathChange(r.Rewrite.pathChange()); err != nil {
		return err
	}
	for i, m := range r.Mirrors {
		if m.Backend.Status != 0 {
			return fmt.Errorf("route %s: mirror %d: a server's backend needed, not a fixed status", r.Path, i)
		}
		if err := m.Backend.validate(); err != nil {
			return fmt.Errorf("route %s: mirror %d: %w", r.Path, i, err)
		}
		if m.Denominator < 1 || m.Denominator > 1_000_000 || m.Numerator < 0 || m.Numerator > m.Denominator {
			return fmt.Errorf("route %s: mirror %d: share %d/%d must be a fraction of 1 or less, its denominator 1 to 1000000", r.Path, i, m.Numerator, m.Denominator)
		}
	}
	if r.Rewrite != nil && r.Rewrite.Hostname != "" && !ValidDNSName(r.Rewrite.Hostname) {
		return fmt.Errorf("route %s: rewrite hostname %q is not a DNS name", r.Path, r.Rewrite.Hostname)
	}
	return r.validateNarrowing()
}

// validateSplit checks a route that splits requests across backends by weight.
func (r *Route) validateSplit() error {
	var errs []error
	if !reflect.ValueOf(r.Backend).IsZero() || len(r.Backends) < 2 {
		errs = append(errs, errors.New("a split has no backend of its own and two backends or more"))
	}
	total := 0
	for i, b := range r.Backends {
		if b.Weight <= 0 || b.Weight > 1_000_000 {
			errs = append(errs, fmt.Errorf("backend %d: weight %d must be 1 to 1000000", i, b.Weight))
		}
		total += b.Weight
		if err := b.Backend.validate(); err != nil {
			errs = append(errs, fmt.Errorf("backend %d: %w", i, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("route %s: %w", r.Path, err)
	}
	return nil
}

// validate checks a backend.
func (b *Backend) validate() error {
	if b.Status != 0 {
		if !reflect.DeepEqual(*b, Backend{Status: b.Status}) {
			return errors.New("a backend with a fixed status has nothing else")
		}
		if b.Status < 400 || b.Status > 599 {
			return fmt.Errorf("backend status %d must be 400 to 599", b.Status)
		}
		return nil
	}
	u, err := url.Parse(b.URL)
	if err != nil {
		return fmt.Errorf("backend URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("backend URL %q must be http(s)://host:port", b.URL)
	}
	if b.Protocol != "" && (b.Protocol != BackendH2C || u.Scheme != "http") {
		return fmt.Errorf("backend protocol %q must be empty, or %s for an http backend", b.Protocol, BackendH2C)
	}
	if b.verifiesTLS() && (u.Scheme != "https" || b.InsecureSkipVerify) {
		return errors.New("a backend CA or server name needs a verified https backend")
	}
	if b.CABundle != "" && !ValidCABundle(b.CABundle) {
		return errors.New("backend CA bundle holds no PEM certificate")
	}
	if b.ServerName != "" && !ValidDNSName(b.ServerName) {
		return fmt.Errorf("backend server name %q is not a DNS name", b.ServerName)
	}
	for _, ep := range b.Endpoints {
		if _, err := netip.ParseAddrPort(ep); err != nil {
			return fmt.Errorf("endpoint %q must be ip:port: %w", ep, err)
		}
	}
	return nil
}

// validateRedirect checks a redirecting route: a redirect, and no backend or rewrite.
func (r *Route) validateRedirect() error {
	rd := r.Redirect
	var errs []error
	if !reflect.ValueOf(r.Backend).IsZero() || len(r.Backends) > 0 || r.Rewrite != nil || len(r.Mirrors) > 0 {
		errs = append(errs, errors.New("a redirect has no backend, rewrite or mirror"))
	}
	if rd.Scheme != "" && rd.Scheme != "http" && rd.Scheme != "https" {
		errs = append(errs, fmt.Errorf("redirect scheme %q must be http or https", rd.Scheme))
	}
	if rd.Hostname != "" && !ValidDNSName(rd.Hostname) {
		errs = append(errs, fmt.Errorf("redirect hostname %q is not a DNS name", rd.Hostname))
	}
	if rd.Port < 0 || rd.Port > 65535 {
		errs = append(errs, fmt.Errorf("redirect port %d is not a port", rd.Port))
	}
	if rd.StatusCode != 301 && rd.StatusCode != 302 {
		errs = append(errs, fmt.Errorf("redirect status %d must be 301 or 302", rd.StatusCode))
	}
	if err := errors.Join(errs...); err != nil {
		errs = []error{fmt.Errorf("route %s: %w", r.Path, err)}
	}
	return errors.Join(append(errs, r.validatePathChange(rd.Path), r.validateNarrowing())...)
}

func (rw *Rewrite) pathChange() *PathChange {
	if rw == nil {
		return nil
	}
	return rw.Path
}

// validatePathChange checks a redirect's or rewrite's path: a Prefix change needs a Prefix route.
func (r *Route) validatePathChange(pc *PathChange) error {
	switch {
	case pc == nil:
		return nil
	case !strings.HasPrefix(pc.Value, "/"):
		return fmt.Errorf("route %s: path %q must start with /", r.Path, pc.Value)
	case pc.Type == PathChangeFull:
		return nil
	case pc.Type == PathChangePrefix && r.PathType == PathPrefix:
		return nil
	}
	return fmt.Errorf("route %s: path change %q must be Full, or Prefix on a Prefix route", r.Path, pc.Type)
}

// validateNarrowing checks a route's method, header and query matches and its header edits.
func (r *Route) validateNarrowing() error {
	var errs []error
	if r.Method != "" && !httpguts.ValidHeaderFieldName(r.Method) { // a method is a token, as a header name is
		errs = append(errs, fmt.Errorf("method %q is not a token", r.Method))
	}
	headers, query := map[string]bool{}, map[string]bool{}
	for _, m := range slices.Concat(r.Headers, r.Query) {
		switch m.Type {
		case "":
		case MatchRegularExpression:
			if _, err := CompileMatch(m.Value); err != nil {
				errs = append(errs, fmt.Errorf("match of %q: %w", m.Name, err))
			}
		default:
			errs = append(errs, fmt.Errorf("match of %q: type %q must be empty or RegularExpression", m.Name, m.Type))
		}
	}
	for _, h := range r.Headers {
		if !httpguts.ValidHeaderFieldName(h.Name) || (h.Type == "" && !httpguts.ValidHeaderFieldValue(h.Value)) {
			errs = append(errs, fmt.Errorf("header match %q: %q is not a valid header", h.Name, h.Value))
		}
		name := http.CanonicalHeaderKey(h.Name)
		if headers[name] {
			errs = append(errs, fmt.Errorf("header match %q twice", h.Name))
		}
		headers[name] = true
	}
	for _, q := range r.Query {
		if q.Name == "" {
			errs = append(errs, errors.New("a query match without a name"))
		}
		if query[q.Name] {
			errs = append(errs, fmt.Errorf("query match %q twice", q.Name))
		}
		query[q.Name] = true
	}
	for _, e := range []*HeaderEdits{r.RequestHeaders, r.ResponseHeaders} {
		if e == nil {
			continue
		}
		for _, h := range slices.Concat(e.Set, e.Add) {
			if !httpguts.ValidHeaderFieldName(h.Name) || !httpguts.ValidHeaderFieldValue(h.Value) || h.Type != "" {
				errs = append(errs, fmt.Errorf("header edit %q: %q is not a valid header", h.Name, h.Value))
			}
		}
		for _, name := range e.Remove {
			if !httpguts.ValidHeaderFieldName(name) {
				errs = append(errs, fmt.Errorf("header edit: %q is not a header name", name))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("route %s: %w", r.Path, err)
	}
	return nil
}

// appCapability is the form of an app capability's name in a tailnet policy's grants: a
// domain the capability's owner controls, then a path.
var appCapability = regexp.MustCompile(`^([\pL\pN-]+\.)+[\pL\pN-]+/[\pL\pN/-]+$`)

// ValidAppCapability reports whether c names an app capability, such as
// "example.com/cap/admin". Tailscale's own capabilities (tailscale.com/...) are not app
// capabilities a backend is given.
func ValidAppCapability(c string) bool {
	return appCapability.MatchString(c) && !strings.HasPrefix(c, "tailscale.com/")
}

// IsWildcard reports whether a host is a wildcard such as "*.example.com".
func IsWildcard(host string) bool { return strings.HasPrefix(host, "*.") }

// ValidHost reports whether s is a DNS name or a wildcard of one ("*.example.com").
func ValidHost(s string) bool {
	if IsWildcard(s) {
		return strings.Contains(s[2:], ".") && ValidDNSName(s[2:])
	}
	return ValidDNSName(s)
}

// ServeConfig is a ProxyGroup's L7 document in its ConfigMap: the web services of every
// Ingress on the group, keyed by Tailscale Service name ("svc:<label>"). A replica serves a
// service on the service's MagicDNS name, <label>.<tailnet domain>.
type ServeConfig struct {
	Version  int                   `json:"version"`
	Services map[string]WebService `json:"services"`
}

// Validate checks every service.
func (s *ServeConfig) Validate() error {
	var errs []error
	for name, svc := range s.Services {
		if !ValidServiceName(name) {
			errs = append(errs, fmt.Errorf("service name %q must look like svc:name", name))
		}
		if err := svc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// ServeConfigs stores ServeConfig documents.
// Version 2 added certificate settings and route hosts, version 3 wildcard hosts, version 4
// app capabilities and backend protocols, version 5 backend CAs and server names, version 6
// method, header and query matches, header edits, redirects, rewrites, splits and timeouts,
// version 7 regular expressions, mirrors and fixed statuses, version 8 ports; an older version is written only while no service needs a newer one, so
// that an older replica fails clearly instead of serving without them.
var ServeConfigs = codec[ServeConfig]{
	name: "serve-config",
	encode: map[int]func(*ServeConfig) ([]byte, error){
		1: onlyIf(func(c *ServeConfig) bool { return c.minVersion() <= 1 },
			jsonEncoder(1, func(c *ServeConfig, v int) { c.Version = v })),
		2: onlyIf(func(c *ServeConfig) bool { return c.minVersion() <= 2 },
			jsonEncoder(2, func(c *ServeConfig, v int) { c.Version = v })),
		3: onlyIf(func(c *ServeConfig) bool { return c.minVersion() <= 3 },
			jsonEncoder(3, func(c *ServeConfig, v int) { c.Version = v })),
		4: onlyIf(func(c *ServeConfig) bool { return c.minVersion() <= 4 },
			jsonEncoder(4, func(c *ServeConfig, v int) { c.Version = v })),
		5: onlyIf(func(c *ServeConfig) bool { return c.minVersion() <= 5 },
			jsonEncoder(5, func(c *ServeConfig, v int) { c.Version = v })),
		6: onlyIf(func(c *ServeConfig) bool { return c.minVersion() <= 6 },
			jsonEncoder(6, func(c *ServeConfig, v int) { c.Version = v })),
		7: onlyIf(func(c *ServeConfig) bool { return c.minVersion() <= 7 },
			jsonEncoder(7, func(c *ServeConfig, v int) { c.Version = v })),
		8: jsonEncoder(8, func(c *ServeConfig, v int) { c.Version = v }),
	},
	decode: map[int]func([]byte) (*ServeConfig, error){
		1: jsonDecoder(1, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
		2: jsonDecoder(2, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
		3: jsonDecoder(3, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
		4: jsonDecoder(4, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
		5: jsonDecoder(5, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
		6: jsonDecoder(6, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
		7: jsonDecoder(7, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
		8: jsonDecoder(8, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
	},
}

func (s *ServeConfig) minVersion() int {
	v := 1
	for _, svc := range s.Services {
		v = max(v, svc.minVersion())
	}
	return v
}

// GroupCertSecret names the kubernetes.io/tls Secret, in the proxies' namespace, in which a
// ProxyGroup's issuing replica (ordinal 0) stores the certificate of a tailnet name, and from
// which the other replicas read it. The operator creates it (empty) and grants access to it.
func GroupCertSecret(fqdn string) string { return strings.ToLower(strings.TrimSuffix(fqdn, ".")) }

// Headers the proxy sets from the caller's tailnet identity, as Tailscale Serve sets them, after
// removing whatever the client sent: backends may trust them, and no route may edit them.
const (
	IdentityHeaderPrefix  = "Tailscale-User-"            // the user's login, name and picture
	HeaderFunnelRequest   = "Tailscale-Funnel-Request"   // "?1": a request from the internet
	HeaderAppCapabilities = "Tailscale-App-Capabilities" // the caller's granted app capabilities
)

// IsIdentityHeader reports whether a header is one the proxy sets from the caller's identity.
func IsIdentityHeader(name string) bool {
	n := http.CanonicalHeaderKey(name)
	return strings.HasPrefix(n, IdentityHeaderPrefix) || n == HeaderFunnelRequest || n == HeaderAppCapabilities
}
