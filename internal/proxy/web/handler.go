package web

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"tailscale.com/client/tailscale/apitype"
	"tailscale.com/tailcfg"

	"github.com/tsingress/tsingress/internal/contract"
)

// Identity headers set for a tailnet caller that is a user's device, as Tailscale Serve sets
// them. Backends may trust them because the proxy removes whatever the client sent.
const (
	HeaderUserLogin      = contract.IdentityHeaderPrefix + "Login"
	HeaderUserName       = contract.IdentityHeaderPrefix + "Name"
	HeaderUserProfilePic = contract.IdentityHeaderPrefix + "Profile-Pic"
	// HeaderFunnelRequest ("?1") marks a request from the internet, through Tailscale Funnel:
	// it has no tailnet identity.
	HeaderFunnelRequest = contract.HeaderFunnelRequest
	// HeaderAppCapabilities carries, as a JSON object, the app capabilities the tailnet policy
	// grants the caller, of those the web service accepts (WebService.AcceptAppCaps), each with
	// its values, as Tailscale Serve sends it.
	HeaderAppCapabilities = contract.HeaderAppCapabilities
)

// WhoIsFunc identifies the tailnet caller at remoteAddr (ip:port), like tsnet's LocalClient.WhoIs.
type WhoIsFunc func(ctx context.Context, remoteAddr string) (*apitype.WhoIsResponse, error)

// ServerHeader is the Server header of the proxy's responses, and of backend responses that
// carry none.
const ServerHeader = "tsingress"

// transports hold the connections to backends, and what is known of the endpoints' health.
// They outlive config reloads, so that a reload keeps the connection pools.
type transports struct {
	verify, insecure *http.Transport
	h2c              *http.Transport // HTTP/2 without TLS, to http backends that ask for it
	health           *endpointHealth

	mu        sync.Mutex
	verifying map[string]*http.Transport // https transports of a server name and CA bundle, by both
}

// newTransports returns transports with timeouts fit for in-cluster backends.
func newTransports() *transports {
	h2c := newTransport(false)
	h2c.Protocols = new(http.Protocols)
	h2c.Protocols.SetUnencryptedHTTP2(true)
	return &transports{verify: newTransport(false), insecure: newTransport(true), h2c: h2c, health: newEndpointHealth(),
		verifying: map[string]*http.Transport{}}
}

func newTransport(insecure bool) *http.Transport {
	return &http.Transport{
		// No Proxy: backends are ClusterIPs, never reached through an HTTP proxy from the env.
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       &tls.Config{InsecureSkipVerify: insecure}, // only when the config says so
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   32,
	}
}

// forBackend returns the transport of a backend. A verified https backend is verified for its
// server name (else its URL's host, also when it is balanced across endpoints: never the
// endpoint's IP), against its CA bundle (else the system's roots).
// A verified transport's key, which forBackend returns with it, names its server name and CA
// bundle; "" for the shared transports.
func (t *transports) forBackend(b contract.Backend, target *url.URL) (*http.Transport, string, error) {
	switch {
	case b.Protocol == contract.BackendH2C:
		return t.h2c, "", nil
	case b.InsecureSkipVerify:
		return t.insecure, "", nil
	case target.Scheme != "https" || len(b.Endpoints) == 0 && b.ServerName == "" && b.CABundle == "":
		return t.verify, "", nil
	}
	name := b.ServerName
	if name == "" {
		name = target.Hostname()
	}
	key := name + "\x00" + b.CABundle
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr := t.verifying[key]; tr != nil {
		return tr, key, nil
	}
	tr := newTransport(false)
	tr.TLSClientConfig.ServerName = name
	if b.CABundle != "" {
		tr.TLSClientConfig.RootCAs = x509.NewCertPool()
		if !tr.TLSClientConfig.RootCAs.AppendCertsFromPEM([]byte(b.CABundle)) {
			return nil, "", errors.New("the backend CA bundle holds no PEM certificate")
		}
	}
	t.verifying[key] = tr
	return tr, key, nil
}

// keepVerifying drops the verified transports whose keys are not in use, once a reload no
// longer names their server name and CA bundle (a rotated CA): their idle connections are
// closed, and requests under way on them finish.
func (t *transports) keepVerifying(inUse map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, tr := range t.verifying {
		if !inUse[key] {
			tr.CloseIdleConnections()
			delete(t.verifying, key)
		}
	}
}

