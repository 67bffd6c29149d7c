package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/ipn/store/mem"
	"tailscale.com/tailcfg"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/serviceconn"
	"github.com/tsingress/tsingress/internal/proxy/web"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
)

// target is one way to reach the backend: through our proxy, the original's Serve, a plain
// tsnet listener, or directly.
type target struct {
	name string
	base string // scheme://host, to which the scenario's path is appended
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// scenario is one kind of load.
type scenario struct {
	name      string
	path      string
	clients   int
	keepAlive bool
	bytes     bool // report MB/s rather than req/s
}

var scenarios = []scenario{
	{"small GET, keep-alive, 1 client", "/small", 1, true, false},
	{"small GET, keep-alive, 16 clients", "/small", 16, true, false},
	{"1 MiB GET, 1 client", "/1m", 1, true, true},
	{"small GET, new connection each", "/small", 1, false, false},
}

// sample is one timed run of a scenario against a target.
type sample struct {
	reqs, failed int
	bytes        int64
	dur          time.Duration
	p99          time.Duration
	cpu          time.Duration // the whole process's, client and every node included
}

func (s sample) rate() float64     { return float64(s.reqs) / s.dur.Seconds() }
func (s sample) mbPerSec() float64 { return float64(s.bytes) / 1e6 / s.dur.Seconds() }

// cpuPer is the process's CPU time per request, or per MB: steadier than the rates on a busy
// machine, where a path's rate is mostly the CPU it needs.
func (s sample) cpuPer(byBytes bool) string {
	if byBytes {
		return fmt.Sprintf("%.1f cpu-ms/MB", float64(s.cpu.Microseconds())/1e3/(float64(s.bytes)/1e6))
	}
	return fmt.Sprintf("%.0f cpu-µs/req", float64(s.cpu.Microseconds())/float64(s.reqs))
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err) // only for a bad who or address
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// quiet drops what servers log about clients cut off at the end of a sample.
var quiet = log.New(io.Discard, "", 0)

// dataPath is the tailnet, the backend and the four ways to it.
type dataPath struct {
	lt         *localtailnet.LocalTailnet
	backend    *http.Server
	nodes      []*tsnet.Server
	targets    []target
	scenarios  []scenario // what measure runs
	backendURL string     // the backend's
	ours       []*web.Server
	roots      *tls.Config
	dir        string // the nodes' state
}

func smallBackend() http.Handler {
	big := make([]byte, 1<<20)
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/1m", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1048576")
		_, _ = w.Write(big) // a client cut off at a sample's end
	})
	return mux
}

