package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pires/go-proxyproto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"tailscale.com/client/tailscale/apitype"
	"tailscale.com/ipn"
	"tailscale.com/tailcfg"
	"tailscale.com/tsnet"
	"tailscale.com/util/mak"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/l3"
	"github.com/tsingress/tsingress/internal/proxy/serviceconn"
	"github.com/tsingress/tsingress/internal/proxy/web"
)

const (
	// defaultWithdrawWait is how long a replica that stopped advertising keeps serving at
	// shutdown: long enough for the control plane to tell clients, well within a Pod's grace.
	defaultWithdrawWait = 5 * time.Second
	// keepAliveCloseWait is how long a departing replica gives its clients to see their idle
	// connections close before it withdraws: a tailnet round trip, with room to spare.
	keepAliveCloseWait = 300 * time.Millisecond
	// serviceProxySettle is how long a replica waits after installing a DNAT mapping before it
	// advertises it. The cluster's service proxy may not yet route the ClusterIP of a Service
	// created a moment ago (kube-proxy syncs at most once a second by default), and a connection
	// whose first packet leaves the node before it does stays unrouted: the node's conntrack keeps
	// that first decision for the connection's life.
	serviceProxySettle = 2 * time.Second
	// webRetryDelay separates a failed L7 service's drain from its next attempt.
	webRetryDelay = 5 * time.Second
)

// replica is the unit of one replica of an ingress ProxyGroup: it serves the L7 services of the
// group's Serve config and DNATs the VIPs of its DNAT config, and advertises each Tailscale
// Service it is allowed to once it can serve it.
type replica struct {
	*core
	kube kubernetes.Interface
	l3   *dnat  // nil without a kernel data path
	noL3 string // why there is none

	serve  contract.ServeConfig // the last good documents of the group ConfigMap
	dnat   contract.DNATConfig
	up     bool     // tsnet's first Up is done: it clears advertisements, so none come before
	tunIPs []string // the node addresses given to the TUN; nil until given

	web      map[string]*webService
	conns    *serviceconn.Conns // the L7 services' and TCP relays' connections; nil until the first is set up
	relays   *relays            // the L3 services' ports relayed with PROXY protocol headers; nil until started
	portsErr wakeTimer          // tries the Serve config's service ports again after a failure
	draining map[string]bool    // L7 services whose previous server still drains
	judge    wakeTimer          // judges bring-your-own certificates again when one expires

	backendsOK map[string]bool // L7 services with a reachable backend, at the last check
	checking   bool            // a backend check is under way
	checkAgain bool            // asked for during one

	advertised []string // as the node's prefs say, sorted

	dnatSince map[string]time.Time // when each L3 service's mapping was last found installed
	settle    wakeTimer            // advertises a mapping once it has settled

	fun       *funnel // taking Funnel connections; nil while no service is served over Funnel
	funnelErr string  // why Funnel could not be set up, at the last attempt
}

// webService is one L7 service, from certificates to listeners on the service's name.
type webService struct {
	name, fqdn string
	role       contract.CertShareMode
	srv        *web.Server
	acme       *acmeCert            // the certificate of the service's name
	hosts      hostCerts            // as last given to the server
	applied    *contract.WebService // nil until it listens
	listeners  []net.Listener
	stop       context.CancelFunc // ends its certificate and error goroutines
	funnel     bool               // its server takes the name's Funnel connections
}

// NoL3Unprivileged is the error of every DNAT mapping of a replica started without a kernel
// data path: the operator restarts the group's replicas with one once an L3 Service is on it.
const NoL3Unprivileged = "this replica runs unprivileged, without a kernel data path (its group served no L3 Service when it started); the operator restarts it with one"

func newReplica(c *core, kube kubernetes.Interface) (unit, error) {
	if c.opts.GroupConfigMap == "" {
		return nil, errors.New("a proxygroup replica needs the name of its group ConfigMap (--group-configmap)")
	}
	if kube == nil {
		return nil, errors.New("a proxygroup replica reads its group ConfigMap through the Kubernetes API: run in a Pod, or set KUBECONFIG")
	}
	if c.opts.GroupWithdrawWait <= 0 {
		c.opts.GroupWithdrawWait = defaultWithdrawWait
	}
	c.keyAtLogin = true
	return &replica{core: c, kube: kube, web: map[string]*webService{}, draining: map[string]bool{}}, nil
}

