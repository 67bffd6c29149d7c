package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/secretstore"
	"github.com/tsingress/tsingress/internal/version"
)

// A unit is what one kind of proxy serves on its node: an Ingress's web service, a Service's
// DNAT mapping, or a ProxyGroup replica's Tailscale Services. The core runs everything around
// it (storage, the node, the config and node-status watchers, the restart policy, the state
// report, readiness, retries and shutdown) and calls the unit at each step, from its loop
// goroutine.
type unit interface {
	// prepare readies what the node needs before it starts (an L3 data path's TUN device).
	prepare(ctx context.Context, node *tsnet.Server) error
	// start sets the unit up on the started node.
	start(ctx context.Context) error
	// restartReason says why moving from old to cfg needs a restart for the unit's sake.
	restartReason(old, cfg *contract.ProxyConfig) string
	// configure applies a changed config that needs no restart, before the core takes it.
	configure(ctx context.Context, cfg *contract.ProxyConfig) error
	// onStatus follows the node's status, which the core has just taken.
	onStatus(ctx context.Context) error
	// reconcile moves toward what the config and the node ask for, after every event.
	reconcile(ctx context.Context) error
	// report adds the unit's part to the state and, while the node is logged in, says why it
	// does not serve yet ("" once it does).
	report(st *contract.ProxyState) (notReady string)
	// drain stops serving: first what brings new clients, then the requests in flight.
	drain()
	// close releases what outlives the node (the TUN device and its rules), once it closed.
	close() error
}

// core is what every kind of proxy shares. Its fields belong to its loop goroutine; other
// goroutines hand it closures over events (send).
type core struct {
	opts    Options
	log     *slog.Logger
	health  *health
	rep     reporter
	node    *tsnet.Server
	lc      *local.Client
	store   *secretstore.Store // nil without the Kubernetes API
	flow    acmeFlow
	secrets *secretWatches // certificate Secrets
	events  chan func() error

	cfg      configUpdate // the config being served
	startKey string       // the auth key the node started with
	status   nodeStatus   // the tailnet node as last seen
	closing  bool
	// keyAtLogin: a new auth key is put to use only once the node asks for a login (ProxyGroup
	// replicas), not as soon as it arrives while the node is not logged in.
	keyAtLogin bool

	reported map[string][]byte // the state last written; nil after a failed write
}

// newUnit makes the unit of a kind of proxy around its core.
type newUnit func(c *core, kube kubernetes.Interface) (unit, error)

// syncRetry is the wait before writing the state keys again after a failed write.
const syncRetry = 5 * time.Second