// startDataPath starts everything on loopback: a local tailnet with its ACME CA, a backend, a
// client node, and the nodes serving the backend.
func startDataPath(ctx context.Context) (*dataPath, error) {
	lt, err := localtailnet.Start(ctx, localtailnet.Options{ACME: true})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-datapath")
	if err != nil {
		return nil, err
	}
	d := &dataPath{lt: lt, scenarios: scenarios, dir: dir}
	var setenvErr error
	if err := lt.ACME.UseInProcess(func(k, v string) { setenvErr = errors.Join(setenvErr, os.Setenv(k, v)) }); err != nil {
		return nil, err
	}
	if setenvErr != nil {
		return nil, fmt.Errorf("the CA's environment: %w", setenvErr)
	}
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d.backend = &http.Server{Handler: smallBackend()}
	go func() {
		if err := d.backend.Serve(bln); !errors.Is(err, http.ErrServerClosed) {
			log.Printf("backend: %v", err)
		}
	}()
	backendURL := "http://" + bln.Addr().String()
	d.backendURL = backendURL

	// The client is a person's device, so that every path sets identity headers; ProxyGroup
	// replicas host Tailscale Services, which takes a tagged node.
	api, err := lt.APIClient(d.dir)
	if err != nil {
		return nil, err
	}
	userKey := func() string { return lt.MintUserKey("alice@example.com", "Alice Example").Reveal() }
	opsKey := func() string { return lt.MintUserKey("ops@example.com", "Ops").Reveal() }
	up := func(name, key string) (*tsnet.Server, error) {
		dir, err := os.MkdirTemp(d.dir, name)
		if err != nil {
			return nil, err
		}
		s := &tsnet.Server{Dir: dir, Hostname: name, ControlURL: lt.ControlURL, AuthKey: key, Ephemeral: true,
			Store: new(mem.Store), Logf: func(string, ...any) {}}
		uctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if _, err := s.Up(uctx); err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		d.nodes = append(d.nodes, s)
		return s, nil
	}
	client, err := up("laptop", userKey())
	if err != nil {
		return nil, err
	}
	d.roots = &tls.Config{RootCAs: lt.ACME.Roots()}

	// Ours: the proxy's web server on a tsnet node, as a standalone Ingress proxy runs it.
	oursNode, err := up("ours", opsKey())
	if err != nil {
		return nil, err
	}
	oursName, err := certName(oursNode)
	if err != nil {
		return nil, err
	}
	// With the request metrics, as a proxy counts its requests.
	if err := d.serveOurs(ctx, oursNode, oursName, oursNode.Listen, nil); err != nil {
		return nil, err
	}

	// The original's: tailscaled's own Serve, proxying the same backend.
	refNode, err := up("reference", opsKey())
	if err != nil {
		return nil, err
	}
	refName, err := certName(refNode)
	if err != nil {
		return nil, err
	}
	refLC, _ := refNode.LocalClient()
	if err := refLC.SetServeConfig(ctx, &ipn.ServeConfig{
		TCP: map[uint16]*ipn.TCPPortHandler{443: {HTTPS: true}},
		Web: map[ipn.HostPort]*ipn.WebServerConfig{ipn.HostPort(refName + ":443"): {
			Handlers: map[string]*ipn.HTTPHandler{"/": {Proxy: backendURL}}}},
	}); err != nil {
		return nil, fmt.Errorf("serve config: %w", err)
	}
	if _, err := nodeCert(ctx, refNode, refName); err != nil { // issued before the first sample
		return nil, err
	}

	// A plain tsnet listener: TLS and a bare reverse proxy, no routing, no identity.
	plainNode, err := up("plain", opsKey())
	if err != nil {
		return nil, err
	}
	plainName, err := certName(plainNode)
	if err != nil {
		return nil, err
	}
	plainCert, err := nodeCert(ctx, plainNode, plainName)
	if err != nil {
		return nil, err
	}
	pln, err := plainNode.Listen("tcp", ":443")
	if err != nil {
		return nil, err
	}
	bu, _ := url.Parse(backendURL)
	rp := httputil.NewSingleHostReverseProxy(bu)
	rp.ErrorLog = quiet
	// Serve returns when the node, closing, closes the listener.
	go func() {
		_ = (&http.Server{Handler: rp, ErrorLog: quiet}).Serve(
			tls.NewListener(pln, &tls.Config{Certificates: []tls.Certificate{*plainCert}}))
	}()

	// ProxyGroup replicas: each serves a Tailscale Service of its own, ours as a replica takes
	// its services' connections (package serviceconn), the original's through Serve.
	oursHA, err := d.replica(ctx, api, up, "ours-pg", func(node *tsnet.Server, lc *local.Client, name, fqdn string) error {
		conns := serviceconn.New(node, lc, slog.New(slog.DiscardHandler))
		listen := func(_, addr string) (net.Listener, error) {
			_, port, _ := net.SplitHostPort(addr)
			p, err := strconv.ParseUint(port, 10, 16)
			return conns.Listen(name, uint16(p)), err
		}
		return d.serveOurs(ctx, node, fqdn, listen, func() error { return conns.Sync(ctx) })
	})
	if err != nil {
		return nil, err
	}
	refHA, err := d.replica(ctx, api, up, "serve-pg", func(_ *tsnet.Server, lc *local.Client, name, fqdn string) error {
		svc := tailcfg.ServiceName(name)
		return lc.SetServeConfig(ctx, &ipn.ServeConfig{Services: map[tailcfg.ServiceName]*ipn.ServiceConfig{svc: {
			TCP: map[uint16]*ipn.TCPPortHandler{443: {HTTPS: true}},
			Web: map[ipn.HostPort]*ipn.WebServerConfig{ipn.HostPort(fqdn + ":443"): {
				Handlers: map[string]*ipn.HTTPHandler{"/": {Proxy: backendURL}}}},
		}}})
	})
	if err != nil {
		return nil, err
	}

	d.targets = []target{
		{"ours", "https://" + oursName, client.Dial},
		{"original (Serve)", "https://" + refName, client.Dial},
		{"plain tsnet", "https://" + plainName, client.Dial},
		{"direct loopback", backendURL, (&net.Dialer{}).DialContext},
		{"ours, ProxyGroup", "https://" + oursHA, client.Dial},
		{"original, ProxyGroup", "https://" + refHA, client.Dial},
	}
	// Warm every path: peers found, certificates fetched, handshakes done. A service is
	// reachable once the client has learned of its host, through control.
	for _, t := range d.targets {
		var err error
		for deadline := time.Now().Add(60 * time.Second); ; {
			if _, err = d.run(ctx, t, scenario{path: "/small", clients: 1, keepAlive: true}, 300*time.Millisecond); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if err != nil {
			return nil, fmt.Errorf("warming %s: %w", t.name, err)
		}
	}
	return d, nil
}

// serveOurs serves the backend through the proxy's web server under name, on the listeners of
// listen; then, if set, listening calls it.
func (d *dataPath) serveOurs(ctx context.Context, node *tsnet.Server, name string, listen func(network, addr string) (net.Listener, error), listening func() error) error {
	lc, err := node.LocalClient()
	if err != nil {
		return err
	}
	// With the request metrics, as a proxy counts its requests.
	srv := web.NewServer(web.Config{Listen: listen, WhoIs: lc.WhoIs, Logger: slog.New(slog.DiscardHandler),
		Metrics: web.NewMetrics(prometheus.NewRegistry())})
	d.ours = append(d.ours, srv)
	srv.SetName(name)
	cert, err := nodeCert(ctx, node, name)
	if err != nil {
		return err
	}
	srv.SetCertificate(cert)
	if err := srv.Apply(contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix,
		Backend: contract.Backend{URL: d.backendURL}}}}); err != nil {
		return err
	}
	if listening != nil {
		return listening()
	}
	return nil
}