// prepare sets up the kernel data path. Without one (no NET_ADMIN, say) the replica still
// serves L7, and reports every DNAT mapping as not installed.
func (r *replica) prepare(ctx context.Context, node *tsnet.Server) error {
	if r.opts.GroupL7Only {
		r.noL3 = NoL3Unprivileged
		r.log.Info("serving L7 only, without a kernel data path: the group served no L3 Service when this replica started")
		return nil
	}
	d, err := newDNAT(ctx, r.core)
	if err != nil {
		r.noL3 = "no kernel data path: " + err.Error()
		r.log.Error("L3 services will not be served", "err", err)
		return nil
	}
	r.l3 = d
	node.Tun = d.fwd.TUN()
	return nil
}

func (r *replica) start(ctx context.Context) error {
	docs := make(chan []map[string][]byte)
	go watchGroupDocs(ctx, r.kube, r.opts.Namespace, r.opts.GroupConfigMap, r.log, docs)
	checkInterval := r.opts.BackendCheckInterval
	if checkInterval <= 0 {
		checkInterval = defaultBackendCheckInterval
	}
	go func() {
		backendTicker := time.NewTicker(checkInterval)
		defer backendTicker.Stop()
		for {
			select {
			case data := <-docs:
				r.sendFunc(ctx, func() {
					r.onDocs(data)
					r.checkBackends(ctx)
				})
			case <-backendTicker.C:
				r.sendFunc(ctx, func() { r.checkBackends(ctx) })
			case <-ctx.Done():
				return
			}
		}
	}()
	if r.l3 != nil {
		r.l3.watch(ctx)
	}
	r.relays = newRelays(r.core, r.serviceConns)
	return nil
}

// serviceConns returns the connections of the node's services, set up on first use.
func (r *replica) serviceConns() *serviceconn.Conns {
	if r.conns == nil {
		r.conns = serviceconn.New(r.node, r.lc, r.log)
	}
	return r.conns
}

func (r *replica) restartReason(old, cfg *contract.ProxyConfig) string {
	if r.l3 == nil {
		return ""
	}
	return firewallRestart(old, cfg)
}

func (r *replica) configure(context.Context, *contract.ProxyConfig) error { return nil }

func (r *replica) onStatus(ctx context.Context) error {
	st := r.status
	if !st.running {
		return nil
	}
	if r.l3 != nil && !slices.Equal(st.ips, r.tunIPs) {
		var ips []netip.Addr
		for _, s := range st.ips {
			if ip, err := netip.ParseAddr(s); err == nil {
				ips = append(ips, ip)
			}
		}
		// A family the TUN cannot take fails alone; the status says which, and the mappings
		// that need it are not advertised. The next DNAT attempt tries it again.
		if err := r.l3.fwd.SetTailnetIPs(ips); err != nil {
			r.log.Error("giving the TUN device the node's addresses failed; L3 services of that family are not served", "err", err)
		}
		r.tunIPs = st.ips
	}
	if !r.up {
		// Running already, so this returns at once; ListenService would do it later and wipe
		// the advertisements made before.
		if _, err := r.node.Up(ctx); err != nil {
			return err
		}
		r.up = true
	}
	return nil
}

// onDocs takes the documents of the group's ConfigMaps (every shard). A document that cannot be
// read is reported and the last good one stays in force.
func (r *replica) onDocs(shards []map[string][]byte) {
	// The report is spread over as many Secrets as the documents: written again when that changes.
	if r.store != nil && r.store.SetReportShards(len(shards)) {
		r.reported = nil
	}
	docs := contract.MergeShards(shards)
	if docs.ServeErr != nil {
		r.opts.metrics.rejected(docServeConfig)
		r.log.Error("the group's Serve config is not applied; serving the last good one", "configmap", r.opts.GroupConfigMap, "err", docs.ServeErr)
	} else if !reflect.DeepEqual(*docs.Serve, r.serve) {
		r.serve = *docs.Serve
		r.opts.metrics.applied(docServeConfig)
		r.log.Info("Serve config applied", "services", len(docs.Serve.Services))
	}
	if docs.DNATErr != nil {
		r.opts.metrics.rejected(docDNATConfig)
		r.log.Error("the group's DNAT config is not applied; serving the last good one", "configmap", r.opts.GroupConfigMap, "err", docs.DNATErr)
	} else if !reflect.DeepEqual(*docs.DNAT, r.dnat) {
		r.dnat = *docs.DNAT
		r.opts.metrics.applied(docDNATConfig)
		r.log.Info("DNAT config applied", "services", len(docs.DNAT.Services))
	}
}