// run runs a proxy of one kind from its first config until ctx ends (nil) or it must stop.
func run(ctx context.Context, opts Options, kube kubernetes.Interface, src configSource, hl *health, first configUpdate, mk newUnit) (err error) {
	c := &core{opts: opts, log: opts.Logger, health: hl, cfg: first, startKey: first.cfg.AuthKey, events: make(chan func() error)}
	u, err := mk(c, kube)
	if err != nil {
		return err
	}
	var (
		dir   string
		store ipn.StateStore
	)
	if err := untilDone(ctx, opts, hl, "reading the state", func(ctx context.Context) (err error) {
		dir, store, c.rep, err = nodeStorage(ctx, opts, kube, first.cfg)
		return err
	}); err != nil {
		return stoppedOr(ctx, err)
	}
	// The first write replaces whatever a previous Pod left (advertisements included), before
	// anything is served.
	if err := untilDone(ctx, opts, hl, "writing the state", func(ctx context.Context) error { return c.sync(ctx, u) }); err != nil {
		return stoppedOr(ctx, err)
	}
	if err := useACMEDirectory(first.cfg.TLS.ACMEDirectoryURL); err != nil {
		return err
	}
	c.node = newNode(opts, first.cfg, dir, store)
	if err := u.prepare(ctx, c.node); err != nil {
		return err
	}
	defer func() {
		_ = c.node.Close() // first: the node uses the TUN until it stops
		err = errors.Join(err, u.close())
	}()
	if err := c.node.Start(); err != nil {
		return err
	}
	if c.lc, err = c.node.LocalClient(); err != nil {
		return err
	}
	if err := nodeStarted(ctx, opts, first.cfg, c.lc); err != nil {
		return err
	}
	c.flow = newFlow(opts, c.lc, store, dir)
	c.store, _ = store.(*secretstore.Store)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var secrets corev1client.SecretInterface
	if kube != nil {
		secrets = kube.CoreV1().Secrets(opts.Namespace)
	}
	c.secrets = newSecretWatches(secrets, c.sendFunc, c.log)
	if err := u.start(wctx); err != nil {
		return err
	}
	updates := make(chan configUpdate)
	statuses := make(chan nodeStatus)
	go src.watch(wctx, first, updates)
	go watchNode(wctx, c.lc, c.log, statuses)
	var retry, loginCheck <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			c.shutdown(u)
			return nil
		case up := <-updates:
			err = c.takeConfig(wctx, u, up)
		case st := <-statuses:
			err = c.takeStatus(wctx, u, st)
		case ev := <-c.events:
			err = ev()
		case <-retry:
		case <-loginCheck:
		}
		if err == nil && c.needsNewLogin(wctx) {
			err = c.restart("a new auth key arrived and the device needs a login")
		}
		if err == nil {
			err = u.reconcile(wctx)
		}
		if err != nil {
			c.shutdown(u)
			return err
		}
		loginCheck = nil
		if c.keyAtLogin && keyPending(c.cfg.cfg, c.startKey, c.status.running) {
			loginCheck = time.After(time.Second)
		}
		retry = nil
		if c.sync(ctx, u) != nil {
			retry = time.After(syncRetry)
		}
	}
}

// stoppedOr is nil when ctx ended (a stop before the proxy started is no failure), else err.
func stoppedOr(ctx context.Context, err error) error {
	select {
	case <-ctx.Done():
		return nil
	default:
		return err
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
		Logf:          withholdLoginURLs(logf),
		UserLogf: withholdLoginURLs(func(format string, args ...any) {
			opts.Logger.Info(fmt.Sprintf(format, args...), "component", "tailnet")
		}),
	}
}

// send hands ev to the loop, unless ctx ends first.
func (c *core) send(ctx context.Context, ev func() error) {
	select {
	case c.events <- ev:
	case <-ctx.Done():
	}
}

// sendFunc hands ev, which cannot fail, to the loop.
func (c *core) sendFunc(ctx context.Context, ev func()) {
	c.send(ctx, func() error { ev(); return nil })
}

// wake makes the loop reconcile and report again.
func (c *core) wake(ctx context.Context) { c.send(ctx, func() error { return nil }) }

func (c *core) restart(reason string) error {
	c.log.Info("restarting for a new login", "reason", reason)
	return fmt.Errorf("%w: %s", ErrRestartRequired, reason)
}

func (c *core) takeConfig(ctx context.Context, u unit, up configUpdate) error {
	if up.err != nil {
		c.log.Error("the changed config is not applied; serving the previous one", "err", up.err)
		return nil //nolint:nilerr // a bad change is logged; the proxy goes on with the config it has
	}
	// With keyAtLogin a new auth key is judged by needsNewLogin instead.
	if reason := restartReason(c.cfg.cfg, up.cfg, c.status.running || c.keyAtLogin); reason != "" {
		return c.restart(reason)
	}
	if reason := u.restartReason(c.cfg.cfg, up.cfg); reason != "" {
		c.log.Info("restarting", "reason", reason)
		return fmt.Errorf("%w: %s", ErrRestartRequired, reason)
	}
	if err := useACMEDirectory(up.cfg.TLS.ACMEDirectoryURL); err != nil {
		return err
	}
	if err := u.configure(ctx, up.cfg); err != nil {
		return err
	}
	c.cfg = up
	c.log.Info("config applied", "config", up.cfg.String(), "version", up.version, "advertiseServices", up.cfg.AdvertiseServices)
	return nil
}

