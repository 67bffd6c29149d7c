package web

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tsingress/tsingress/internal/contract"
)

// Config configures a Server.
type Config struct {
	// Listen opens a TCP listener on the tailnet, as tsnet.Server.Listen does.
	Listen func(network, addr string) (net.Listener, error)
	WhoIs  WhoIsFunc
	Logger *slog.Logger
	// Metrics count the requests; nil counts none.
	Metrics *Metrics
}

// Server serves a WebService on the proxy's tailnet name, and on the hosts of its
// bring-your-own certificates: HTTPS on port 443, and port 80 as the service's HTTP mode says.
// It presents the certificates it is given and obtains none itself. Its methods are called from
// one goroutine, certificates may be set from any; requests are served concurrently, each with
// the config that was current when it arrived.
type Server struct {
	cfg        Config
	transports *transports
	callers    *identities // outlive config reloads, as the transports do
	certs      certificates
	cur        atomic.Pointer[snapshot]

	https  *http.Server
	plain  *http.Server // port 80; nil while the HTTP mode is off
	plnLn  net.Listener
	funnel *http.Server // connections from the internet; nil while Funnel is off
	errs   chan error
}

type snapshot struct {
	routes  *handler
	mode    contract.HTTPMode
	ingress string // the metrics' ingress label
}

// NewServer returns a server that listens once Apply is first called.
func NewServer(cfg Config) *Server {
	return &Server{
		cfg:        cfg,
		transports: newTransports(),
		callers:    newIdentities(cfg.WhoIs),
		errs:       make(chan error, 2),
	}
}

// Errors receives an error when a listener stops serving on its own.
func (s *Server) Errors() <-chan error { return s.errs }

// SetName sets the MagicDNS name served: the redirect target, and the name of the certificate
// SetCertificate gives. A new name drops the certificate of the old one.
func (s *Server) SetName(name string) { s.certs.setName(name) }

// SetCertificate sets the certificate presented for the name; nil presents none, so that
// handshakes fail.
func (s *Server) SetCertificate(cert *tls.Certificate) {
	s.certs.mu.Lock()
	defer s.certs.mu.Unlock()
	s.certs.cert = cert
}

// SetHostCertificates sets the bring-your-own certificates, by host: a handshake whose SNI
// names one of the hosts, or is covered by one that is a wildcard ("*.example.com"), gets that
// certificate, or fails if it is nil.
func (s *Server) SetHostCertificates(byHost map[string]*tls.Certificate) {
	hosts := make(map[string]*tls.Certificate, len(byHost))
	for h, c := range byHost {
		hosts[HostOf(h)] = c
	}
	s.certs.mu.Lock()
	defer s.certs.mu.Unlock()
	s.certs.hosts = hosts
}

// Apply serves ws from now on: new requests take its routes, and port 80 follows its HTTP mode.
// The first call opens the HTTPS listener.
func (s *Server) Apply(ws contract.WebService) error {
	h, err := newHandler(ws, s.transports, s.callers, s.cfg.Logger)
	if err != nil {
		return err
	}
	s.cur.Store(&snapshot{routes: h, mode: ws.HTTP, ingress: ws.Ingress})
	s.transports.keepVerifying(h.verifying)
	if s.https == nil {
		ln, err := s.cfg.Listen("tcp", ":443")
		if err != nil {
			return fmt.Errorf("listening on port 443: %w", err)
		}
		s.https = s.newHTTPServer(http.HandlerFunc(s.serveRoutes))
		s.https.TLSConfig = &tls.Config{GetCertificate: s.certs.get}
		go s.serve("HTTPS", func() error { return s.https.ServeTLS(ln, "", "") })
	}
	switch {
	case ws.HTTP != contract.HTTPOff && s.plain == nil:
		ln, err := s.cfg.Listen("tcp", ":80")
		if err != nil {
			return fmt.Errorf("listening on port 80: %w", err)
		}
		srv := s.newHTTPServer(http.HandlerFunc(s.servePlain))
		s.plain, s.plnLn = srv, ln
		go s.serve("HTTP", func() error { return srv.Serve(ln) })
	case ws.HTTP == contract.HTTPOff && s.plain != nil:
		s.plnLn.Close() // now, so that a later Apply can listen again at once
		go s.drain(s.plain)
		s.plain, s.plnLn = nil, nil
	}
	return nil
}