// shardData is one group ConfigMap's data, by shard.
type shardData struct {
	shard int
	data  map[string][]byte
}

// watchGroupDocs sends the data of every shard of the group's documents whenever one changes,
// once it has read each shard the first ConfigMap counts (contract.MergeShards).
func watchGroupDocs(ctx context.Context, kube kubernetes.Interface, namespace, main string, log *slog.Logger, out chan<- []map[string][]byte) {
	updates := make(chan shardData)
	watching := map[int]context.CancelFunc{}
	watch := func(i int) {
		wctx, cancel := context.WithCancel(ctx)
		watching[i] = cancel
		go watchConfigMap(wctx, kube, namespace, contract.ShardName(main, i), i, log, updates)
	}
	watch(0)
	count, latest := 1, map[int]map[string][]byte{}
	for {
		var u shardData
		select {
		case u = <-updates:
		case <-ctx.Done():
			return
		}
		if u.shard >= count && u.shard != 0 {
			continue // from a shard no longer counted
		}
		latest[u.shard] = u.data
		if u.shard == 0 {
			n, err := contract.ShardCount(u.data)
			if err != nil {
				log.Error("the group's documents are not applied: their shards cannot be counted; serving the last good ones", "configmap", main, "err", err)
				continue
			}
			count = n
			for i := 1; i < count; i++ {
				if watching[i] == nil {
					watch(i)
				}
			}
			for i, cancel := range watching {
				if i >= count {
					cancel()
					delete(watching, i)
					delete(latest, i)
				}
			}
		}
		shards := make([]map[string][]byte, count)
		complete := true
		for i := range shards {
			shards[i], complete = latest[i], complete && latest[i] != nil
		}
		if !complete {
			continue // until every shard is read: an entry may be moving between two
		}
		select {
		case out <- shards:
		case <-ctx.Done():
			return
		}
	}
}

// watchConfigMap sends a group ConfigMap's data whenever it changes. Like the config Secret,
// it is watched alone, by name, which is all the replica's Role allows.
func watchConfigMap(ctx context.Context, kube kubernetes.Interface, namespace, name string, shard int, log *slog.Logger, out chan<- shardData) {
	send := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		select {
		case out <- shardData{shard: shard, data: contract.ConfigMapBytes(cm.Data)}:
		case <-ctx.Done():
		}
	}
	lw := cache.NewFilteredListWatchFromClient(kube.CoreV1().RESTClient(), "configmaps", namespace,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.ConfigMap{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    send,
			UpdateFunc: func(_, obj any) { send(obj) },
			DeleteFunc: func(any) {
				log.Warn("the group ConfigMap was deleted; serving its last documents", "configmap", name)
			},
		},
	})
	informer.RunWithContext(ctx)
}

// allowed reports whether this replica may advertise a service: one its group's documents
// name (config v4 on), or one its config lists (older configs).
func (r *replica) allowed(name string) bool {
	if r.cfg.cfg.AdvertisesDocuments() {
		_, inServe := r.serve.Services[name]
		_, inDNAT := r.dnat.Services[name]
		return inServe || inDNAT
	}
	return slices.Contains(r.cfg.cfg.AdvertiseServices, name)
}

// mayAdvertise lists the services allowed.
func (r *replica) mayAdvertise() []string {
	if !r.cfg.cfg.AdvertisesDocuments() {
		return r.cfg.cfg.AdvertiseServices
	}
	names := slices.AppendSeq(slices.Collect(maps.Keys(r.serve.Services)), maps.Keys(r.dnat.Services))
	slices.Sort(names)
	return slices.Compact(names)
}

// fqdn is the MagicDNS name of a Tailscale Service: its label in the node's tailnet domain.
func (r *replica) fqdn(name string) string {
	_, domain, ok := strings.Cut(r.status.fqdn, ".")
	if !ok {
		return ""
	}
	return strings.TrimPrefix(name, "svc:") + "." + domain
}