// CloseIdleConnections closes idle backend connections.
func (t *transports) CloseIdleConnections() {
	t.verify.CloseIdleConnections()
	t.insecure.CloseIdleConnections()
	t.h2c.CloseIdleConnections()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tr := range t.verifying {
		tr.CloseIdleConnections()
	}
}

// handler serves a WebService's routes by reverse proxying to their backends.
type handler struct {
	router  *Router
	proxies []http.Handler // by route index
	mirror  [][]mirror     // by route index
	// mirroring holds a token per mirrored request in flight.
	mirroring chan struct{}
	callers   *identities
	appCaps   []tailcfg.PeerCapability // passed on to backends; none: no header
	log       *slog.Logger
	// verifying are the keys of the verified transports its routes use.
	verifying map[string]bool
}

// newHandler returns the handler for the routes of a port, router ordering them. The request
// path reaches the backend unchanged; the original Host is kept, with X-Forwarded-For, -Host
// and -Proto set by the proxy alone.
func newHandler(router *Router, appCaps []string, tr *transports, callers *identities, log *slog.Logger) (*handler, error) {
	routes := router.routes
	h := &handler{
		router:    router,
		proxies:   make([]http.Handler, len(routes)),
		mirror:    make([][]mirror, len(routes)),
		mirroring: make(chan struct{}, maxMirrorsInFlight),
		callers:   callers,
		log:       log,
		verifying: map[string]bool{},
	}
	for _, c := range appCaps {
		h.appCaps = append(h.appCaps, tailcfg.PeerCapability(c))
	}
	byBackend := map[string]http.Handler{} // routes to one backend share its balancing
	for i, rt := range routes {
		for _, m := range rt.Mirrors {
			p, err := h.proxyTo(m.Backend, tr, byBackend)
			if err != nil {
				return nil, fmt.Errorf("route %s: mirror: %w", rt.Path, err)
			}
			h.mirror[i] = append(h.mirror[i], mirror{to: p, numerator: m.Numerator, denominator: m.Denominator})
		}
		switch {
		case rt.Redirect != nil: // answered by the handler itself
		case len(rt.Backends) > 0:
			s := &split{}
			for _, wb := range rt.Backends {
				p, err := h.proxyTo(wb.Backend, tr, byBackend)
				if err != nil {
					return nil, fmt.Errorf("route %s: %w", rt.Path, err)
				}
				s.add(p, wb.Weight)
			}
			h.proxies[i] = s
		default:
			p, err := h.proxyTo(rt.Backend, tr, byBackend)
			if err != nil {
				return nil, fmt.Errorf("route %s: %w", rt.Path, err)
			}
			h.proxies[i] = p
		}
	}
	return h, nil
}

// proxyTo returns the reverse proxy to a backend, made once per handler, or what answers a
// backend's fixed status.
func (h *handler) proxyTo(b contract.Backend, tr *transports, made map[string]http.Handler) (http.Handler, error) {
	if b.Status != 0 {
		return fixedStatus(b.Status), nil
	}
	key := fmt.Sprint(b.URL, b.InsecureSkipVerify, b.Endpoints, b.Protocol, b.ServerName, b.CABundle)
	if p, ok := made[key]; ok {
		return p, nil
	}
	target, err := url.Parse(b.URL)
	if err != nil {
		return nil, fmt.Errorf("backend URL: %w", err)
	}
	backendTransport, verifyingKey, err := tr.forBackend(b, target)
	if err != nil {
		return nil, err
	}
	if verifyingKey != "" {
		h.verifying[verifyingKey] = true
	}
	var transport http.RoundTripper = backendTransport
	if len(b.Endpoints) > 0 {
		transport = &balancer{transport: transport, endpoints: b.Endpoints, clusterIP: target.Host,
			health: tr.health, log: h.log.With("backend", target.Host)}
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			if rw, ok := pr.In.Context().Value(rewriteKey{}).(rewrite); ok {
				if rw.host != "" {
					pr.Out.Host = rw.host
				}
				if rw.path != "" {
					pr.Out.URL.Path, pr.Out.URL.RawPath = rw.path, ""
				}
			}
		},
		Transport:      transport,
		BufferPool:     copyBuffers,
		ModifyResponse: setServerHeader,
		ErrorHandler:   h.backendError(target.Host),
		ErrorLog:       slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	made[key] = p
	return p, nil
}

// fixedStatus answers every request with a status, as the proxy's own answer.
type fixedStatus int

