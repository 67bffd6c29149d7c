// Package headscale tests that tailnet nodes, and the project's proxy in particular, join
// Headscale (github.com/juanfont/headscale), a control server written independently of Tailscale
// and of this project, and talk to each other through it. The binary comes from HEADSCALE_BIN
// (`make headscale`).
package headscale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"tailscale.com/ipn/ipnstate"
	"tailscale.com/net/netns"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func TestMain(m *testing.M) {
	// In-process nodes run unprivileged (no SO_MARK), as in tsnet's own tests.
	netns.SetEnabled(false)
	dir, err := os.MkdirTemp("", "headscale-ca-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var caFile string
	if ca, caFile, err = newCA(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Before anything loads the system roots: the clients must trust Headscale's certificate.
	os.Setenv("SSL_CERT_FILE", caFile)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// A plain tsnet node and the proxy (proxy.Run, kind ingress, config from a directory) join
// Headscale with pre-auth keys minted by its CLI; the node reaches a backend on loopback through
// the proxy over the tailnet, by MagicDNS name and by address.
func TestProxyJoinsHeadscale(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	u := e.hs.createUser(t, "dev", "dev@example.com", "Dev Eloper")
	client, st := e.join(t, "client", e.hs.createKey(t, u.ID))
	if st.Self.DNSName != "client."+baseDomain+"." {
		t.Errorf("plain node's MagicDNS name = %q", st.Self.DNSName)
	}
	if len(st.CertDomains) != 0 {
		t.Errorf("Headscale offered certificate domains %v; the README says it issues none", st.CertDomains)
	}
	clientIPs := addrStrings(st.TailscaleIPs)

	// The proxy's config as the operator writes it, tags included; an administrator mints the
	// key, tagged so that Headscale grants the tag without a policy.
	key := e.hs.createKey(t, u.ID, "--tags", "tag:k8s")
	p := e.startProxy(t, &contract.ProxyConfig{
		Kind: contract.KindIngress, Hostname: "web", Tags: []string{"tag:k8s"}, ControlURL: e.hs.URL,
		AuthKey: key, StateSecret: "web-0", Serve: e.serve(),
	})
	const fqdn = "web." + baseDomain
	if p.state.FQDN != fqdn || len(p.state.TailnetIPs) == 0 {
		t.Fatalf("proxy state = %+v, want name %s and tailnet IPs", p.state, fqdn)
	}
	if p.state.HTTPSEndpoint != "" {
		t.Errorf("the proxy reports HTTPS at %q, but Headscale issues no certificates", p.state.HTTPSEndpoint)
	}

	t.Run("headscale lists both nodes", func(t *testing.T) {
		byName := map[string]node{}
		for _, n := range e.hs.nodes(t) {
			byName[n.GivenName] = n
		}
		for name, ips := range map[string][]string{"client": clientIPs, "web": p.state.TailnetIPs} {
			n, ok := byName[name]
			switch {
			case !ok:
				t.Errorf("headscale does not list %s; it lists %v", name, keysOf(byName))
			case !n.Online || n.User.ID != u.ID:
				t.Errorf("%s: online=%v user=%d, want online and user %d", name, n.Online, n.User.ID, u.ID)
			case !slices.Equal(sorted(n.IPAddresses), sorted(ips)):
				t.Errorf("%s: headscale says %v, the node says %v", name, n.IPAddresses, ips)
			}
		}
		if web := byName["web"]; !slices.Equal(web.ForcedTags, []string{"tag:k8s"}) {
			t.Errorf("web: forced tags %v, want [tag:k8s] from the key", web.ForcedTags)
		}
	})

	t.Run("peers see the proxy tagged", func(t *testing.T) {
		if tags := e.peerTags(t, client, p.state.TailnetIPs[0]); !slices.Equal(tags, []string{"tag:k8s"}) {
			t.Errorf("the client sees the proxy with tags %v, want [tag:k8s]", tags)
		}
	})

	for _, host := range []string{fqdn, p.state.TailnetIPs[0]} {
		t.Run("http via "+host, func(t *testing.T) {
			got := e.get(t, client, "http://"+host+"/hello?x=1")
			if got.Path != "/hello" || got.Host != host {
				t.Errorf("the backend saw path %q host %q", got.Path, got.Host)
			}
			// Proof the request crossed the tailnet: the caller is the client's tailnet address,
			// and Headscale's user record reached the proxy through WhoIs.
			if !slices.Contains(clientIPs, got.ForwardedFor) {
				t.Errorf("X-Forwarded-For = %q, want one of the client's tailnet IPs %v", got.ForwardedFor, clientIPs)
			}
			if got.UserLogin != u.Email || got.UserName != "Dev Eloper" {
				t.Errorf("identity headers: login %q name %q, want %q and %q", got.UserLogin, got.UserName, u.Email, "Dev Eloper")
			}
		})
	}

	t.Run("not ready without a certificate", func(t *testing.T) {
		res, err := http.Get(p.health + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "certificate") {
			t.Errorf("/readyz = %d %q, want 503 waiting for a certificate", res.StatusCode, body)
		}
	})

	t.Run("no Tailscale API", func(t *testing.T) {
		// The operator's control-plane client, pointed at Headscale as it would be with only
		// --control-url set: Headscale serves no Tailscale API v2, so no key can be minted.
		dir := t.TempDir()
		id, secret := filepath.Join(dir, "id"), filepath.Join(dir, "secret")
		for _, f := range []string{id, secret} {
			if err := os.WriteFile(f, []byte("made-up"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		api, err := tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: e.hs.URL, ClientIDFile: id, ClientSecretFile: secret})
		if err != nil {
			t.Fatal(err)
		}
		k, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
		// NotFound, not a connection error: Headscale answered, and has no such endpoint.
		if err == nil || tailnet.ReasonOf(err) != tailnet.ReasonNotFound {
			t.Fatalf("minting through the Tailscale API: key %v, err %v; want NotFound", k.ID, err)
		}
	})

	p.stop(t)
	t.Run("no auth key in the logs", func(t *testing.T) {
		logs := p.logs.String()
		if !strings.Contains(logs, "logged in to the tailnet") || !strings.Contains(logs, "authKey=REDACTED") {
			t.Fatalf("the proxy logs lack the expected lines; is the capture working?\n%s", e.hs.scrub(logs))
		}
		for what, text := range map[string]string{"proxy": logs, "tailnet client": e.tailnetLogs.String()} {
			if strings.Contains(text, key) {
				t.Errorf("the auth key appears in the %s logs", what)
			}
		}
	})
}

// With an untagged key, the tags the proxy requests are Headscale's policy to grant: it joins
// either way, tagged only if the policy makes the key's user an owner of the tag.
func TestProxyTagsFromPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, policy string
		want         []string
	}{
		{
			name: "granted",
			policy: `{"tagOwners": {"tag:k8s": ["dev@example.com"]},
				"acls": [{"action": "accept", "src": ["*"], "dst": ["*:*"]}]}`,
			want: []string{"tag:k8s"},
		},
		{name: "no policy", want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tc.policy)
			u := e.hs.createUser(t, "dev", "dev@example.com", "Dev Eloper")
			client, _ := e.join(t, "client", e.hs.createKey(t, u.ID))
			p := e.startProxy(t, &contract.ProxyConfig{
				Kind: contract.KindIngress, Hostname: "web", Tags: []string{"tag:k8s"}, ControlURL: e.hs.URL,
				AuthKey: e.hs.createKey(t, u.ID), StateSecret: "web-0", Serve: e.serve(),
			})
			if tags := e.peerTags(t, client, p.state.TailnetIPs[0]); !slices.Equal(tags, tc.want) {
				t.Errorf("the client sees the proxy with tags %v, want %v", tags, tc.want)
			}
			if got := e.get(t, client, "http://web."+baseDomain+"/x"); got.Path != "/x" {
				t.Errorf("the backend saw %+v", got)
			}
			p.stop(t)
		})
	}
}