// reconcile moves toward what the config and the documents ask for. Advertisements that no
// longer hold are withdrawn before anything stops serving, and new ones are made once the
// services can be served.
func (r *replica) reconcile(ctx context.Context) error {
	if !r.up {
		return nil
	}
	r.advertise(ctx)
	if mappings := dnatMappings(r.dnat); r.l3 != nil && r.l3.needed(mappings) {
		// A mapping that cannot be installed carries its error in the status, which keeps it
		// from being advertised until a later attempt succeeds.
		r.l3.install(ctx, mappings, nil) //nolint:errcheck // logged, and retried after backoff
	}
	if r.l3 != nil {
		// Before the Serve config is written: it names the TCP relays' ports.
		r.relays.sync(ctx, dnatMappings(r.dnat))
	}
	r.settle.at(ctx, r.core, r.noteInstalled(time.Now()))
	r.reconcileWeb(ctx)
	r.syncServicePorts(ctx)
	r.advertise(ctx)
	return nil
}

// syncServicePorts names the listened service ports in the node's Serve config; a service is
// advertised only once its ports are named there, or its clients' connections would be
// refused.
func (r *replica) syncServicePorts(ctx context.Context) {
	if r.conns == nil {
		return
	}
	var next time.Time
	if err := r.conns.Sync(ctx); err != nil {
		r.log.Error("naming the services' ports in the Serve config failed", "in", webRetryDelay, "err", err)
		next = time.Now().Add(webRetryDelay)
	}
	r.portsErr.at(ctx, r.core, next)
}

