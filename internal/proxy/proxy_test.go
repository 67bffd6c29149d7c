package proxy_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"tailscale.com/ipn/store/mem"
	"tailscale.com/net/netns"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localacme"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func TestMain(m *testing.M) {
	// In-process tailnet nodes run without privileges (no SO_MARK), as in tsnet's own tests.
	netns.SetEnabled(false)
	// tailscaled keeps certificates in a custom state store, through the proxy's Secret store,
	// only when it runs in Kubernetes, which it reads once from these variables: as in a proxy
	// Pod. The proxies here reach the apiserver through explicit configs, so they lead nowhere.
	os.Setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
	os.Setenv("KUBERNETES_SERVICE_PORT", "1")
	// Go loads the system roots once per process: have them trust the local CAs' API (one root
	// per process) before any test loads them, whichever tests run.
	ca, err := localacme.Start(context.Background(), localacme.Options{DNSServer: "127.0.0.1:1"})
	if err != nil {
		panic(err)
	}
	if err := ca.UseInProcess(func(k, v string) { os.Setenv(k, v) }); err != nil {
		panic(err)
	}
	ca.Close()
	os.Unsetenv("TS_DEBUG_ACME_DIRECTORY_URL")
	os.Exit(m.Run())
}

const ns = "tailscale"

// world is what a proxy runs in: a local tailnet with HTTPS names, a test CA standing in for
// the ACME flow, two backends on loopback standing in for ClusterIPs, and a client device.
type world struct {
	lt     *localtailnet.LocalTailnet
	api    *tailnet.APIClient
	ca     *proxytest.CA
	a, b   *backend
	client *tsnet.Server
	logs   *logBuffer
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldWith(t, localtailnet.Options{HTTPS: true})
}

func newWorldWith(t *testing.T, opts localtailnet.Options) *world {
	t.Helper()
	lt, api := localtailnettest.Start(t, opts)
	w := &world{lt: lt, api: api, ca: proxytest.NewCA(t), a: newBackend(t, "a"), b: newBackend(t, "b"), logs: &logBuffer{}}
	w.client = &tsnet.Server{
		Dir: t.TempDir(), ControlURL: lt.ControlURL, Hostname: "client", Store: new(mem.Store), Ephemeral: true,
		AuthKey: w.mintKey(t).Secret.Reveal(), Logf: logger.Discard, UserLogf: logger.Discard,
	}
	t.Cleanup(func() { w.client.Close() })
	if err := w.client.Start(); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *world) mintKey(t *testing.T) tailnet.AuthKey {
	t.Helper()
	k, err := w.api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (w *world) config(authKey string, ws contract.WebService) *contract.ProxyConfig {
	return &contract.ProxyConfig{
		Kind: contract.KindIngress, Hostname: "web", Tags: []string{"tag:k8s"}, ControlURL: w.lt.ControlURL,
		AuthKey: authKey, StateSecret: "web-0", Serve: &ws,
	}
}

func (w *world) routes(extra ...contract.Route) []contract.Route {
	return append([]contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: w.a.srv.URL}},
		{Path: "/metrics", PathType: contract.PathExact, Backend: contract.Backend{URL: w.b.srv.URL}},
		{Path: "/api", PathType: contract.PathPrefix, Backend: contract.Backend{URL: w.b.srv.URL}},
	}, extra...)
}

// start runs the proxy and returns its health address and the channel Run's result arrives on.
func (w *world) start(t *testing.T, ctx context.Context, opts proxy.Options) (string, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.HealthListener = ln
	opts.CertSource = w.ca
	opts.Logger = slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts.TailnetLogf = func(format string, args ...any) { fmt.Fprintf(w.logs, format+"\n", args...) }
	done := make(chan error, 1)
	go func() { done <- proxy.Run(ctx, opts) }()
	return "http://" + ln.Addr().String(), done
}

// startFromDir runs the proxy outside Kubernetes until ctx ends: config from the files in dir
// (proxytest.WriteConfig), changes picked up by polling, state in stateDir. It returns once the
// proxy is ready and the client sees web.tailnet.test.
func (w *world) startFromDir(t *testing.T, ctx context.Context, dir, stateDir string) (string, <-chan error) {
	t.Helper()
	health, done := w.start(t, ctx, proxy.Options{ConfigDir: dir, StateDir: stateDir, ConfigPollInterval: 50 * time.Millisecond})
	if _, err := w.client.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitReady(t, health, done)
	w.waitPeer(t, "web.tailnet.test")
	return health, done
}

// httpClient talks from the client device to the tailnet, trusting the test CA.
func (w *world) httpClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:       w.client.Dial,
			TLSClientConfig:   &tls.Config{RootCAs: w.ca.Pool()},
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