// SetFunnel serves the routes to the connections ln accepts from the internet (Tailscale
// Funnel), with the same certificates; nil stops. Their requests carry the header
// Tailscale-Funnel-Request and no tailnet identity, as Tailscale Serve's do. Funnel
// connections in flight when it stops finish in the background.
func (s *Server) SetFunnel(ln net.Listener) {
	if s.funnel != nil {
		go s.drain(s.funnel) // closes its listener
		s.funnel = nil
	}
	if ln == nil {
		return
	}
	srv := s.newHTTPServer(http.HandlerFunc(s.serveRoutes))
	srv.TLSConfig = &tls.Config{GetCertificate: s.certs.get}
	srv.BaseContext = func(net.Listener) context.Context { return context.WithValue(context.Background(), funnelKey{}, true) }
	s.funnel = srv
	go s.serve("Funnel", func() error { return srv.ServeTLS(ln, "", "") })
}

// funnelKey marks the context of requests that came from the internet through Funnel.
type funnelKey struct{}

func isFunnel(r *http.Request) bool {
	on, _ := r.Context().Value(funnelKey{}).(bool)
	return on
}

// serveRoutes serves a request with the routes current when it arrived.
func (s *Server) serveRoutes(w http.ResponseWriter, r *http.Request) {
	cur := s.cur.Load()
	s.cfg.Metrics.instrument(s.ingressLabel(cur), w, r, cur.routes.ServeHTTP)
}

// ingressLabel names the web service in metrics: its Ingress, or its tailnet name when the
// operator did not say (an older one).
func (s *Server) ingressLabel(cur *snapshot) string {
	if cur.ingress != "" {
		return cur.ingress
	}
	return s.certs.nameServed()
}

func (s *Server) servePlain(w http.ResponseWriter, r *http.Request) {
	cur := s.cur.Load()
	s.cfg.Metrics.instrument(s.ingressLabel(cur), w, r, func(w http.ResponseWriter, r *http.Request) { s.plainHTTP(cur, w, r) })
}

func (s *Server) plainHTTP(cur *snapshot, w http.ResponseWriter, r *http.Request) {
	switch cur.mode {
	case contract.HTTPRedirect:
		// To the same host when it is a bring-your-own host, else to the tailnet name, whatever
		// name or IP the request came by. 308 keeps the method and body of requests other than
		// GET and HEAD, which clients turn into a GET on a 301.
		code := http.StatusMovedPermanently
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			code = http.StatusPermanentRedirect
		}
		w.Header().Set("Server", ServerHeader)
		http.Redirect(w, r, "https://"+s.certs.redirectHost(HostOf(r.Host))+r.URL.RequestURI(), code)
	case contract.HTTPServe:
		cur.routes.ServeHTTP(w, r)
	default: // port 80 is closing
		w.Header().Set("Server", ServerHeader)
		http.NotFound(w, r)
	}
}

func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler: h,
		// No read or write timeout: responses may stream and uploads may be long.
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// Failed handshakes (say, a client that does not trust the CA) are the client's business.
		ErrorLog: slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelDebug),
	}
}

func (s *Server) serve(what string, serve func() error) {
	// ErrServerClosed follows Shutdown; net.ErrClosed follows Apply closing port 80's listener.
	if err := serve(); !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		s.errs <- fmt.Errorf("%s listener: %w", what, err)
	}
}

// drainTimeout bounds how long a closed port 80 waits for its requests.
const drainTimeout = 30 * time.Second

func (s *Server) drain(srv *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	_ = srv.Shutdown(ctx) // past drainTimeout the requests still in flight are cut off
}

// StopKeepAlives closes idle connections and makes every later response close its connection,
// while the server goes on serving. A replica that stopped advertising calls it, so that its
// clients' next requests open new connections, which go where the tailnet routes the name now,
// instead of waiting on a kept-alive one to a replica that is about to go.
func (s *Server) StopKeepAlives() {
	for _, srv := range []*http.Server{s.https, s.plain} {
		if srv != nil {
			srv.SetKeepAlivesEnabled(false)
		}
	}
}

// Shutdown stops accepting connections and waits, until ctx ends, for requests in flight.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	for _, srv := range []*http.Server{s.https, s.plain, s.funnel} {
		if srv != nil {
			errs = append(errs, srv.Shutdown(ctx))
		}
	}
	s.transports.CloseIdleConnections()
	return errors.Join(errs...)
}
