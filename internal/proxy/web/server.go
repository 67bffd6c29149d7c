package web

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
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
// bring-your-own certificates: HTTPS on port 443, and port 80 as the service's HTTP mode says,
// or the ports the service lists. It presents the certificates it is given and obtains none
// itself. Its methods are called from one goroutine, certificates may be set from any; requests
// are served concurrently, each with the config that was current when it arrived.
type Server struct {
	cfg        Config
	transports *transports
	callers    *identities // outlive config reloads, as the transports do
	certs      certificates
	cur        atomic.Pointer[snapshot]

	listening map[int]*portServer // by port
	funnel    *http.Server        // connections from the internet; nil while Funnel is off
	errs      chan error
}

// portServer serves one port.
type portServer struct {
	srv *http.Server
	ln  net.Listener
	tls bool
}

type snapshot struct {
	ports   map[int]*portPlan
	ingress string // the metrics' ingress label
}

// portPlan is what a port serves: its routes, or redirects to HTTPS.
type portPlan struct {
	tls      bool
	routes   *handler // nil when redirecting
	redirect bool
}

// NewServer returns a server that listens once Apply is first called.
func NewServer(cfg Config) *Server {
	return &Server{
		cfg:        cfg,
		transports: newTransports(),
		callers:    newIdentities(cfg.WhoIs),
		listening:  map[int]*portServer{},
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

// plans are the ports ws serves: those it lists, or 443 with its routes and 80 as its HTTP
// mode says (the two share one handler).
func (s *Server) plans(ws contract.WebService) (map[int]*portPlan, error) {
	plans := map[int]*portPlan{}
	if len(ws.Ports) == 0 {
		h, err := newHandler(NewRouter(ws.Routes), ws.AcceptAppCaps, s.transports, s.callers, s.cfg.Logger)
		if err != nil {
			return nil, err
		}
		plans[443] = &portPlan{tls: true, routes: h}
		switch ws.HTTP {
		case contract.HTTPServe:
			plans[80] = &portPlan{routes: h}
		case contract.HTTPRedirect:
			plans[80] = &portPlan{redirect: true}
		}
		return plans, nil
	}
	for _, p := range ws.Ports {
		h, err := newHandler(NewGatewayRouter(p.Routes), ws.AcceptAppCaps, s.transports, s.callers, s.cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("port %d: %w", p.Port, err)
		}
		plans[p.Port] = &portPlan{tls: p.TLS, routes: h}
	}
	return plans, nil
}

// Apply serves ws from now on: new requests take its routes, and the ports it serves are
// opened, and those it no longer serves closed (their requests in flight finish).
func (s *Server) Apply(ws contract.WebService) error {
	plans, err := s.plans(ws)
	if err != nil {
		return err
	}
	verifying := map[string]bool{}
	for _, p := range plans {
		if p.routes != nil {
			maps.Copy(verifying, p.routes.verifying)
		}
	}
	s.cur.Store(&snapshot{ports: plans, ingress: ws.Ingress})
	s.transports.keepVerifying(verifying)
	for port, ps := range s.listening {
		if p, ok := plans[port]; !ok || p.tls != ps.tls {
			ps.ln.Close() // now, so that the port can be listened on again at once
			go s.drain(ps.srv)
			delete(s.listening, port)
		}
	}
	for _, port := range slices.Sorted(maps.Keys(plans)) {
		if _, ok := s.listening[port]; !ok {
			if err := s.listen(port, plans[port].tls); err != nil {
				return err
			}
		}
	}
	return nil
}

// listen opens a port, serving HTTPS (tls) or plain HTTP.
func (s *Server) listen(port int, tls bool) error {
	ln, err := s.cfg.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("listening on port %d: %w", port, err)
	}
	srv := s.newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.servePort(port, w, r) }))
	s.listening[port] = &portServer{srv: srv, ln: ln, tls: tls}
	what := fmt.Sprintf("HTTP %d", port)
	if tls {
		srv.TLSConfig = s.tlsConfig()
		what = fmt.Sprintf("HTTPS %d", port)
		go s.serve(what, func() error { return srv.ServeTLS(ln, "", "") })
		return nil
	}
	go s.serve(what, func() error { return srv.Serve(ln) })
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
	srv := s.newHTTPServer(http.HandlerFunc(s.serveFunnel))
	srv.TLSConfig = s.tlsConfig()
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

// servePort serves a request to a port with the routes current when it arrived.
func (s *Server) servePort(port int, w http.ResponseWriter, r *http.Request) {
	cur := s.cur.Load()
	s.cfg.Metrics.instrument(s.ingressLabel(cur), w, r, func(w http.ResponseWriter, r *http.Request) { s.servePlan(cur.ports[port], w, r) })
}

// serveFunnel serves a request from the internet with the routes of port 443.
func (s *Server) serveFunnel(w http.ResponseWriter, r *http.Request) {
	cur := s.cur.Load()
	plan := cur.ports[443]
	if plan != nil && !plan.tls {
		plan = nil
	}
	s.cfg.Metrics.instrument(s.ingressLabel(cur), w, r, func(w http.ResponseWriter, r *http.Request) { s.servePlan(plan, w, r) })
}

// ingressLabel names the web service in metrics: its Ingress, or its tailnet name when the
// operator did not say (an older one).
func (s *Server) ingressLabel(cur *snapshot) string {
	if cur.ingress != "" {
		return cur.ingress
	}
	return s.certs.nameServed()
}

func (s *Server) servePlan(plan *portPlan, w http.ResponseWriter, r *http.Request) {
	switch {
	case plan == nil: // the port is closing
		w.Header().Set("Server", ServerHeader)
		http.NotFound(w, r)
	case plan.redirect:
		// To the same host when it is a bring-your-own host, else to the tailnet name, whatever
		// name or IP the request came by. 308 keeps the method and body of requests other than
		// GET and HEAD, which clients turn into a GET on a 301.
		code := http.StatusMovedPermanently
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			code = http.StatusPermanentRedirect
		}
		w.Header().Set("Server", ServerHeader)
		http.Redirect(w, r, "https://"+s.certs.redirectHost(HostOf(r.Host))+r.URL.RequestURI(), code)
	default:
		plan.routes.ServeHTTP(w, r)
	}
}

func (s *Server) tlsConfig() *tls.Config { return &tls.Config{GetCertificate: s.certs.get} }

func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	// HTTP/2 over TLS by ALPN, and on plain ports by prior knowledge (h2c), which gRPC
	// clients of a plain HTTP listener speak.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:   h,
		Protocols: &protocols,
		// No read or write timeout: responses may stream and uploads may be long.
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// Failed handshakes (say, a client that does not trust the CA) are the client's business.
		ErrorLog: slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelDebug),
	}
}

func (s *Server) serve(what string, serve func() error) {
	// ErrServerClosed follows Shutdown; net.ErrClosed follows Apply closing a port's listener.
	if err := serve(); !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		select {
		case s.errs <- fmt.Errorf("%s listener: %w", what, err):
		default: // the errors not yet received restart the server already
		}
	}
}

// drainTimeout bounds how long a closed port waits for its requests.
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
	for _, ps := range s.listening {
		ps.srv.SetKeepAlivesEnabled(false)
	}
}

// Shutdown stops accepting connections and waits, until ctx ends, for requests in flight.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	for _, ps := range s.listening {
		errs = append(errs, ps.srv.Shutdown(ctx))
	}
	if s.funnel != nil {
		errs = append(errs, s.funnel.Shutdown(ctx))
	}
	s.transports.CloseIdleConnections()
	return errors.Join(errs...)
}
