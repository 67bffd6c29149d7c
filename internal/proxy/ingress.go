package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/ipn/ipnstate"
	"tailscale.com/tsnet"
	"tailscale.com/util/mak"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/secretstore"
	"github.com/tsingress/tsingress/internal/proxy/web"
)

// ingress is a standalone L7 proxy's unit: a web service on the node's tailnet name.
type ingress struct {
	*core
	web     *web.Server
	applied bool // the web service is listening

	acme     *acmeCert // the certificate of the tailnet name; nil while the tailnet offers none
	acmeStop context.CancelFunc
	hosts    hostCerts // as last given to the server
	judge    wakeTimer

	fun        *funnel // taking Funnel connections for funnelName; nil while Funnel is off
	funnelName string
	funnelErr  string // why Funnel could not be set up, at the last attempt
}

func newIngress(c *core, _ kubernetes.Interface) (unit, error) { return &ingress{core: c}, nil }

func (p *ingress) prepare(context.Context, *tsnet.Server) error { return nil }

func (p *ingress) start(ctx context.Context) error {
	p.web = web.NewServer(web.Config{Listen: p.node.Listen, WhoIs: p.lc.WhoIs, Logger: p.log, Metrics: p.opts.metrics.web})
	p.secrets.want(ctx, byoNames(*p.cfg.cfg.Serve))
	go func() {
		select {
		case err := <-p.web.Errors():
			p.send(ctx, func() error { return err })
		case <-ctx.Done():
		}
	}()
	return nil
}

// newFlow is where the proxy's tailnet names get their certificates: tailscaled's flow, or the
// options' stand-in.
func newFlow(opts Options, lc *local.Client, store ipn.StateStore, dir string) acmeFlow {
	if opts.CertSource != nil {
		return countingFlow{sourceFlow{opts.CertSource}, opts.metrics}
	}
	st, _ := store.(*secretstore.Store)
	return countingFlow{tailnetFlow{lc: lc, store: st, dir: dir}, opts.metrics}
}

// offersCert reports whether the tailnet lets the node get a certificate for name.
func offersCert(lc *local.Client, name string) func(context.Context) bool {
	return func(ctx context.Context) bool {
		st, err := lc.StatusWithoutPeers(ctx)
		return err == nil && slices.Contains(st.CertDomains, name)
	}
}

func (p *ingress) restartReason(_, _ *contract.ProxyConfig) string { return "" }

func (p *ingress) configure(ctx context.Context, cfg *contract.ProxyConfig) error {
	if p.applied {
		if err := p.web.Apply(*cfg.Serve); err != nil {
			return fmt.Errorf("serving the changed config: %w", err)
		}
	}
	if p.acme != nil {
		p.acme.setHold(cfg.Serve.TLS.Hold)
	}
	p.secrets.want(ctx, byoNames(*cfg.Serve))
	p.keepCert(ctx, cfg.Serve)
	return nil
}

// keepCert keeps the certificate of the tailnet name while a port serves HTTPS: a web service
// of plain HTTP ports alone (a Gateway's HTTP listeners) needs none, and waits for none.
func (p *ingress) keepCert(ctx context.Context, ws *contract.WebService) {
	if st := p.status; st.running && ws.ServesTLS() && (p.acme == nil || st.certDomain != p.acme.name) {
		p.startACME(ctx, st.certDomain)
	}
}

func (p *ingress) onStatus(ctx context.Context) error {
	st := p.status
	if !st.running {
		return nil
	}
	if !p.applied {
		if err := p.web.Apply(*p.cfg.cfg.Serve); err != nil {
			return err
		}
		p.applied = true
	}
	p.keepCert(ctx, p.cfg.cfg.Serve)
	return nil
}

// startACME starts keeping the certificate of the tailnet name, at once: issuing one takes a
// while, and the first client should not wait for it.
func (p *ingress) startACME(ctx context.Context, name string) {
	if p.acmeStop != nil {
		p.acmeStop()
		p.acme, p.acmeStop = nil, nil
	}
	p.web.SetName(name)
	if name == "" {
		p.log.Warn("the tailnet offers no certificate name: enable HTTPS (and MagicDNS) for the tailnet")
		return
	}
	actx, stop := context.WithCancel(ctx)
	a := newACMECert(name, "", p.flow, p.web, p.log)
	a.mayIssue = offersCert(p.lc, name)
	a.changed = func() { p.wake(actx) }
	a.setHold(p.cfg.cfg.Serve.TLS.Hold)
	p.acme, p.acmeStop = a, stop
	go a.run(actx)
}