// noteInstalled records when each DNAT mapping was found installed, and returns when the next
// one settles (zero if none is pending).
func (r *replica) noteInstalled(now time.Time) time.Time {
	var fs contract.FirewallStatus
	if r.l3 != nil && r.tunIPs != nil {
		fs = r.l3.fwd.Status()
	}
	since := map[string]time.Time{}
	var next time.Time
	for name, m := range fs.Mappings {
		if m.Error != "" {
			continue
		}
		at, ok := r.dnatSince[name]
		if !ok {
			at = now
		}
		since[name] = at
		if due := at.Add(serviceProxySettle); due.After(now) && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	r.dnatSince = since
	return next
}

// dnatMappings are the forwarder's mappings of the group's DNAT document, by service name.
func dnatMappings(doc contract.DNATConfig) []l3.Mapping {
	var mappings []l3.Mapping
	for _, name := range slices.Sorted(maps.Keys(doc.Services)) {
		mappings = append(mappings, dnatMapping(name, doc.Services[name]))
	}
	return mappings
}

func dnatMapping(name string, svc contract.DNATService) l3.Mapping {
	m := l3.Mapping{Name: name, Destination: svc.Destination}
	for _, s := range svc.VIPs {
		m.TailnetIPs = append(m.TailnetIPs, netip.MustParseAddr(s)) // validated by the decoder
	}
	return m
}

func (r *replica) reconcileWeb(ctx context.Context) {
	for _, e := range r.web {
		if _, ok := r.serve.Services[e.name]; !ok || !r.allowed(e.name) || e.fqdn != r.fqdn(e.name) || e.role != r.role() {
			r.stopWeb(ctx, e, nil)
		}
	}
	var secrets []string
	for _, name := range slices.Sorted(maps.Keys(r.serve.Services)) {
		if r.allowed(name) && !r.draining[name] && r.fqdn(name) != "" {
			secrets = append(secrets, byoNames(r.serve.Services[name])...)
			if r.role() != "" {
				secrets = append(secrets, contract.GroupCertSecret(r.fqdn(name)))
			}
		}
	}
	r.secrets.want(ctx, secrets)
	now := time.Now()
	var next time.Time
	for _, name := range slices.Sorted(maps.Keys(r.serve.Services)) {
		ws := r.serve.Services[name]
		if !r.allowed(name) || r.draining[name] || r.fqdn(name) == "" {
			continue
		}
		e := r.web[name]
		if e == nil {
			e = r.startWeb(ctx, name)
		}
		e.acme.setHold(ws.TLS.Hold)
		if st, seen := r.secrets.state(contract.GroupCertSecret(e.fqdn)); seen && e.role != "" {
			e.acme.setShared(st.shared())
		}
		hc := judgeHosts(ws, r.secrets.state, now)
		if !hc.sameCerts(e.hosts) {
			e.srv.SetHostCertificates(hc.certs)
		}
		e.hosts = hc
		if !hc.next.IsZero() && (next.IsZero() || hc.next.Before(next)) {
			next = hc.next
		}
		if !e.certReady(&ws) || (e.applied != nil && reflect.DeepEqual(*e.applied, ws)) {
			continue
		}
		// The first Apply listens on the service's ports, which advertises it: only once it has
		// a certificate to serve, or must advertise to be given one.
		if err := e.srv.Apply(ws); err != nil {
			r.stopWeb(ctx, e, err)
			continue
		}
		if e.applied == nil {
			r.log.Info("serving", "service", name, "name", e.fqdn)
		}
		e.applied = &ws
	}
	r.judge.at(ctx, r.core, next)
	r.reconcileFunnel(ctx)
}

// reconcileFunnel serves to the internet too the services this replica serves whose config
// asks for Funnel, while the tailnet lets the node use Funnel. Tailscale's relays send a
// service's Funnel connections to its hosts, the replicas that advertise it.
func (r *replica) reconcileFunnel(ctx context.Context) {
	var want []string
	if r.status.noFunnel == "" && !r.closing {
		for _, e := range r.web {
			if e.applied != nil && e.applied.Funnel {
				want = append(want, e.fqdn)
			}
		}
	}
	slices.Sort(want)
	for _, e := range r.web {
		if e.funnel && !slices.Contains(want, e.fqdn) {
			e.srv.SetFunnel(nil)
			e.funnel = false
		}
	}
	if len(want) == 0 {
		if r.fun != nil {
			r.fun.close(ctx)
			r.fun = nil
			r.log.Info("Funnel off")
		}
		r.funnelErr = ""
		return
	}
	if r.fun == nil {
		f, err := openFunnelForward(r.lc, r.log)
		if err != nil {
			if msg := err.Error(); msg != r.funnelErr {
				r.log.Error("setting up Funnel failed; the services are served on the tailnet only", "err", err)
				r.funnelErr = msg
			}
			return
		}
		r.fun, r.funnelErr = f, ""
	}
	r.fun.only(want)
	for _, e := range r.web {
		if slices.Contains(want, e.fqdn) && !e.funnel {
			e.srv.SetFunnel(r.fun.listen(e.fqdn))
			e.funnel = true
			r.log.Info("serving over Funnel too", "service", e.name, "name", e.fqdn)
		}
	}
	if err := r.fun.allow(ctx); err != nil {
		r.funnelErr = err.Error()
		r.log.Error("allowing Funnel for the services failed", "err", err)
		return
	}
	r.funnelErr = ""
}

// funnelStatus reports Funnel for each service this replica may serve whose config asks for it.
func (r *replica) funnelStatus() map[string]contract.FunnelStatus {
	out := map[string]contract.FunnelStatus{}
	for name, ws := range r.serve.Services {
		fqdn := r.fqdn(name)
		if !ws.Funnel || !r.allowed(name) || fqdn == "" {
			continue
		}
		e := r.web[name]
		switch {
		case r.status.noFunnel != "":
			out[fqdn] = contract.FunnelStatus{Reason: contract.FunnelNotPermitted, Message: r.status.noFunnel}
		case r.funnelErr != "":
			out[fqdn] = contract.FunnelStatus{Reason: contract.FunnelFailed, Message: r.funnelErr}
		case e != nil && e.funnel && r.fun != nil && slices.Contains(r.fun.allowed, fmt.Sprintf("%s:%d", fqdn, funnelPort)):
			out[fqdn] = contract.FunnelStatus{Public: true}
		}
	}
	return out
}

// role is how this replica takes part in sharing certificates: issuer, reader, or "" when
// each replica gets its own.
func (r *replica) role() contract.CertShareMode { return r.cfg.cfg.TLS.CertShareMode }

// certReady reports whether the service ws may be served (listened on and advertised) as far
// as certificates go: with the certificate of its name, to obtain one (see acmeCert.ready),
// while issuance is held for the name with a bring-your-own certificate, or at once when no
// port of it serves HTTPS.
func (e *webService) certReady(ws *contract.WebService) bool {
	return !ws.ServesTLS() || e.acme.ready() || (e.acme.held() && e.hosts.serving())
}

// startWeb sets up an L7 service and starts keeping its certificate.
func (r *replica) startWeb(ctx context.Context, name string) *webService {
	e := &webService{name: name, fqdn: r.fqdn(name), role: r.role()}
	log := r.log.With("service", name)
	conns := r.serviceConns()
	// Asked about the service, so that the caller's app capabilities are those the policy
	// grants it on the service rather than on this replica.
	whois := func(ctx context.Context, remoteAddr string) (*apitype.WhoIsResponse, error) {
		return r.lc.WhoIsForService(ctx, remoteAddr, tailcfg.ServiceName(name))
	}
	e.srv = web.NewServer(web.Config{Listen: e.listen(conns), WhoIs: whois, Logger: log, Metrics: r.opts.metrics.web})
	e.srv.SetName(e.fqdn)
	ectx, stop := context.WithCancel(ctx)
	e.stop = stop
	r.web[name] = e
	e.acme = newACMECert(e.fqdn, e.role, r.flow, e.srv, log)
	e.acme.mayIssue = offersCert(r.lc, e.fqdn)
	e.acme.changed = func() { r.wake(ectx) }
	if e.role == contract.CertIssuer {
		// tailscaled reads and writes the name's certificate in the shared Secret (in Kubernetes);
		// publish covers it elsewhere.
		r.store.ShareCert(e.fqdn, contract.GroupCertSecret(e.fqdn))
		e.acme.publish = func(certPEM, keyPEM []byte) error { return r.store.WriteTLSCertAndKey(e.fqdn, certPEM, keyPEM) }
	}
	go e.acme.run(ectx)
	go func() {
		// Only a listener that stopped on its own: the server drops the closes it made itself
		// (Shutdown, and port 80 as its HTTP mode goes off).
		select {
		case err := <-e.srv.Errors():
			r.sendFunc(ectx, func() {
				if r.web[name] == e {
					r.stopWeb(ctx, e, err)
				}
			})
		case <-ectx.Done():
		}
	}()
	return e
}

// listen takes the service's connections on a port (see serviceconn.Conns); TLS stays ours, with
// the CertSource's certificate.
func (e *webService) listen(conns *serviceconn.Conns) func(network, addr string) (net.Listener, error) {
	return func(_, addr string) (net.Listener, error) {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return nil, err
		}
		ln := conns.Listen(e.name, uint16(port))
		e.listeners = append(e.listeners, ln)
		return ln, nil
	}
}