// env is a Headscale server, a backend on loopback standing in for a Service, and the logs of
// the tailnet clients the test starts.
type env struct {
	hs          *server
	backend     *httptest.Server
	tailnetLogs *syncBuffer
	t0          time.Time
}

func newEnv(t *testing.T, policy string) *env {
	t.Helper()
	e := &env{hs: startHeadscale(t, policy), tailnetLogs: &syncBuffer{}, t0: time.Now()}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("tailnet client logs:\n%s", e.hs.scrub(tail(e.tailnetLogs.String(), 12000)))
		}
	})
	e.backend = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(seen{
			Path: r.URL.Path, Host: r.Host,
			ForwardedFor: r.Header.Get("X-Forwarded-For"),
			UserLogin:    r.Header.Get("Tailscale-User-Login"),
			UserName:     r.Header.Get("Tailscale-User-Name"),
		})
	}))
	t.Cleanup(e.backend.Close)
	return e
}

// tlogf collects the tailnet clients' logs, timed from the start of the test.
func (e *env) tlogf(format string, args ...any) {
	fmt.Fprintf(e.tailnetLogs, "%6.3fs "+format+"\n", append([]any{time.Since(e.t0).Seconds()}, args...)...)
}

// serve routes everything to the backend, on plain HTTP too: Headscale issues no certificates.
func (e *env) serve() *contract.WebService {
	return &contract.WebService{HTTP: contract.HTTPServe, Routes: []contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: e.backend.URL}},
	}}
}