func (p *ingress) reconcile(ctx context.Context) error {
	p.reconcileFunnel(ctx)
	p.judgeHosts(ctx)
	return nil
}

// reconcileFunnel serves the tailnet name to the internet too while the config asks for Funnel
// and the tailnet lets the node use it; it stops when either no longer holds.
func (p *ingress) reconcileFunnel(ctx context.Context) {
	name := p.status.certDomain
	want := p.applied && p.cfg.cfg.Serve.Funnel && name != "" && p.status.noFunnel == ""
	if p.fun != nil && (!want || name != p.funnelName) {
		p.web.SetFunnel(nil)
		p.fun.close(ctx)
		p.fun, p.funnelName = nil, ""
		p.log.Info("Funnel off", "name", name)
	}
	if !want {
		p.funnelErr = ""
		return
	}
	if p.fun == nil {
		f, err := openFunnel(p.node, p.lc, p.log)
		if err != nil {
			if msg := err.Error(); msg != p.funnelErr {
				p.log.Error("setting up Funnel failed; the name is served on the tailnet only", "name", name, "err", err)
				p.funnelErr = msg
			}
			return
		}
		p.fun, p.funnelName, p.funnelErr = f, name, ""
		p.web.SetFunnel(f.listen(name))
		p.log.Info("serving over Funnel too", "name", name)
	}
	if err := p.fun.allow(ctx); err != nil {
		p.funnelErr = err.Error()
		p.log.Error("allowing Funnel for the name failed", "name", name, "err", err)
		return
	}
	p.funnelErr = ""
}

// funnelStatus reports Funnel for the tailnet name, when the config asks for it.
func (p *ingress) funnelStatus() map[string]contract.FunnelStatus {
	name := p.status.certDomain
	if !p.cfg.cfg.Serve.Funnel || !p.status.running || name == "" {
		return nil
	}
	var fs contract.FunnelStatus
	switch {
	case p.status.noFunnel != "":
		fs = contract.FunnelStatus{Reason: contract.FunnelNotPermitted, Message: p.status.noFunnel}
	case p.funnelErr != "":
		fs = contract.FunnelStatus{Reason: contract.FunnelFailed, Message: p.funnelErr}
	case p.fun != nil && p.fun.allowed != nil:
		fs.Public = true
	default:
		return nil
	}
	return map[string]contract.FunnelStatus{name: fs}
}

// judgeHosts gives the server the bring-your-own certificates as they are now, and judges them
// again when one becomes valid or expires.
func (p *ingress) judgeHosts(ctx context.Context) {
	hc := judgeHosts(*p.cfg.cfg.Serve, p.secrets.state, time.Now())
	if !hc.sameCerts(p.hosts) {
		p.web.SetHostCertificates(hc.certs)
	}
	p.hosts = hc
	p.judge.at(ctx, p.core, hc.next)
}

// report adds the ports, the certificates, the HTTPS endpoint and Funnel. The proxy is ready
// once it serves HTTPS with the certificate of its name, or, when no port serves HTTPS, once it
// listens.
func (p *ingress) report(state *contract.ProxyState) string {
	st := p.status
	if !st.running {
		return ""
	}
	ws := p.cfg.cfg.Serve
	if p.applied {
		state.WebPorts = ws.ListenPorts()
	}
	var waiting string // why the tailnet name has no certificate
	state.Certificates = maps.Clone(p.hosts.status)
	state.Funnel = p.funnelStatus()
	if !ws.ServesTLS() {
		if !p.applied {
			return "not listening yet"
		}
		return ""
	}
	if p.acme != nil && p.acme.name == st.certDomain {
		served, cs := p.acme.state()
		if served {
			state.HTTPSEndpoint = st.certDomain
		} else if cs.Message != "" {
			waiting = ": " + cs.Message
		}
		if cs != (contract.CertificateStatus{}) {
			mak.Set(&state.Certificates, st.certDomain, cs)
		}
	}
	switch {
	case st.certDomain == "":
		return "no certificate name: HTTPS is not enabled for the tailnet"
	case state.HTTPSEndpoint == "":
		return "waiting for the certificate for " + st.certDomain + waiting
	}
	return ""
}

