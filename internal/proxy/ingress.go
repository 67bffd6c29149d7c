package proxy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/ipn/ipnstate"
	"tailscale.com/tsnet"
	"tailscale.com/util/mak"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/secretstore"
	"github.com/tsingress/tsingress/internal/proxy/web"
	"github.com/tsingress/tsingress/internal/version"
)

// ingress is a standalone L7 proxy. Its fields belong to the goroutine of runIngress's loop;
// other goroutines hand it closures over events.
type ingress struct {
	opts   Options
	log    *slog.Logger
	health *health
	rep    reporter
	web    *web.Server
	lc     *local.Client
	flow   acmeFlow

	cfg     configUpdate // the config being served
	status  nodeStatus   // the tailnet node as last seen
	applied bool         // the web service is listening

	acme       *acmeCert // the certificate of the tailnet name; nil while the tailnet offers none
	acmeStop   context.CancelFunc
	secrets    *secretWatches // of the bring-your-own certificates
	hosts      hostCerts      // as last given to the server
	hostsTimer *time.Timer
	events     chan func()

	node       *tsnet.Server
	fun        *funnel // taking Funnel connections for funnelName; nil while Funnel is off
	funnelName string
	funnelErr  string // why Funnel could not be set up, at the last attempt

	reported map[string][]byte // the state last written; nil after a failed write
}

func runIngress(ctx context.Context, opts Options, kube kubernetes.Interface, src configSource, hl *health, first configUpdate) error {
	cfg := first.cfg
	dir, store, rep, err := nodeStorage(ctx, opts, kube, cfg)
	if err != nil {
		return err
	}
	p := &ingress{opts: opts, log: opts.Logger, health: hl, rep: rep, cfg: first, events: make(chan func())}
	// The first write replaces whatever a previous Pod left; failing it means the proxy cannot
	// report at all (RBAC, say), which is worth stopping for.
	if err := p.sync(ctx); err != nil {
		return err
	}

	if err := useACMEDirectory(cfg.TLS.ACMEDirectoryURL); err != nil {
		return err
	}
	node := newNode(opts, cfg, dir, store)
	if err := node.Start(); err != nil {
		return err
	}
	defer node.Close()
	p.node = node
	if p.lc, err = node.LocalClient(); err != nil {
		return err
	}
	if err := nodeStarted(ctx, opts, cfg, p.lc); err != nil {
		return err
	}
	p.flow = newFlow(opts, p.lc, store, dir)
	p.web = web.NewServer(web.Config{Listen: node.Listen, WhoIs: p.lc.WhoIs, Logger: p.log, Metrics: opts.metrics.web})

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var secrets corev1client.SecretInterface
	if kube != nil {
		secrets = kube.CoreV1().Secrets(opts.Namespace)
	}
	p.secrets = newSecretWatches(secrets, p.send, p.log)
	p.secrets.want(wctx, byoNames(*cfg.Serve))
	updates := make(chan configUpdate)
	statuses := make(chan nodeStatus)
	go src.watch(wctx, first, updates)
	go watchNode(wctx, p.lc, p.log, statuses)
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			p.shutdown()
			return nil
		case u := <-updates:
			err = p.onConfig(wctx, u)
		case st := <-statuses:
			err = p.onStatus(wctx, st)
		case ev := <-p.events:
			ev()
		case err = <-p.web.Errors():
		case <-retry:
		}
		if err != nil {
			p.shutdown()
			return err
		}
		p.reconcileFunnel(wctx)
		p.judgeHosts(wctx)
		retry = nil
		if p.sync(ctx) != nil {
			retry = time.After(5 * time.Second)
		}
	}
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

// send hands ev to the loop, unless ctx ends first.
func (p *ingress) send(ctx context.Context, ev func()) {
	select {
	case p.events <- ev:
	case <-ctx.Done():
	}
}