func requireHeader(proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
	return proxyproto.REQUIRE, nil
}

// stopWeb withdraws an L7 service, closes its listeners and drains its requests in the
// background; after a failure (cause) the next attempt waits a while.
func (r *replica) stopWeb(ctx context.Context, e *webService, cause error) {
	delete(r.web, e.name)
	r.advertise(ctx)
	e.stop()
	if e.role == contract.CertIssuer {
		r.store.UnshareCert(e.fqdn)
	}
	if cause != nil {
		r.log.Error("the service failed; it is withdrawn and set up again", "service", e.name, "in", webRetryDelay, "err", cause)
	} else if e.applied != nil {
		r.log.Info("no longer serving", "service", e.name)
	}
	// Here rather than in the drain: tsnet's serve config and advertisements take one change at
	// a time, and this goroutine makes all the others.
	e.closeListeners(r.log)
	r.syncServicePorts(ctx)
	r.draining[e.name] = true
	go func() {
		e.drain(r.opts.DrainTimeout, r.log)
		if cause != nil {
			sleep(ctx, webRetryDelay)
		}
		r.sendFunc(ctx, func() { delete(r.draining, e.name) })
	}()
}

func (e *webService) closeListeners(log *slog.Logger) {
	for _, sl := range e.listeners {
		if err := sl.Close(); err != nil {
			log.Warn("closing a service listener", "service", e.name, "err", err)
		}
	}
}

func (e *webService) drain(timeout time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		log.Warn("requests still in flight were cut off", "service", e.name, "err", err)
	}
}