func (s fixedStatus) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Server", ServerHeader)
	http.Error(w, http.StatusText(int(s)), int(s))
}

// split sends each request to one of its backends, at random, each backend's weight's share
// of them.
type split struct {
	proxies []http.Handler
	upTo    []int // the cumulative weights
}

func (s *split) add(p http.Handler, weight int) {
	total := 0
	if n := len(s.upTo); n > 0 {
		total = s.upTo[n-1]
	}
	s.proxies, s.upTo = append(s.proxies, p), append(s.upTo, total+weight)
}

func (s *split) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := rand.IntN(s.upTo[len(s.upTo)-1])
	i, _ := slices.BinarySearch(s.upTo, n+1)
	s.proxies[i].ServeHTTP(w, r)
}

// copyBuffers are the buffers bodies are copied through: ReverseProxy otherwise allocates and
// clears 32 KiB for every response, which showed in the profile of small requests.
var copyBuffers httputil.BufferPool = &bufferPool{sync.Pool{New: func() any { return new([32 << 10]byte) }}}

type bufferPool struct{ sync.Pool }

func (p *bufferPool) Get() []byte { return p.Pool.Get().(*[32 << 10]byte)[:] }

func (p *bufferPool) Put(b []byte) {
	if len(b) == 32<<10 {
		p.Pool.Put((*[32 << 10]byte)(b))
	}
}

// setServerHeader names the proxy in a backend response that names no server.
func setServerHeader(resp *http.Response) error {
	if resp.Header.Get("Server") == "" {
		resp.Header.Set("Server", ServerHeader)
	}
	return nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	i := h.router.match(r)
	if info := infoOf(r.Context()); info != nil && i >= 0 {
		info.route = RouteLabel(h.router.routes[i])
	}
	if i < 0 {
		w.Header().Set("Server", ServerHeader)
		http.NotFound(w, r)
		return
	}
	rt := &h.router.routes[i]
	if rt.ResponseHeaders != nil {
		w = &editingWriter{ResponseWriter: w, edits: rt.ResponseHeaders}
	}
	if rt.Redirect != nil {
		w.Header().Set("Location", redirectLocation(rt.Redirect, r, changedPath(h.router.clean[i], rt.Redirect.Path, r.URL.Path)))
		w.Header().Set("Server", ServerHeader)
		w.WriteHeader(rt.Redirect.StatusCode)
		return
	}
	editHeaders(r.Header, rt.RequestHeaders)
	h.setIdentity(r) // after the edits, which cannot forge it then
	if rt.TimeoutMillis > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), time.Duration(rt.TimeoutMillis)*time.Millisecond)
		defer cancel()
		r = r.WithContext(ctx)
	}
	if rw := rt.Rewrite; rw != nil {
		r = r.WithContext(context.WithValue(r.Context(), rewriteKey{}, rewrite{host: rw.Hostname, path: changedPath(h.router.clean[i], rw.Path, r.URL.Path)}))
	}
	if len(h.mirror[i]) > 0 {
		r = h.mirrors(r, h.mirror[i])
	}
	h.proxies[i].ServeHTTP(w, r)
}

// rewrite is the Host and path a request reaches its backend with, where they change.
type rewrite struct{ host, path string }

type rewriteKey struct{}

// changedPath is a request path as a redirect or rewrite of the route (as the router matched
// it) changes it; "" when it does not. A Prefix change replaces the whole path elements the
// route matched: /old matched in /old/a, replaced by /new, gives /new/a; by /, gives /a.
func changedPath(route contract.Route, pc *contract.PathChange, reqPath string) string {
	switch {
	case pc == nil:
		return ""
	case pc.Type == contract.PathChangeFull:
		return pc.Value
	}
	rest := strings.TrimPrefix(cleanPath(reqPath), strings.TrimSuffix(route.Path, "/"))
	if p := strings.TrimSuffix(pc.Value, "/") + rest; p != "" {
		return p
	}
	return "/"
}