// restartReason says why moving from old to cfg needs a new login, or "" if it does not.
func restartReason(old, cfg *contract.ProxyConfig, loggedIn bool) string {
	switch {
	case old.Kind != cfg.Kind:
		return fmt.Sprintf("kind changed from %s to %s", old.Kind, cfg.Kind)
	case old.Hostname != cfg.Hostname:
		return fmt.Sprintf("hostname changed from %q to %q", old.Hostname, cfg.Hostname)
	case old.ControlURL != cfg.ControlURL:
		return fmt.Sprintf("control URL changed from %q to %q", old.ControlURL, cfg.ControlURL)
	case !slices.Equal(sorted(old.Tags), sorted(cfg.Tags)):
		return fmt.Sprintf("tags changed from %v to %v", old.Tags, cfg.Tags)
	case old.StateSecret != cfg.StateSecret:
		return fmt.Sprintf("state Secret changed from %q to %q", old.StateSecret, cfg.StateSecret)
	case !loggedIn && cfg.AuthKey != "" && cfg.AuthKey != old.AuthKey:
		return "a new auth key arrived while the device is not logged in"
	case old.AcceptRoutes != cfg.AcceptRoutes:
		// Set once, as the node starts (nodeStarted).
		return fmt.Sprintf("acceptRoutes changed to %t", cfg.AcceptRoutes)
	}
	return ""
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func (p *ingress) onConfig(ctx context.Context, u configUpdate) error {
	if u.err != nil {
		p.log.Error("the changed config is not applied; serving the previous one", "err", u.err)
		return nil
	}
	if reason := restartReason(p.cfg.cfg, u.cfg, p.status.running); reason != "" {
		p.log.Info("restarting for a new login", "reason", reason)
		return fmt.Errorf("%w: %s", ErrRestartRequired, reason)
	}
	if err := useACMEDirectory(u.cfg.TLS.ACMEDirectoryURL); err != nil {
		return err
	}
	if p.applied {
		if err := p.web.Apply(*u.cfg.Serve); err != nil {
			return fmt.Errorf("serving the changed config: %w", err)
		}
	}
	p.cfg = u
	if p.acme != nil {
		p.acme.setHold(u.cfg.Serve.TLS.Hold)
	}
	p.secrets.want(ctx, byoNames(*u.cfg.Serve))
	p.log.Info("config applied", "config", u.cfg.String(), "version", u.version)
	return nil
}

func (p *ingress) onStatus(ctx context.Context, st nodeStatus) error {
	if p.status.running && !st.running {
		p.log.Warn("the device is no longer logged in to the tailnet (logged out or deleted)")
	}
	p.status = st
	if !st.running {
		return nil
	}
	if !p.applied {
		if err := p.web.Apply(*p.cfg.cfg.Serve); err != nil {
			return err
		}
		p.applied = true
		p.log.Info("logged in to the tailnet", "device", st.deviceID, "name", st.fqdn, "ips", st.ips)
	}
	if p.acme == nil || st.certDomain != p.acme.name {
		p.startACME(ctx, st.certDomain)
	}
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
	a.changed = func() { p.send(actx, func() {}) }
	a.setHold(p.cfg.cfg.Serve.TLS.Hold)
	p.acme, p.acmeStop = a, stop
	go a.run(actx)
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
	if p.hostsTimer != nil {
		p.hostsTimer.Stop()
	}
	if !hc.next.IsZero() {
		p.hostsTimer = time.AfterFunc(time.Until(hc.next), func() { p.send(ctx, func() {}) })
	}
}

// sync derives the state keys and readiness from what the loop knows, and writes the keys if
// they changed.
func (p *ingress) sync(ctx context.Context) error {
	st := p.status
	state := contract.ProxyState{
		PodUID:        p.opts.PodUID,
		ConfigVersion: p.cfg.version,
		ProxyVersion:  version.Version,
	}
	var waiting string // why the tailnet name has no certificate
	if st.running {
		state.DeviceID, state.FQDN, state.TailnetIPs = st.deviceID, st.fqdn, st.ips
		state.Certificates = maps.Clone(p.hosts.status)
		state.Funnel = p.funnelStatus()
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
	}
	// Readiness changes after the state is written, so that a ready proxy has reported it.
	switch {
	case !st.running:
		defer p.health.set("waiting for the tailnet login")
	case st.certDomain == "":
		defer p.health.set("no certificate name: HTTPS is not enabled for the tailnet")
	case state.HTTPSEndpoint == "":
		defer p.health.set("waiting for the certificate for " + st.certDomain + waiting)
	default:
		defer p.health.set("")
	}
	data, err := state.Data()
	if err != nil {
		return err
	}
	if p.reported != nil && maps.EqualFunc(data, p.reported, bytes.Equal) {
		return nil
	}
	if err := p.rep.Report(ctx, data); err != nil {
		p.reported = nil
		p.log.Error("writing the state keys failed", "err", err)
		return err
	}
	p.reported = data
	return nil
}

func (p *ingress) shutdown() {
	p.health.set("shutting down")
	if p.fun != nil {
		// First, so that the relays stop sending connections while requests drain.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p.fun.close(ctx)
		cancel()
	}
	if p.acmeStop != nil {
		p.acmeStop()
	}
	if p.hostsTimer != nil {
		p.hostsTimer.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.DrainTimeout)
	defer cancel()
	if err := p.web.Shutdown(ctx); err != nil {
		p.log.Warn("requests still in flight were cut off", "err", err)
	}
}

// nodeStatus is what the proxy reports about its tailnet node.
type nodeStatus struct {
	running    bool
	deviceID   string
	fqdn       string
	ips        []string
	certDomain string
	noFunnel   string // why the tailnet does not let the node use Funnel; "" if it does
}

func (a nodeStatus) equal(b nodeStatus) bool {
	return a.running == b.running && a.deviceID == b.deviceID && a.fqdn == b.fqdn &&
		a.certDomain == b.certDomain && slices.Equal(a.ips, b.ips) && a.noFunnel == b.noFunnel
}

func statusOf(st *ipnstate.Status) nodeStatus {
	ns := nodeStatus{running: st.BackendState == ipn.Running.String()}
	if !ns.running || st.Self == nil {
		return nodeStatus{}
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
				}
				select {
				case kick <- struct{}{}:
				default:
				}
			}
			w.Close()
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
		if ns := statusOf(st); first || !ns.equal(last) {
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