// replica starts a tagged node that hosts a Tailscale Service of its own, set up by serve
// once the node advertises it (the tailnet offers a service's certificate only to its hosts),
// and returns the service's MagicDNS name.
func (d *dataPath) replica(ctx context.Context, api *tailnet.APIClient, up func(name, key string) (*tsnet.Server, error), host string,
	serve func(node *tsnet.Server, lc *local.Client, name, fqdn string) error) (string, error) {
	name := "svc:" + host
	if _, err := api.PutService(ctx, tailnet.Service{Name: name, Ports: []string{"tcp:443"}, Tags: []string{"tag:k8s"}}); err != nil {
		return "", err
	}
	key, err := api.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Description: host, Expiry: time.Hour})
	if err != nil {
		return "", err
	}
	node, err := up(host+"-0", key.Secret.Reveal()) // a replica's name, not the service's
	if err != nil {
		return "", err
	}
	lc, err := node.LocalClient()
	if err != nil {
		return "", err
	}
	if _, err := lc.EditPrefs(ctx, &ipn.MaskedPrefs{AdvertiseServicesSet: true, Prefs: ipn.Prefs{AdvertiseServices: []string{name}}}); err != nil {
		return "", err
	}
	st, err := lc.StatusWithoutPeers(ctx)
	if err != nil {
		return "", err
	}
	fqdn := host + "." + st.CurrentTailnet.MagicDNSSuffix
	// Once control has the advertisement, the name is among the node's certificate domains.
	for deadline := time.Now().Add(30 * time.Second); !slices.Contains(node.CertDomains(), fqdn); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s: %s never among its certificate domains", host, fqdn)
		}
	}
	if err := serve(node, lc, name, fqdn); err != nil {
		return "", fmt.Errorf("%s: %w", host, err)
	}
	if _, err := nodeCert(ctx, node, fqdn); err != nil { // issued before the first sample
		return "", err
	}
	return fqdn, nil
}

// close stops everything, logging what fails to.
func (d *dataPath) close() {
	var errs []error
	for _, srv := range d.ours {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		errs = append(errs, srv.Shutdown(ctx))
		cancel()
	}
	for _, n := range d.nodes {
		errs = append(errs, n.Close())
	}
	errs = append(errs, os.RemoveAll(d.dir))
	if d.backend != nil {
		errs = append(errs, d.backend.Close())
	}
	errs = append(errs, d.lt.Close())
	if err := errors.Join(errs...); err != nil {
		log.Printf("closing the data path: %v", err)
	}
}

func certName(n *tsnet.Server) (string, error) {
	for _, dom := range n.CertDomains() {
		return dom, nil
	}
	return "", fmt.Errorf("node %s has no cert domain", n.Hostname)
}