func (p *ingress) drain() {
	if p.fun != nil {
		// First, so that the relays stop sending connections while requests drain.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p.fun.close(ctx)
		cancel()
	}
	if p.acmeStop != nil {
		p.acmeStop()
	}
	p.judge.stop()
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.DrainTimeout)
	defer cancel()
	if err := p.web.Shutdown(ctx); err != nil {
		p.log.Warn("requests still in flight were cut off", "err", err)
	}
}

func (p *ingress) close() error { return nil }

// nodeStatus is what the proxy reports about its tailnet node.
type nodeStatus struct {
	running    bool
	deviceID   string
	fqdn       string
	ips        []string
	certDomain string
	noFunnel   string // why the tailnet does not let the node use Funnel; "" if it does
	// needsLogin: the node waits for an interactive login, which only a new auth key ends here.
	needsLogin bool
}

func (a nodeStatus) equal(b nodeStatus) bool {
	return a.running == b.running && a.needsLogin == b.needsLogin && a.deviceID == b.deviceID && a.fqdn == b.fqdn &&
		a.certDomain == b.certDomain && slices.Equal(a.ips, b.ips) && a.noFunnel == b.noFunnel
}

// statusOf reads the node's status. loginFailed says the control server refused a login since
// the node last ran: a node that needs a login waits for an interactive one once it has an
// AuthURL (Tailscale's answer to no key) or its key was refused, not while a key is in flight.
func statusOf(st *ipnstate.Status, loginFailed bool) nodeStatus {
	ns := nodeStatus{running: st.BackendState == ipn.Running.String()}
	if !ns.running || st.Self == nil {
		return nodeStatus{needsLogin: st.BackendState == ipn.NeedsLogin.String() && (st.AuthURL != "" || loginFailed)}
	}
	ns.deviceID = string(st.Self.ID)
	ns.fqdn = strings.TrimSuffix(st.Self.DNSName, ".")
	for _, ip := range st.TailscaleIPs {
		ns.ips = append(ns.ips, ip.String())
	}
	if len(st.CertDomains) > 0 {
		ns.certDomain = st.CertDomains[0]
	}
	ns.noFunnel = funnelAccess(st.Self)
	return ns
}

// statusPoll catches changes that raise no event of their own, such as HTTPS being enabled for
// the tailnet (a new certificate domain).
const statusPoll = 15 * time.Second

// watchNode sends the node's status whenever it changes.
func watchNode(ctx context.Context, lc *local.Client, log *slog.Logger, out chan<- nodeStatus) {
	kick := make(chan struct{}, 1)
	var failed atomic.Bool // an error since the node last ran: a refused login, while it is not running
	go func() {
		for ctx.Err() == nil {
			w, err := lc.WatchIPNBus(ctx, ipn.NotifyInitialState)
			if err != nil {
				sleep(ctx, time.Second)
				continue
			}
			for {
				n, err := w.Next()
				if err != nil {
					break
				}
				if n.ErrMessage != nil {
					log.Error("tailnet client error", "msg", *n.ErrMessage)
					failed.Store(true)
				}
				select {
				case kick <- struct{}{}:
				default:
				}
			}
			_ = w.Close()
			sleep(ctx, time.Second)
		}
	}()
	tick := time.NewTicker(statusPoll)
	defer tick.Stop()
	var last nodeStatus
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-tick.C:
		}
		st, err := lc.StatusWithoutPeers(ctx)
		if err != nil {
			continue
		}
		ns := statusOf(st, failed.Load())
		if ns.running {
			failed.Store(false)
		}
		if first || !ns.equal(last) {
			select {
			case out <- ns:
			case <-ctx.Done():
				return
			}
			last, first = ns, false
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}