// servable lists the services this replica may advertise and can serve now: L7 ones listening
// with their certificate and a reachable backend, L3 ones with their rules in place, both still
// asked for.
func (r *replica) servable() []string {
	var out []string
	if r.closing {
		return out
	}
	var fs contract.FirewallStatus
	if r.l3 != nil && r.tunIPs != nil {
		fs = r.l3.fwd.Status()
	}
	for _, name := range r.mayAdvertise() {
		e := r.web[name]
		ws, inServe := r.serve.Services[name]
		svc, inDNAT := r.dnat.Services[name]
		m, installed := fs.Mappings[name]
		web := inServe && e != nil && e.applied != nil && e.fqdn == r.fqdn(name) && e.certReady(&ws) && r.backendsOK[name] &&
			r.conns.Named(name)
		settled := !r.dnatSince[name].IsZero() && time.Since(r.dnatSince[name]) >= serviceProxySettle
		relayed := inDNAT && r.relays != nil && r.relays.ready(dnatMapping(name, svc)) == ""
		if web || (inDNAT && installed && m.Error == "" && settled && relayed) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// advertise makes the node advertise exactly the servable services.
func (r *replica) advertise(ctx context.Context) {
	prefs, err := r.lc.GetPrefs(ctx)
	if err != nil {
		r.log.Warn("reading the advertised services failed", "err", err)
		return
	}
	have := slices.Sorted(slices.Values(prefs.AdvertiseServices))
	want := r.servable()
	if !slices.Equal(have, want) {
		prefs, err = r.lc.EditPrefs(ctx, &ipn.MaskedPrefs{AdvertiseServicesSet: true, Prefs: ipn.Prefs{AdvertiseServices: want}})
		if err != nil {
			r.log.Error("changing the advertised services failed", "err", err)
		} else {
			have = slices.Sorted(slices.Values(prefs.AdvertiseServices))
		}
	}
	if !slices.Equal(have, r.advertised) {
		r.log.Info("advertising", "services", have)
	}
	r.advertised = have
}

// report adds the advertised services, the DNAT mappings, the certificates and Funnel. The
// replica is ready once it advertises every service it may that the documents name.
func (r *replica) report(state *contract.ProxyState) string {
	state.Advertised = r.advertised
	state.Firewall = r.firewallStatus()
	if !r.status.running {
		return ""
	}
	for _, e := range r.web {
		if _, cs := e.acme.state(); cs != (contract.CertificateStatus{}) {
			mak.Set(&state.Certificates, e.fqdn, cs)
		}
		for h, cs := range e.hosts.status {
			mak.Set(&state.Certificates, h, cs)
		}
	}
	state.Funnel = r.funnelStatus()
	var pending []string
	for _, name := range r.mayAdvertise() {
		_, inServe := r.serve.Services[name]
		_, inDNAT := r.dnat.Services[name]
		if (inServe || inDNAT) && !slices.Contains(r.advertised, name) {
			pending = append(pending, name)
		}
	}
	if len(pending) > 0 {
		return "not serving yet: " + strings.Join(pending, ", ")
	}
	return ""
}

// firewallStatus reports the DNAT mappings: as installed, or all failed without a kernel data
// path.
func (r *replica) firewallStatus() *contract.FirewallStatus {
	if r.l3 != nil {
		fs := r.l3.fwd.Status()
		fs.PodUID = r.opts.PodUID
		return &fs
	}
	if len(r.dnat.Services) == 0 {
		return nil
	}
	fs := &contract.FirewallStatus{PodUID: r.opts.PodUID, Mappings: map[string]contract.AppliedDNAT{}}
	for name, svc := range r.dnat.Services {
		fs.Mappings[name] = contract.AppliedDNAT{TailnetIPs: svc.VIPs, Error: r.noL3}
	}
	return fs
}

// drain withdraws every advertisement first and waits, so that clients move to other replicas
// while this one still serves; then it drains.
func (r *replica) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r.fun != nil {
		// With the advertisements: the relays send Funnel connections to the hosts that remain.
		r.fun.close(ctx)
		r.fun = nil
	}
	if r.lc != nil && len(r.advertised) > 0 {
		was := r.advertised
		// Kept-alive connections close while clients still route the services here: once a
		// client's route moves, it drops what this replica sends from the service's address, a
		// FIN included, and would send its next request into a connection no one serves.
		if len(r.web) > 0 {
			for _, e := range r.web {
				e.srv.StopKeepAlives()
			}
			time.Sleep(keepAliveCloseWait)
		}
		r.advertise(ctx)
		r.sync(ctx, r) //nolint:errcheck // logged; the operator then sees the Pod go
		r.log.Info("stopped advertising; serving on while clients move to other replicas", "services", was, "for", r.opts.GroupWithdrawWait)
		time.Sleep(r.opts.GroupWithdrawWait)
	}
	var wg sync.WaitGroup
	for _, e := range r.web {
		e.stop()
		e.closeListeners(r.log)
		wg.Go(func() { e.drain(r.opts.DrainTimeout, r.log) })
	}
	wg.Wait()
	r.log.Info("drained")
}

func (r *replica) close() error {
	if r.relays != nil {
		r.relays.close()
	}
	if r.l3 == nil {
		return nil
	}
	return r.l3.close()
}