func (c *core) takeStatus(ctx context.Context, u unit, st nodeStatus) error {
	switch {
	case st.running && !c.status.running:
		c.log.Info("logged in to the tailnet", "device", st.deviceID, "name", st.fqdn, "ips", st.ips)
	case !st.running && c.status.running:
		c.log.Warn("the device is no longer logged in to the tailnet (logged out or deleted)")
	}
	if st.needsLogin && !c.status.needsLogin {
		c.log.Warn("the tailnet client waits for an interactive login (its URL is not logged): the config holds no usable auth key")
	}
	c.status = st
	return u.onStatus(ctx)
}

// restartReason says why moving from old to cfg needs a new login, or "" if it does not. A new
// auth key needs one only while the device is not logged in.
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

// keyPending says whether cfg holds an auth key the node did not start with, while the node is
// not logged in.
func keyPending(cfg *contract.ProxyConfig, startKey string, running bool) bool {
	return !running && cfg.AuthKey != "" && cfg.AuthKey != startKey
}

// needsNewLogin says whether a pending auth key must be put to use, by a restart: only once the
// node says it needs a login. The operator mints a key whenever a replica's state shows no
// device, as it does while a restarted replica logs in again with the identity in its state.
func (c *core) needsNewLogin(ctx context.Context) bool {
	if !c.keyAtLogin || !keyPending(c.cfg.cfg, c.startKey, c.status.running) {
		return false
	}
	st, err := c.lc.StatusWithoutPeers(ctx)
	return err == nil && st.BackendState == ipn.NeedsLogin.String()
}

// sync derives the state keys and readiness from what the loop knows, and writes the keys if
// they changed.
func (c *core) sync(ctx context.Context, u unit) error {
	st := c.status
	state := contract.ProxyState{
		PodUID:        c.opts.PodUID,
		ConfigVersion: c.cfg.version,
		ProxyVersion:  version.Version,
	}
	if st.running {
		state.DeviceID, state.FQDN, state.TailnetIPs = st.deviceID, st.fqdn, st.ips
	}
	notReady := u.report(&state)
	switch {
	case st.needsLogin:
		state.Login = contract.LoginNeeded
		notReady = "waiting for an interactive login: no usable auth key"
	case !st.running:
		notReady = "waiting for the tailnet login"
	}
	// Readiness changes after the state is written, so that a ready proxy has reported it.
	defer func() {
		if !c.closing {
			c.health.set(notReady)
		}
	}()
	data, err := state.Data()
	if err != nil {
		return err
	}
	if c.reported != nil && maps.EqualFunc(data, c.reported, bytes.Equal) {
		return nil
	}
	if err := c.rep.Report(ctx, data); err != nil {
		c.reported = nil
		c.log.Error("writing the state keys failed", "err", err)
		return err
	}
	c.reported = data
	return nil
}

// shutdown stops serving, as the unit says; the node and what outlives it close after.
func (c *core) shutdown(u unit) {
	c.closing = true
	c.health.set("shutting down")
	u.drain()
}

// wakeTimer wakes the loop at a set time: to judge bring-your-own certificates again when one
// becomes valid or expires, or to advertise what has settled.
type wakeTimer struct{ t *time.Timer }

// at sets the next wake; a zero next means none.
func (h *wakeTimer) at(ctx context.Context, c *core, next time.Time) {
	h.stop()
	if !next.IsZero() {
		h.t = time.AfterFunc(time.Until(next), func() { c.wake(ctx) })
	}
}

func (h *wakeTimer) stop() {
	if h.t != nil {
		h.t.Stop()
	}
}