type response struct {
	status int
	body   string
	header http.Header
}

func (w *world) get(t *testing.T, url string, header http.Header) response {
	t.Helper()
	r, err := w.tryGet(t, url, header)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return r
}

func (w *world) tryGet(t *testing.T, url string, header http.Header) (response, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return response{}, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	res, err := w.httpClient().Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return response{res.StatusCode, string(body), res.Header}, err
}

// backend stands in for a Service's ClusterIP and records the requests it gets. A path ending
// in /slow waits for release.
type backend struct {
	name    string
	srv     *httptest.Server
	mu      sync.Mutex
	last    *http.Request
	arrived chan struct{}
	release chan struct{}
}

func newBackend(t *testing.T, name string) *backend {
	b := &backend{name: name, arrived: make(chan struct{}, 1), release: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		b.last = r.Clone(context.Background())
		b.mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/slow") {
			b.arrived <- struct{}{}
			<-b.release
		}
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) seen() *http.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

type logBuffer struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}

// eventually polls cond until it holds or 20 seconds pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.True(t, 20*time.Second, what, cond)
}

func waitReady(t *testing.T, health string, done <-chan error) {
	t.Helper()
	eventually(t, "the proxy to be ready", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		default:
		}
		res, err := http.Get(health + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
}

// waitPeer waits until the client's netmap holds fqdn: until then its dialer asks the host's
// resolver, which does not know tailnet names.
func (w *world) waitPeer(t *testing.T, fqdn string) {
	t.Helper()
	lc, err := w.client.LocalClient()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the client to know "+fqdn, func() bool {
		st, err := lc.Status(t.Context())
		if err != nil {
			return false
		}
		for _, p := range st.Peer {
			if strings.TrimSuffix(p.DNSName, ".") == fqdn {
				return true
			}
		}
		return false
	})
}

