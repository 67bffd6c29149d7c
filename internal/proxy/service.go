package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/client-go/kubernetes"
	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/l3"
	"github.com/tsingress/tsingress/internal/proxy/secretstore"
	"github.com/tsingress/tsingress/internal/version"
)

// service is a standalone L3 proxy: the kernel DNATs the node's own tailnet addresses to the
// config's destination. Its fields belong to the goroutine of runService's loop.
type service struct {
	opts   Options
	log    *slog.Logger
	health *health
	rep    reporter
	fwd    *l3.Forwarder

	cfg    configUpdate // the config being served
	status nodeStatus   // the tailnet node as last seen

	// applied is what the forwarder was last given, so that only a change rewrites the rules.
	applied  *l3.Mapping
	applyErr error         // the last attempt's failure, retried after backoff
	backoff  time.Duration // until the next retry of a failed attempt
	attempts int           // failed attempts in a row

	reported map[string][]byte // the state last written; nil after a failed write
}

func runService(ctx context.Context, opts Options, kube kubernetes.Interface, src configSource, hl *health, first configUpdate) (err error) {
	cfg := first.cfg
	dir, store, rep, err := nodeStorage(ctx, opts, kube, cfg)
	if err != nil {
		return err
	}
	p := &service{opts: opts, log: opts.Logger, health: hl, rep: rep, cfg: first}
	// The first write replaces whatever a previous Pod left, before any rule exists.
	if err := p.sync(ctx); err != nil {
		return err
	}
	p.fwd, err = l3.New(ctx, l3.Options{
		NetNS:        opts.NetNS,
		FirewallMode: cfg.Firewall.Mode,
		Logf: func(format string, args ...any) {
			p.log.Info(fmt.Sprintf(format, args...), "component", "l3")
		},
	})
	if err != nil {
		return fmt.Errorf("setting up the L3 data path: %w", err)
	}
	node := newNode(opts, cfg, dir, store)
	node.Tun = p.fwd.TUN()
	defer func() { err = errors.Join(err, p.shutdown(node)) }()
	if err := node.Start(); err != nil {
		return err
	}
	lc, err := node.LocalClient()
	if err != nil {
		return err
	}
	if err := nodeStarted(ctx, opts, cfg, lc); err != nil {
		return err
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	updates := make(chan configUpdate)
	statuses := make(chan nodeStatus)
	go src.watch(wctx, first, updates)
	go watchNode(wctx, lc, p.log, statuses)
	var retry <-chan time.Time
	for {
		retrying := false
		select {
		case <-ctx.Done():
			return nil
		case u := <-updates:
			err = p.onConfig(u)
		case st := <-statuses:
			p.onStatus(st)
		case <-p.fwd.Changed(): // the rules changed on their own: a DNS answer moved
		case <-retry:
			retry, retrying = nil, true
		}
		if err != nil {
			return err
		}
		if p.apply(ctx, retrying) && p.applyErr != nil {
			retry = time.After(p.backoff)
		}
		if p.sync(ctx) != nil && retry == nil {
			retry = time.After(5 * time.Second)
		}
	}
}

// nodeStorage says where a proxy keeps its tailnet identity and reports its state: the state
// Secret with Kubernetes, else tsnet's own file and a state file in dir, the proxy's working
// directory.
func nodeStorage(ctx context.Context, opts Options, kube kubernetes.Interface, cfg *contract.ProxyConfig) (dir string, store ipn.StateStore, rep reporter, err error) {
	dir = filepath.Join(opts.StateDir, cfg.StateSecret)
	if opts.Namespace != "" {
		dir = filepath.Join(opts.StateDir, opts.Namespace+"."+cfg.StateSecret)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, nil, err
	}
	if kube == nil {
		return dir, nil, observingReporter{fileReporter{path: filepath.Join(dir, "proxy-state.json")}, opts.metrics}, nil
	}
	st, err := secretstore.New(ctx, kube.CoreV1().Secrets(opts.Namespace), cfg.StateSecret)
	if err != nil {
		return "", nil, nil, err
	}
	return dir, st, observingReporter{st, opts.metrics}, nil
}

// nodeStarted finishes setting up a started node as the config says: whether it accepts the
// subnet routes other nodes advertise (tailscale's --accept-routes, off by default on Linux),
// and its metrics.
func nodeStarted(ctx context.Context, opts Options, cfg *contract.ProxyConfig, lc *local.Client) error {
	if _, err := lc.EditPrefs(ctx, &ipn.MaskedPrefs{RouteAllSet: true, Prefs: ipn.Prefs{RouteAll: cfg.AcceptRoutes}}); err != nil {
		return fmt.Errorf("setting acceptRoutes: %w", err)
	}
	opts.metrics.setTailnet(lc)
	return nil
}

// newNode is the proxy's tailnet node as the config describes it.
func newNode(opts Options, cfg *contract.ProxyConfig, dir string, store ipn.StateStore) *tsnet.Server {
	logf := opts.TailnetLogf
	if logf == nil {
		logf = logger.Discard
	}
	return &tsnet.Server{
		Dir:           dir,
		Store:         store,
		Hostname:      cfg.Hostname,
		AuthKey:       cfg.AuthKey, // used only while the state holds no login
		ControlURL:    cfg.ControlURL,
		AdvertiseTags: cfg.Tags,
		Port:          opts.TailnetPort,
		Logf:          logf,
		UserLogf: func(format string, args ...any) {
			opts.Logger.Info(fmt.Sprintf(format, args...), "component", "tailnet")
		},
	}
}

func (p *service) onConfig(u configUpdate) error {
	if u.err != nil {
		p.log.Error("the changed config is not applied; serving the previous one", "err", u.err)
		return nil
	}
	if reason := restartReason(p.cfg.cfg, u.cfg, p.status.running); reason != "" {
		p.log.Info("restarting for a new login", "reason", reason)
		return fmt.Errorf("%w: %s", ErrRestartRequired, reason)
	}
	// The backend is chosen once, when the forwarder starts.
	if old, cur := firewallMode(p.cfg.cfg), firewallMode(u.cfg); old != cur {
		p.log.Info("restarting for another firewall mode", "from", old, "to", cur)
		return fmt.Errorf("%w: firewall mode changed from %s to %s", ErrRestartRequired, old, cur)
	}
	p.cfg = u
	p.log.Info("config applied", "config", u.cfg.String(), "version", u.version)
	return nil
}

func firewallMode(c *contract.ProxyConfig) contract.FirewallMode {
	if c.Firewall.Mode == "" {
		return contract.FirewallAuto
	}
	return c.Firewall.Mode
}

func (p *service) onStatus(st nodeStatus) {
	switch {
	case st.running && !p.status.running:
		p.log.Info("logged in to the tailnet", "device", st.deviceID, "name", st.fqdn, "ips", st.ips)
	case !st.running && p.status.running:
		// The rules stay: the device may come back, and they forward nothing meanwhile.
		p.log.Warn("the device is no longer logged in to the tailnet (logged out or deleted)")
	}
	p.status = st
}

// mapping is what the forwarder is to install: the node's addresses to the config's
// destination.
func (p *service) mapping() l3.Mapping {
	m := l3.Mapping{Name: contract.StandaloneMapping, Destination: *p.cfg.cfg.Forward}
	for _, s := range p.status.ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			m.TailnetIPs = append(m.TailnetIPs, ip)
		}
	}
	return m
}