// join brings up a plain tsnet node.
func (e *env) join(t *testing.T, hostname, key string) (*tsnet.Server, *ipnstate.Status) {
	t.Helper()
	start := time.Now()
	n := &tsnet.Server{
		Dir: t.TempDir(), ControlURL: e.hs.URL, Hostname: hostname, AuthKey: key, Logf: e.tlogf, UserLogf: logger.Discard,
	}
	// Close only what started: tsnet's Close panics after a failed Start.
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	st, err := n.Up(ctx)
	if err != nil {
		t.Fatalf("%s did not join Headscale: %v", hostname, err)
	}
	t.Logf("%s joined in %v", hostname, time.Since(start).Round(time.Millisecond))
	return n, st
}

// peerTags returns the tags node sees on the peer at ip, as the netmap from Headscale says.
func (e *env) peerTags(t *testing.T, node *tsnet.Server, ip string) []string {
	t.Helper()
	lc, err := node.LocalClient()
	if err != nil {
		t.Fatal(err)
	}
	var tags []string
	poll.Eventually(t, loginWait, "the client to know the peer "+ip, func() error {
		who, err := lc.WhoIs(t.Context(), ip)
		if err != nil {
			return err
		}
		tags = who.Node.Tags
		return nil
	})
	return tags
}

// runningProxy is a proxy.Run in progress.
type runningProxy struct {
	state  *contract.ProxyState // as first reported once logged in
	health string               // base URL of /healthz and /readyz
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned, with err
	err    error
}

// startProxy runs the proxy with cfg in a config directory, as the operator's Secret would be
// mounted, and waits until it reports a login.
func (e *env) startProxy(t *testing.T, cfg *contract.ProxyConfig) *runningProxy {
	t.Helper()
	configDir, stateDir := t.TempDir(), t.TempDir()
	proxytest.WriteConfig(t, configDir, cfg)
	p := &runningProxy{logs: &syncBuffer{}, done: make(chan struct{})}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy logs:\n%s", e.hs.scrub(tail(p.logs.String(), 8000)))
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.health = "http://" + ln.Addr().String()
	// Not t.Context: that ends only after cleanups, and the proxy must stop before its state
	// directory is removed.
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Error("proxy.Run did not return after cancel")
		}
	})
	start := time.Now()
	go func() {
		defer close(p.done)
		p.err = proxy.Run(ctx, proxy.Options{
			ConfigDir: configDir, StateDir: stateDir, HealthListener: ln,
			Logger:      slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			TailnetLogf: e.tlogf,
		})
	}()
	p.state = waitState(t, filepath.Join(stateDir, cfg.StateSecret, "proxy-state.json"), p)
	t.Logf("the proxy joined in %v", time.Since(start).Round(time.Millisecond))
	return p
}

// stop ends the proxy as SIGTERM would, and checks that it stops cleanly.
func (p *runningProxy) stop(t *testing.T) {
	t.Helper()
	p.cancel()
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("proxy.Run after cancel: %v", p.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("proxy.Run did not return after cancel")
	}
}

// get fetches url from the tailnet through node, retrying while the tailnet settles: the node
// learns of the proxy, and the proxy opens port 80, a moment after login.
func (e *env) get(t *testing.T, node *tsnet.Server, url string) seen {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: node.Dial, DisableKeepAlives: true}, Timeout: 20 * time.Second}
	var got seen
	poll.Eventually(t, loginWait, "an answer from "+url, func() error {
		res, err := c.Get(url)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", res.Status, body)
		}
		return json.Unmarshal(body, &got)
	})
	return got
}

// seen is what the backend saw of a request.
type seen struct {
	Path, Host, ForwardedFor, UserLogin, UserName string
}

// waitState waits until the proxy reports a device ID in its state file, failing early if
// proxy.Run returns.
func waitState(t *testing.T, path string, p *runningProxy) *contract.ProxyState {
	t.Helper()
	var st *contract.ProxyState
	poll.Eventually(t, loginWait, "the proxy to log in to Headscale", func() error {
		select {
		case <-p.done:
			t.Fatalf("proxy.Run returned early: %v", p.err)
		default:
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var m map[string]string
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		data := map[string][]byte{}
		for k, v := range m {
			data[k] = []byte(v)
		}
		if st, err = contract.ParseState(data); err != nil {
			return err
		}
		if st.DeviceID == "" {
			return fmt.Errorf("not logged in yet: %s", b)
		}
		return nil
	})
	return st
}

// loginWait bounds the waits for what follows a login: a Headscale login takes seconds.
const loginWait = time.Minute

func addrStrings(addrs []netip.Addr) []string {
	var s []string
	for _, a := range addrs {
		s = append(s, a.String())
	}
	return s
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func keysOf[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
