package web

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"tailscale.com/client/tailscale/apitype"

	"github.com/tsingress/tsingress/internal/contract"
)

// Identity headers set for a tailnet caller that is a user's device, as Tailscale Serve sets
// them. Backends may trust them because the proxy removes whatever the client sent.
const (
	HeaderUserLogin      = "Tailscale-User-Login"
	HeaderUserName       = "Tailscale-User-Name"
	HeaderUserProfilePic = "Tailscale-User-Profile-Pic"

	identityHeaderPrefix = "Tailscale-User-"
)

// WhoIsFunc identifies the tailnet caller at remoteAddr (ip:port), like tsnet's LocalClient.WhoIs.
type WhoIsFunc func(ctx context.Context, remoteAddr string) (*apitype.WhoIsResponse, error)

// transports hold the connections to backends. They outlive config reloads, so that a reload
// keeps the connection pools.
type transports struct {
	verify, insecure *http.Transport
}

// newTransports returns transports with timeouts fit for in-cluster backends.
func newTransports() *transports {
	return &transports{verify: newTransport(false), insecure: newTransport(true)}
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

// CloseIdleConnections closes idle backend connections.
func (t *transports) CloseIdleConnections() {
	t.verify.CloseIdleConnections()
	t.insecure.CloseIdleConnections()
}

// handler serves a WebService's routes by reverse proxying to their backends.
type handler struct {
	router  *Router
	proxies map[contract.Backend]*httputil.ReverseProxy
	whois   WhoIsFunc
	log     *slog.Logger
}

// newHandler returns the handler for ws. The request path reaches the backend unchanged; the
// original Host is kept, with X-Forwarded-For, -Host and -Proto set by the proxy alone.
func newHandler(ws contract.WebService, tr *transports, whois WhoIsFunc, log *slog.Logger) (*handler, error) {
	h := &handler{
		router:  NewRouter(ws.Routes),
		proxies: map[contract.Backend]*httputil.ReverseProxy{},
		whois:   whois,
		log:     log,
	}
	for _, rt := range ws.Routes {
		if _, ok := h.proxies[rt.Backend]; ok {
			continue
		}
		target, err := url.Parse(rt.Backend.URL)
		if err != nil {
			return nil, fmt.Errorf("route %s: backend URL: %w", rt.Path, err)
		}
		transport := tr.verify
		if rt.Backend.InsecureSkipVerify {
			transport = tr.insecure
		}
		h.proxies[rt.Backend] = &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				pr.Out.Host = pr.In.Host
				pr.SetXForwarded()
			},
			Transport:    transport,
			ErrorHandler: h.backendError(target.Host),
			ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
	}
	return h, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host := r.Host
	if host == "" && r.TLS != nil { // HTTP/1.0 sends no Host
		host = r.TLS.ServerName
	}
	rt, ok := h.router.Match(HostOf(host), r.URL.Path)
	if !ok {
		http.NotFound(w, r)
		return
	}
	h.setIdentity(r)
	h.proxies[rt.Backend].ServeHTTP(w, r)
}

// setIdentity replaces any identity headers the client sent with the caller's tailnet identity.
// Tagged devices have no user, so they get none.
func (h *handler) setIdentity(r *http.Request) {
	for name := range r.Header {
		if strings.HasPrefix(name, identityHeaderPrefix) {
			delete(r.Header, name)
		}
	}
	who, err := h.whois(r.Context(), r.RemoteAddr)
	if err != nil {
		h.log.Debug("caller not identified", "remote", r.RemoteAddr, "err", err)
		return
	}
	if who.Node == nil || who.Node.IsTagged() || who.UserProfile == nil {
		return
	}
	set := func(name, v string) {
		if v != "" {
			// Display names may be non-ASCII; header values may not.
			r.Header.Set(name, mime.QEncoding.Encode("utf-8", v))
		}
	}
	set(HeaderUserLogin, who.UserProfile.LoginName)
	set(HeaderUserName, who.UserProfile.DisplayName)
	set(HeaderUserProfilePic, who.UserProfile.ProfilePicURL)
}

func (h *handler) backendError(backend string) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		if r.Context().Err() == nil { // not just a client that went away
			h.log.Warn("backend request failed", "backend", backend, "path", r.URL.Path, "err", err)
		}
		w.WriteHeader(http.StatusBadGateway)
	}
}