// apply gives the forwarder the node's addresses and the destination when either changed, or
// when retrying a failed attempt. It reports whether it tried.
func (p *service) apply(ctx context.Context, retrying bool) bool {
	if !p.status.running {
		return false
	}
	want := p.mapping()
	if p.applied != nil && sameMapping(*p.applied, want) && (p.applyErr == nil || !retrying) {
		return false
	}
	// A family the TUN cannot take (IPv6 disabled, say) fails alone: the other is forwarded,
	// and SetMappings reports the failed one in the status and its error.
	var linkErr error
	if p.applied == nil || !slices.Equal(p.applied.TailnetIPs, want.TailnetIPs) {
		linkErr = p.fwd.SetTailnetIPs(want.TailnetIPs)
	}
	err := errors.Join(linkErr, p.fwd.SetMappings(ctx, []l3.Mapping{want}))
	// A mapping that failed is installed as far as it goes; the status carries its error.
	p.applied = &want
	m := p.fwd.Status().Mappings[contract.StandaloneMapping]
	if err != nil {
		p.failed(err, m)
		return true
	}
	if p.attempts > 0 {
		p.log.Info("the DNAT rules are in place after failed attempts", "attempts", p.attempts)
	}
	p.applyErr, p.attempts = nil, 0
	p.log.Info("forwarding", "tailnetIPs", m.TailnetIPs, "destinations", m.Destinations, "destination", want.Destination)
	return true
}