func waitDone(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

// The proxy in Kubernetes mode: config from a Secret in a real apiserver, identity and state in
// the same Secret, served over a real local tailnet to another device.
func TestRunFromSecret(t *testing.T) {
	env := proxytest.StartKube(t)
	w := newWorld(t)
	secrets := env.Client.CoreV1().Secrets(ns)
	key := w.mintKey(t)
	writeConfig := func(cfg *contract.ProxyConfig, create bool) {
		t.Helper()
		data, err := contract.ProxyConfigs.Encode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if create {
			env.Secret(t, ns, "web-0", data)
			return
		}
		sec, err := secrets.Get(t.Context(), "web-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range data {
			sec.Data[k] = v
		}
		if _, err := secrets.Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	readState := func() (*contract.ProxyState, map[string][]byte) {
		t.Helper()
		sec, err := secrets.Get(t.Context(), "web-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := contract.ParseState(sec.Data)
		if err != nil {
			t.Fatal(err)
		}
		return st, sec.Data
	}
	writeConfig(w.config(key.Secret.Reveal(), contract.WebService{HTTP: contract.HTTPRedirect, Routes: w.routes()}), true)
	// Stale keys of an earlier Pod, which the proxy must replace.
	stale := contract.ProxyState{PodUID: "old-pod", DeviceID: "nOLD", HTTPSEndpoint: "old.tailnet.test", Advertised: []string{"svc:old"}}
	staleData, _ := stale.Data()
	if _, err := secrets.Patch(t.Context(), "web-0", "application/merge-patch+json", mustJSON(t, map[string]any{"data": staleData}), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	testCtx := t.Context() // for the second Run, which outlives the subtest starting it
	// The proxy may do only what the operator's Role for it allows.
	opts := proxy.Options{ConfigSecret: "web-0", Kube: env.ProxyUser(t, ns, "web-0"), Namespace: ns, PodUID: "pod-1", StateDir: t.TempDir()}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	health, done := w.start(t, ctx, opts)
	if _, err := w.client.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitReady(t, health, done)
	const fqdn = "web.tailnet.test"
	w.waitPeer(t, fqdn)
	base := "https://" + fqdn

	var deviceID string
	t.Run("state", func(t *testing.T) {
		st, data := readState()
		devices, err := w.api.Devices(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(devices, func(d tailnet.Device) bool { return d.Hostname == "web" })
		if i < 0 {
			t.Fatalf("no device web in %+v", devices)
		}
		dev := devices[i]
		deviceID = dev.ID
		if st.DeviceID != dev.ID || st.FQDN != fqdn || st.HTTPSEndpoint != fqdn || st.PodUID != "pod-1" ||
			st.ConfigVersion != contract.ProxyConfigs.Newest() || st.ProxyVersion != "dev" || len(st.Advertised) != 0 {
			t.Errorf("state = %+v; device %+v", st, dev)
		}
		if cs := st.Certificates[fqdn]; cs.Source != contract.CertSourceACME || cs.Serial == "" || !cs.Valid(time.Now()) || len(st.Certificates) != 1 {
			t.Errorf("certificates = %+v", st.Certificates)
		}
		var ips []string
		for _, a := range dev.Addresses {
			ips = append(ips, a.String())
		}
		if !slices.Equal(sorted(st.TailnetIPs), sorted(ips)) {
			t.Errorf("device_ips = %v, the tailnet says %v", st.TailnetIPs, ips)
		}
		if len(data["ts._machinekey"]) == 0 {
			t.Errorf("the tailnet identity is not in the Secret: %v", keys(data))
		}
		if _, _, err := contract.ProxyConfigs.Decode(data); err != nil {
			t.Errorf("the config in the shared Secret was damaged: %v", err)
		}
	})

	t.Run("routes", func(t *testing.T) {
		for path, want := range map[string]string{
			"/metrics": "b /metrics", "/metrics/x": "a /metrics/x", "/api/v1": "b /api/v1", "/apix": "a /apix", "/": "a /",
		} {
			if r := w.get(t, base+path, nil); r.status != 200 || r.body != want {
				t.Errorf("%s: %d %q, want %q", path, r.status, r.body, want)
			}
		}
	})

	t.Run("headers", func(t *testing.T) {
		w.get(t, base+"/api/x", http.Header{"Tailscale-User-Login": {"mallory@example.com"}, "X-Forwarded-For": {"6.6.6.6"}})
		got := w.b.seen()
		clientIP, _ := w.client.TailscaleIPs()
		if got.Header.Get("X-Forwarded-For") != clientIP.String() || got.Header.Get("X-Forwarded-Proto") != "https" ||
			got.Header.Get("X-Forwarded-Host") != fqdn || got.Host != fqdn {
			t.Errorf("backend saw Host %q and %v", got.Host, got.Header)
		}
		// The client is a tagged device: it has no user to name, and its spoofed header is gone.
		for k := range got.Header {
			if strings.HasPrefix(k, "Tailscale-User-") {
				t.Errorf("backend saw %s: %q", k, got.Header.Get(k))
			}
		}
	})

	t.Run("redirect", func(t *testing.T) {
		r := w.get(t, "http://"+fqdn+"/api/x?y=1", nil)
		if r.status != http.StatusMovedPermanently || r.header.Get("Location") != base+"/api/x?y=1" {
			t.Errorf("port 80: %d to %q", r.status, r.header.Get("Location"))
		}
	})

	t.Run("reload", func(t *testing.T) {
		newRoute := contract.Route{Path: "/new", PathType: contract.PathExact, Backend: contract.Backend{URL: w.b.srv.URL}}
		writeConfig(w.config(key.Secret.Reveal(), contract.WebService{HTTP: contract.HTTPServe, Routes: w.routes(newRoute)}), false)
		eventually(t, "the new route", func() bool { return w.get(t, base+"/new", nil).body == "b /new" })
		if r := w.get(t, "http://"+fqdn+"/new", nil); r.status != 200 || r.body != "b /new" {
			t.Errorf("port 80 in serve mode: %d %q", r.status, r.body)
		}

		// A broken config is not applied: the proxy goes on serving the last good one.
		sec, _ := secrets.Get(t.Context(), "web-0", metav1.GetOptions{})
		sec.Data[contract.ProxyConfigs.Keys()[0]] = []byte(`{"version":1,"kind":"ingress"}`)
		if _, err := secrets.Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the broken config to be noticed", func() bool {
			return strings.Contains(w.logs.String(), "the changed config is not applied")
		})
		if r := w.get(t, base+"/new", nil); r.body != "b /new" {
			t.Errorf("after a broken config: %q", r.body)
		}
	})

	t.Run("graceful shutdown", func(t *testing.T) {
		result := make(chan response, 1)
		go func() {
			r, err := w.tryGet(t, base+"/api/slow", nil)
			if err != nil {
				r.body = err.Error()
			}
			result <- r
		}()
		select {
		case <-w.b.arrived:
		case <-time.After(20 * time.Second):
			t.Fatal("the slow request did not reach the backend")
		}
		cancel() // SIGTERM
		eventually(t, "readiness to drop", func() bool {
			res, err := http.Get(health + "/readyz")
			if err != nil {
				return true
			}
			res.Body.Close()
			return res.StatusCode != http.StatusOK
		})
		close(w.b.release)
		if r := <-result; r.status != 200 || r.body != "b /api/slow" {
			t.Errorf("the request in flight got %d %q", r.status, r.body)
		}
		if err := waitDone(t, done); err != nil {
			t.Errorf("Run after SIGTERM: %v", err)
		}
	})

	t.Run("restart keeps the device", func(t *testing.T) {
		// As the operator does once device_id is reported: no auth key any more. The key was
		// single-use, so logging in again would fail.
		writeConfig(w.config("", contract.WebService{HTTP: contract.HTTPRedirect, Routes: w.routes()}), false)
		opts.PodUID = "pod-2"
		health, done = w.start(t, testCtx, opts)
		waitReady(t, health, done)
		st, _ := readState()
		if st.DeviceID != deviceID || st.PodUID != "pod-2" || st.HTTPSEndpoint != fqdn {
			t.Errorf("after the restart: state %+v, want device %s", st, deviceID)
		}
		devices, _ := w.api.Devices(t.Context())
		if len(devices) != 2 {
			t.Errorf("the tailnet has %d devices, want the proxy and the client", len(devices))
		}
	})

	t.Run("login change restarts", func(t *testing.T) {
		cfg := w.config("", contract.WebService{Routes: w.routes()})
		cfg.Hostname = "renamed"
		writeConfig(cfg, false)
		err := waitDone(t, done)
		if !errors.Is(err, proxy.ErrRestartRequired) || !strings.Contains(err.Error(), "hostname") {
			t.Fatalf("Run returned %v, want ErrRestartRequired for the hostname", err)
		}
	})

	t.Run("no auth key in the logs", func(t *testing.T) {
		out := w.logs.String()
		for _, evidence := range []string{"logged in to the tailnet", "config applied", "restarting for a new login", "authKey=REDACTED"} {
			if !strings.Contains(out, evidence) {
				t.Errorf("the logs lack %q; is the capture working?\n%s", evidence, out)
			}
		}
		if strings.Contains(out, key.Secret.Reveal()) || strings.Contains(out, "tskey-auth-") {
			t.Error("the auth key appears in the logs")
		}
	})
}

// Outside Kubernetes: config from a directory, state in files, changes picked up by polling.
func TestRunFromDirectory(t *testing.T) {
	w := newWorld(t)
	dir, stateDir := t.TempDir(), t.TempDir()
	// Bring-your-own certificates are kept in Secrets: without the API, the proxy says so.
	own := contract.WebTLS{Certificates: []contract.CertificateRef{{SecretName: "app-tls", Hosts: []string{"app.example.com"}}}}
	proxytest.WriteConfig(t, dir, w.config(w.mintKey(t).Secret.Reveal(), contract.WebService{Routes: w.routes(), TLS: own}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, done := w.startFromDir(t, ctx, dir, stateDir)
	base := "https://web.tailnet.test"
	if r := w.get(t, base+"/metrics", nil); r.body != "b /metrics" {
		t.Errorf("/metrics: %q", r.body)
	}
	b, err := os.ReadFile(filepath.Join(stateDir, "web-0", "proxy-state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var state map[string]string
	if err := json.Unmarshal(b, &state); err != nil || state[contract.StateHTTPSEndpoint] != "web.tailnet.test" || state[contract.StateDeviceID] == "" {
		t.Errorf("state file: %s (%v)", b, err)
	}
	var certs map[string]contract.CertificateStatus
	if err := json.Unmarshal([]byte(state[contract.StateCertificates]), &certs); err != nil {
		t.Fatal(err)
	}
	if cs := certs["app.example.com"]; cs.Reason != contract.CertReasonSecretInvalid || !strings.Contains(cs.Message, "does not use the Kubernetes API") {
		t.Errorf("a bring-your-own certificate without the API: %+v", cs)
	}
	if cs := certs["web.tailnet.test"]; cs.Serial == "" {
		t.Errorf("the tailnet name: %+v", cs)
	}
	if r, err := w.tryGet(t, "http://web.tailnet.test/", nil); err == nil {
		t.Errorf("port 80 answers %d without an HTTP mode", r.status)
	}

	proxytest.WriteConfig(t, dir, w.config("", contract.WebService{TLS: own, Routes: w.routes(contract.Route{
		Path: "/new", PathType: contract.PathPrefix, Backend: contract.Backend{URL: w.b.srv.URL},
	})}))
	eventually(t, "the new route", func() bool { return w.get(t, base+"/new/x", nil).body == "b /new/x" })
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// A replica config without its group's ConfigMap fails clearly, before joining the tailnet.
func TestGroupNeedsConfigMap(t *testing.T) {
	dir := t.TempDir()
	data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{
		Kind: contract.KindProxyGroup, Hostname: "pg-0", StateSecret: "pg-0",
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	err = proxy.Run(t.Context(), proxy.Options{ConfigDir: dir, StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "needs the name of its group ConfigMap") {
		t.Errorf("Run = %v", err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