func nodeCert(ctx context.Context, n *tsnet.Server, name string) (*tls.Certificate, error) {
	lc, err := n.LocalClient()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	certPEM, keyPEM, err := lc.CertPair(cctx, name)
	if err != nil {
		return nil, fmt.Errorf("certificate of %s: %w", name, err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	return &c, err
}

// run loads t with sc for dur and returns what it measured. Requests are bounded by dur.
func (d *dataPath) run(ctx context.Context, t target, sc scenario, dur time.Duration) (sample, error) {
	rctx, cancel := context.WithTimeout(ctx, dur)
	defer cancel()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		bytes     atomic.Int64
		failed    atomic.Int64
		firstErr  error
		wg        sync.WaitGroup
	)
	start, cpu := time.Now(), processCPU()
	for range sc.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := &http.Transport{DialContext: t.dial, TLSClientConfig: d.roots.Clone(), MaxIdleConnsPerHost: 1,
				DisableKeepAlives: !sc.keepAlive, ForceAttemptHTTP2: false}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			var mine []time.Duration
			for rctx.Err() == nil {
				t0 := time.Now()
				req, _ := http.NewRequestWithContext(rctx, http.MethodGet, t.base+sc.path, nil)
				resp, err := c.Do(req)
				if err == nil {
					var n int64
					n, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
					bytes.Add(n)
				}
				if rctx.Err() != nil {
					break // cut off by the end of the sample: not counted
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	s := sample{reqs: len(latencies), failed: int(failed.Load()), bytes: bytes.Load(), dur: time.Since(start), cpu: processCPU() - cpu}
	if s.reqs == 0 {
		return s, cmpErr(firstErr, errors.New("no request succeeded"))
	}
	slices.Sort(latencies)
	s.p99 = latencies[(len(latencies)*99)/100]
	if s.failed > 0 {
		return s, fmt.Errorf("%d requests failed: %w", s.failed, firstErr)
	}
	return s, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// dataPathResult is the medians of a scenario's samples per target.
type dataPathResult struct {
	sc      scenario
	medians map[string]sample
}

// measureDataPath runs every scenario, interleaving the targets sample by sample so that they
// share whatever else the machine does at the time.
func (d *dataPath) measure(ctx context.Context, samples int, dur time.Duration, logf func(string, ...any)) ([]dataPathResult, error) {
	var out []dataPathResult
	for _, sc := range d.scenarios {
		all := map[string][]sample{}
		for i := range samples {
			order := slices.Clone(d.targets)
			if i%2 == 1 { // alternate who goes first
				slices.Reverse(order)
			}
			for _, t := range order {
				s, err := d.run(ctx, t, sc, dur)
				if err != nil {
					return nil, fmt.Errorf("%s, %s: %w", sc.name, t.name, err)
				}
				all[t.name] = append(all[t.name], s)
			}
		}
		r := dataPathResult{sc: sc, medians: map[string]sample{}}
		for name, ss := range all {
			r.medians[name] = median(ss, sc.bytes)
		}
		logf("%s: %s", sc.name, r.summary(d.targets))
		out = append(out, r)
	}
	return out, nil
}

// only keeps the targets whose names start with one of paths (comma-separated) and the
// scenarios whose names contain name; empty keeps all.
func (d *dataPath) only(paths, name string) {
	if paths != "" {
		d.targets = slices.DeleteFunc(d.targets, func(t target) bool {
			return !slices.ContainsFunc(strings.Split(paths, ","), func(p string) bool { return strings.HasPrefix(t.name, strings.TrimSpace(p)) })
		})
	}
	d.scenarios = slices.DeleteFunc(slices.Clone(scenarios), func(sc scenario) bool { return !strings.Contains(sc.name, name) })
}

// median picks the median sample by rate, with the median p99 of the samples.
func median(ss []sample, byBytes bool) sample {
	key := func(s sample) float64 {
		if byBytes {
			return s.mbPerSec()
		}
		return s.rate()
	}
	sorted := slices.Clone(ss)
	slices.SortFunc(sorted, func(a, b sample) int { return cmpFloat(key(a), key(b)) })
	m := sorted[len(sorted)/2]
	p99s := make([]time.Duration, len(ss))
	for i, s := range ss {
		p99s[i] = s.p99
	}
	slices.Sort(p99s)
	m.p99 = p99s[len(p99s)/2]
	return m
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (r dataPathResult) value(name string) string {
	s := r.medians[name]
	if r.sc.bytes {
		return fmt.Sprintf("%.0f MB/s", s.mbPerSec())
	}
	return fmt.Sprintf("%s req/s, p99 %s", thousands(s.rate()), ms(s.p99))
}

// ratio is ours ÷ the original's, standalone.
func (r dataPathResult) ratio() float64 { return r.ratioOf("ours", "original (Serve)") }

// ratioHA is ours ÷ the original's, on ProxyGroup replicas.
func (r dataPathResult) ratioHA() float64 {
	return r.ratioOf("ours, ProxyGroup", "original, ProxyGroup")
}

func (r dataPathResult) ratioOf(ours, original string) float64 {
	o, ref := r.medians[ours], r.medians[original]
	if r.sc.bytes {
		return o.mbPerSec() / ref.mbPerSec()
	}
	return o.rate() / ref.rate()
}

func (r dataPathResult) summary(ts []target) string {
	var parts []string
	for _, t := range ts {
		parts = append(parts, t.name+" "+r.value(t.name)+" ("+r.medians[t.name].cpuPer(r.sc.bytes)+")")
	}
	return strings.Join(parts, "; ") + fmt.Sprintf("; ratio %.2f×, ProxyGroup %.2f×", r.ratio(), r.ratioHA())
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}

func thousands(f float64) string {
	n := int64(f + 0.5)
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