// maxDNATBackoff bounds the wait between attempts; a family that stays unusable (IPv6 disabled)
// is tried, and logged, that often.
const maxDNATBackoff = 5 * time.Minute

// failed records a failed attempt, logs it with what is forwarded all the same, and sets the
// wait before the next one.
func (p *service) failed(err error, m contract.AppliedDNAT) {
	p.attempts++
	if p.attempts == 1 {
		p.backoff = time.Second
	} else {
		p.backoff = min(2*p.backoff, maxDNATBackoff)
	}
	p.applyErr = err
	p.log.Error("installing the DNAT rules failed; retrying", "attempt", p.attempts, "retryIn", p.backoff,
		"forwarding", m.TailnetIPs, "err", err)
}

// sameMapping compares what two mappings install; Destination holds slices, so == cannot.
func sameMapping(a, b l3.Mapping) bool {
	return a.Name == b.Name && slices.Equal(a.TailnetIPs, b.TailnetIPs) && a.Destination.DNSName == b.Destination.DNSName &&
		slices.Equal(a.Destination.IPs, b.Destination.IPs)
}

// sync derives the state keys and readiness from what the loop knows, and writes the keys if
// they changed. Before the forwarder exists it reports an empty state.
func (p *service) sync(ctx context.Context) error {
	st := p.status
	state := contract.ProxyState{
		PodUID:        p.opts.PodUID,
		ConfigVersion: p.cfg.version,
		ProxyVersion:  version.Version,
	}
	ready := "starting"
	if p.fwd != nil {
		fs := p.fwd.Status()
		fs.PodUID = p.opts.PodUID
		state.Firewall = &fs
		ready = p.readiness(fs)
	}
	if st.running {
		state.DeviceID, state.FQDN, state.TailnetIPs = st.deviceID, st.fqdn, st.ips
	}
	// Readiness changes after the state is written, so that a ready proxy has reported it.
	defer p.health.set(ready)
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

// readiness says why the proxy does not forward yet, or "" once the node's addresses, of one
// family at least, are DNATed to the current destination: a family that cannot be forwarded is
// reported in the status, not by taking the Pod out of service.
func (p *service) readiness(fs contract.FirewallStatus) string {
	m, ok := fs.Mappings[contract.StandaloneMapping]
	switch {
	case !p.status.running:
		return "waiting for the tailnet login"
	case p.applied != nil && sameMapping(*p.applied, p.mapping()) && ok && len(m.TailnetIPs) > 0:
		return ""
	case p.applyErr != nil:
		return "installing the DNAT rules failed: " + p.applyErr.Error()
	case ok && m.Error != "":
		return "the DNAT rules are not in place: " + m.Error
	}
	return "installing the DNAT rules"
}

// shutdown stops the node first, since it uses the TUN until it stops, then removes the TUN and
// every rule.
func (p *service) shutdown(node *tsnet.Server) error {
	p.health.set("shutting down")
	node.Close()
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.DrainTimeout)
	defer cancel()
	if err := p.fwd.Close(ctx); err != nil {
		p.log.Error("removing the TUN device and DNAT rules failed", "err", err)
		return err
	}
	p.log.Info("removed the TUN device and DNAT rules")
	return nil
}