// redirectLocation is the target of a redirect of r: what the redirect does not name is the
// request's own; a port is the scheme's well-known one when a scheme is named, else the
// listener's, and is left out where it is the scheme's well-known one.
func redirectLocation(rd *contract.Redirect, r *http.Request, path string) string {
	scheme, port := "http", 80 // the listener's
	if r.TLS != nil {
		scheme, port = "https", 443
	}
	if rd.Scheme != "" {
		scheme, port = rd.Scheme, wellKnownPorts[rd.Scheme]
	}
	if rd.Port != 0 {
		port = rd.Port
	}
	host := rd.Hostname
	if host == "" {
		host = r.Host
		if host == "" && r.TLS != nil {
			host = r.TLS.ServerName
		}
		host = HostOf(host)
	}
	if port != wellKnownPorts[scheme] {
		host = net.JoinHostPort(host, strconv.Itoa(port))
	} else if strings.Contains(host, ":") {
		host = "[" + host + "]" // an IPv6 literal
	}
	u := url.URL{Scheme: scheme, Host: host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	if path != "" {
		u.Path, u.RawPath = path, ""
	}
	return u.String()
}

var wellKnownPorts = map[string]int{"http": 80, "https": 443}

// editHeaders applies a route's header edits.
func editHeaders(h http.Header, e *contract.HeaderEdits) {
	if e == nil {
		return
	}
	for _, nv := range e.Set {
		h.Set(nv.Name, nv.Value)
	}
	for _, nv := range e.Add {
		h.Add(nv.Name, nv.Value)
	}
	for _, name := range e.Remove {
		h.Del(name)
	}
}

// editingWriter applies a route's response header edits as the response's header is written
// (an informational 1xx other than 101 is passed as it is). Unwrap keeps flushing and
// hijacking (streams, WebSockets) working through http.ResponseController.
type editingWriter struct {
	http.ResponseWriter
	edits   *contract.HeaderEdits
	written bool
}

func (w *editingWriter) WriteHeader(code int) {
	if !w.written && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.written = true
		editHeaders(w.Header(), w.edits)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *editingWriter) Write(b []byte) (int, error) {
	if !w.written {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *editingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// setIdentity replaces any identity headers the client sent with the caller's tailnet identity.
// Tagged devices have no user, so they get no user headers, but app capabilities as the policy
// grants them; a caller from the internet is marked as such, and has neither.
func (h *handler) setIdentity(r *http.Request) {
	for name := range r.Header {
		if contract.IsIdentityHeader(name) {
			delete(r.Header, name)
		}
	}
	if isFunnel(r) {
		r.Header.Set(HeaderFunnelRequest, "?1")
		return
	}
	who, err := h.callers.lookup(r.Context(), r.RemoteAddr)
	if err != nil {
		h.log.Debug("caller not identified", "remote", r.RemoteAddr, "err", err)
		return
	}
	set := func(name, v string) {
		if v != "" {
			// Display names and capability values may be non-ASCII; header values may not.
			r.Header.Set(name, mime.QEncoding.Encode("utf-8", v))
		}
	}
	if len(h.appCaps) > 0 {
		set(HeaderAppCapabilities, h.grantedCaps(who.CapMap))
	}
	if who.Node == nil || who.Node.IsTagged() || who.UserProfile == nil {
		return
	}
	set(HeaderUserLogin, who.UserProfile.LoginName)
	set(HeaderUserName, who.UserProfile.DisplayName)
	set(HeaderUserProfilePic, who.UserProfile.ProfilePicURL)
}

// grantedCaps is the header value for a caller granted caps: of the capabilities the service
// accepts, those granted, with their values ("{}" for none, so that a backend tells "granted
// nothing" from "not asked").
func (h *handler) grantedCaps(caps tailcfg.PeerCapMap) string {
	granted := make(map[tailcfg.PeerCapability][]tailcfg.RawMessage, len(h.appCaps))
	for _, c := range h.appCaps {
		if vals, ok := caps[c]; ok {
			granted[c] = vals
		}
	}
	b, err := json.Marshal(granted)
	if err != nil { // values are JSON already; not expected
		h.log.Warn("app capabilities not passed on", "err", err)
		return ""
	}
	return string(b)
}

func (h *handler) backendError(backend string) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		status := http.StatusBadGateway
		timedOut := errors.Is(r.Context().Err(), context.DeadlineExceeded) // the route's timeout
		if timedOut {
			status = http.StatusGatewayTimeout
		}
		if r.Context().Err() == nil || timedOut { // not just a client that went away
			h.log.Warn("backend request failed", "backend", backend, "path", r.URL.Path, "status", status, "err", err)
			if info := infoOf(r.Context()); info != nil {
				info.upstreamError = true
			}
		}
		w.Header().Set("Server", ServerHeader)
		w.WriteHeader(status)
	}
}
