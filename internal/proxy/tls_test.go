package proxy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"tailscale.com/ipn/store/mem"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localacme"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// acmeWorld is where the certificate tests run real proxies: a real apiserver, a local tailnet
// with HTTPS, and a real ACME CA (Pebble) checking the tailnet's DNS-01 records, whose orders
// the tests count. The proxies use tailscaled's own certificate flow, as in production.
type acmeWorld struct {
	kube    *proxytest.Kube
	lt      *localtailnet.LocalTailnet
	api     *tailnet.APIClient
	ca      *localacme.CA
	backend *backend
	logs    *logBuffer
}

// newACMEWorld starts the world; validity, if set, is the lifetime of the certificates the CA
// issues.
func newACMEWorld(t *testing.T, validity time.Duration) *acmeWorld {
	t.Helper()
	lt, api := localtailnettest.Start(t, localtailnet.Options{HTTPS: true})
	// Not on the test's context, as the tailnet: that ends before the cleanups that stop the proxies.
	ca, err := localacme.Start(context.Background(), localacme.Options{DNSServer: lt.DNSAddr, Validity: validity})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Close() })
	if err := ca.UseInProcess(t.Setenv); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy logs:\n%s", logs)
		}
	})
	kube := proxytest.StartKube(t)
	if _, err := kube.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &acmeWorld{kube: kube, lt: lt, api: api, ca: ca, backend: newBackend(t, "b"), logs: logs}
}

func (w *acmeWorld) mintKey(t *testing.T) string {
	t.Helper()
	k, err := w.api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return k.Secret.Reveal()
}

// clients joins n client devices to the tailnet.
func (w *acmeWorld) clients(t *testing.T, n int) []*tsnet.Server {
	t.Helper()
	var cs []*tsnet.Server
	for i := range n {
		c := &tsnet.Server{
			Dir: t.TempDir(), ControlURL: w.lt.ControlURL, Hostname: fmt.Sprintf("client-%d", i), Store: new(mem.Store),
			Ephemeral: true, AuthKey: w.mintKey(t), Logf: logger.Discard, UserLogf: logger.Discard,
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Up(t.Context()); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return cs
}

// fetch gets url from a client device, verifying the server's certificate against roots, and
// returns the body and the serial of the certificate the server presented. Every host is
// reached at the tailnet name's address, as a bring-your-own host's DNS record would say.
func fetch(ctx context.Context, c *tsnet.Server, url string, roots *x509.CertPool) (body, serial string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return c.Dial(ctx, network, "web.tailnet.test:443")
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: roots}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", "", err
	}
	res, err := hc.Do(req)
	if err != nil {
		return "", "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return string(b), hex.EncodeToString(res.TLS.PeerCertificates[0].SerialNumber.Bytes()), err
}

func (w *acmeWorld) state(t *testing.T, secret string) *contract.ProxyState {
	t.Helper()
	sec, err := w.kube.Client.CoreV1().Secrets(ns).Get(t.Context(), secret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := contract.ParseState(sec.Data)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// tlsSecret creates or replaces a kubernetes.io/tls Secret; without a certificate it is empty,
// as the operator creates a ProxyGroup's.
func (w *acmeWorld) tlsSecret(t *testing.T, name string, cert *tls.Certificate) {
	t.Helper()
	var certPEM, keyPEM []byte
	if cert != nil {
		certPEM, keyPEM = proxytest.PEM(t, cert)
	}
	w.secret(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}})
}

func (w *acmeWorld) secret(t *testing.T, sec *corev1.Secret) {
	t.Helper()
	secrets := w.kube.Client.CoreV1().Secrets(ns)
	if _, err := secrets.Update(t.Context(), sec, metav1.UpdateOptions{}); err == nil {
		return
	}
	if _, err := secrets.Create(t.Context(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// mergeSecret sets keys of a Secret, creating it if needed, as the operator writes a proxy's
// config into the Secret its state is in.
func (w *acmeWorld) mergeSecret(t *testing.T, name string, data map[string][]byte) {
	t.Helper()
	secrets := w.kube.Client.CoreV1().Secrets(ns)
	// A proxy that is stopping may still write its state keys: read again on a conflict.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sec, err := secrets.Get(t.Context(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			w.kube.Secret(t, ns, name, data)
			return nil
		}
		if err != nil {
			return err
		}
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		maps.Copy(sec.Data, data)
		_, err = secrets.Update(t.Context(), sec, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// run runs a proxy until ctx ends; the returned channel gives Run's result.
func (w *acmeWorld) run(ctx context.Context, opts proxy.Options) <-chan error {
	opts.Logger = slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	done := make(chan error, 1)
	go func() { done <- proxy.Run(ctx, opts) }()
	return done
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	poll.True(t, timeout, what, cond)
}

// waitCert waits for proxy web-0 to report host's certificate as ok wants it, and fails with
// the last report otherwise. A proxy serves a certificate before it reports it, so a client may
// see it first.
func (w *acmeWorld) waitCert(t *testing.T, host string, ok func(contract.CertificateStatus) bool) {
	t.Helper()
	var cs contract.CertificateStatus
	deadline := time.Now().Add(10 * time.Second)
	for cs = w.state(t, "web-0").Certificates[host]; !ok(cs); cs = w.state(t, "web-0").Certificates[host] {
		if time.Now().After(deadline) {
			t.Fatalf("%s: reported %+v after 10s", host, cs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func secretRule(verbs []string, names ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: names, Verbs: verbs}
}

var (
	proxyVerbs  = []string{"get", "list", "watch", "patch"} // its config and state Secrets
	readVerbs   = []string{"get", "list", "watch"}          // certificate Secrets it reads
	issuerVerbs = []string{"get", "list", "watch", "update", "patch"}
)

// A ProxyGroup of three replicas serving one name shares one certificate: the issuer (ordinal
// 0) orders it once the operator made the name's Secret, and keeps it there; the readers serve
// it from there and advertise the service only once they can; every replica presents the same certificate, which
// verifies against the CA's root. At two thirds of its short lifetime the issuer renews it
// without any request coming in, and the readers take the new one up.
func TestGroupSharedCertificate(t *testing.T) {
	start := time.Now()
	w := newACMEWorld(t, 30*time.Second)
	const svc, fqdn, cm = "svc:web", "web.tailnet.test", "pg-ingress-config"
	if _, err := w.api.PutService(t.Context(), tailnet.Service{Name: svc, Ports: []string{"tcp:443"}, Tags: []string{"tag:k8s"}}); err != nil {
		t.Fatal(err)
	}
	doc, err := contract.ServeConfigs.Encode(&contract.ServeConfig{Services: map[string]contract.WebService{
		svc: {Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: w.backend.srv.URL}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cmData := map[string]string{}
	for k, v := range doc {
		cmData[k] = string(v)
	}
	if _, err := w.kube.Client.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cm, Namespace: ns}, Data: cmData}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	netNS := map[int]string{}
	if os.Geteuid() == 0 { // the replicas' L3 data paths get namespaces of their own for their TUNs
		for i := range 3 {
			netNS[i] = netnstest.New(t, fmt.Sprintf("pg-%d", i)).Path // removed after the replicas stop
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	var dones []<-chan error
	t.Cleanup(func() {
		cancel()
		for _, d := range dones {
			<-d //nolint:errcheck // how the replicas stop after the cancel is not what this test checks
		}
	})
	startReplica := func(i int) {
		role, certVerbs := contract.CertReader, readVerbs
		if i == 0 {
			role, certVerbs = contract.CertIssuer, issuerVerbs
		}
		config, state := fmt.Sprintf("pg-%d-config", i), fmt.Sprintf("pg-%d", i)
		data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{
			Kind: contract.KindProxyGroup, Hostname: fmt.Sprintf("pg-%d", i), Tags: []string{"tag:k8s"}, ControlURL: w.lt.ControlURL,
			AuthKey: w.mintKey(t), StateSecret: state, AdvertiseServices: []string{svc}, TLS: contract.TLSConfig{CertShareMode: role},
		})
		if err != nil {
			t.Fatal(err)
		}
		w.kube.Secret(t, ns, config, data)
		w.kube.Secret(t, ns, state, nil)
		// What the operator grants a replica.
		user := w.kube.User(t, ns, "replica-"+state,
			secretRule(proxyVerbs, config, state),
			secretRule(certVerbs, contract.GroupCertSecret(fqdn)),
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{cm}, Verbs: readVerbs})
		opts := proxy.Options{ConfigSecret: config, GroupConfigMap: cm, Kube: user, Namespace: ns, PodUID: "pod-" + state,
			StateDir: t.TempDir(), GroupWithdrawWait: 100 * time.Millisecond, NetNS: netNS[i]}
		dones = append(dones, w.run(ctx, opts))
	}
	clients := w.clients(t, 3) // consecutive node IDs: the tailnet sends each to another replica
	t.Logf("world up after %v", time.Since(start).Round(time.Millisecond))

	// Readers first: with the Secret empty, they wait and do not advertise.
	startReplica(1)
	startReplica(2)
	for _, r := range []string{"pg-1", "pg-2"} {
		waitFor(t, r+" waiting for the issuer", 30*time.Second, func() bool {
			return w.state(t, r).Certificates[fqdn].Reason == contract.CertReasonWaiting
		})
	}
	if st := w.state(t, "pg-1"); len(st.Advertised) > 0 {
		t.Errorf("a reader advertises %v without a certificate", st.Advertised)
	}

	// Without the Secret (the operator creates it) the issuer asks for nothing: the certificate
	// would be lost.
	startReplica(0)
	waitFor(t, "the issuer to report the missing Secret", 30*time.Second, func() bool {
		cs := w.state(t, "pg-0").Certificates[fqdn]
		return cs.Reason == contract.CertReasonSecretInvalid && strings.Contains(cs.Message, "does not exist")
	})
	if st := w.state(t, "pg-0"); len(st.Advertised) > 0 || w.ca.Orders(fqdn) > 0 {
		t.Errorf("without its Secret the issuer advertises %v, and the CA got %d orders", st.Advertised, w.ca.Orders(fqdn))
	}
	issuedAt := time.Now()
	w.tlsSecret(t, contract.GroupCertSecret(fqdn), nil)
	waitFor(t, "every replica to advertise", 60*time.Second, func() bool {
		all := true
		for _, r := range []string{"pg-0", "pg-1", "pg-2"} {
			st := w.state(t, r)
			if !slices.Contains(st.Advertised, svc) {
				all = false
				continue
			}
			if r == "pg-0" {
				continue // the issuer advertises to be given the name's certificate
			}
			sec, err := w.kube.Client.CoreV1().Secrets(ns).Get(t.Context(), contract.GroupCertSecret(fqdn), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(sec.Data[corev1.TLSCertKey]) == 0 {
				t.Fatalf("reader %s advertises while the certificate Secret is empty", r)
			}
		}
		return all
	})
	t.Logf("all three replicas serving %v after the Secret was made", time.Since(issuedAt).Round(time.Millisecond))

	// serving checks that every replica reports serial and every client gets it, verified.
	serving := func(serial string) {
		t.Helper()
		for i, r := range []string{"pg-0", "pg-1", "pg-2"} {
			cs := w.state(t, r).Certificates[fqdn]
			want := contract.CertSourceSecret
			if i == 0 {
				want = contract.CertSourceACME
			}
			if cs.Serial != serial || cs.Source != want || !cs.Valid(time.Now()) {
				t.Errorf("%s reports %+v, want serial %s from %s", r, cs, serial, want)
			}
		}
		for i, c := range clients {
			body, got, err := fetch(t.Context(), c, "https://"+fqdn+"/x", w.ca.Roots())
			if err != nil || body != "b /x" || got != serial {
				t.Errorf("client %d: %q, serial %s, %v; want serial %s", i, body, got, err, serial)
			}
		}
	}
	first := w.state(t, "pg-0").Certificates[fqdn].Serial
	serving(first)
	if o := w.ca.Orders(fqdn); o != 1 {
		t.Errorf("the CA got %d orders for %s, want 1", o, fqdn)
	}
	// tailscaled kept the certificate in the shared Secret, not in the issuer's state; the ACME
	// account stays there.
	own, err := w.kube.Client.CoreV1().Secrets(ns).Get(t.Context(), "pg-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k := range own.Data {
		if strings.Contains(k, fqdn) {
			t.Errorf("the issuer's state Secret holds %s", k)
		}
	}
	if len(own.Data["ts.acme-account.key.pem"]) == 0 {
		t.Errorf("no ACME account key in the issuer's state Secret: %v", keys(own.Data))
	}

	t.Run("renewal", func(t *testing.T) {
		var renewed string
		waitFor(t, "the issuer to renew", 40*time.Second, func() bool {
			renewed = w.state(t, "pg-0").Certificates[fqdn].Serial
			return renewed != first
		})
		t.Logf("renewed %v after the first issuance", time.Since(issuedAt).Round(time.Millisecond))
		waitFor(t, "the readers to reload", 10*time.Second, func() bool {
			return w.state(t, "pg-1").Certificates[fqdn].Serial == renewed && w.state(t, "pg-2").Certificates[fqdn].Serial == renewed
		})
		serving(renewed)
		if o := w.ca.Orders(fqdn); o != 2 {
			t.Errorf("the CA got %d orders for %s, want 2 (one renewal)", o, fqdn)
		}
	})
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}

// Bring-your-own certificates are served by SNI next to the tailnet name, each on its host's
// routes; a Secret that is missing, not kubernetes.io/tls or expired leaves its host unserved
// and is reported, and the other names are served all the same. An issuance hold keeps the
// proxy from asking the CA at all until it is lifted; a cached certificate is still served
// under a hold.
func TestIssuanceHoldAndOwnCertificates(t *testing.T) {
	start := time.Now()
	w := newACMEWorld(t, 0)
	const fqdn = "web.tailnet.test"
	other := proxytest.NewCA(t) // bring-your-own certificates' CA
	app, err := other.Certificate(t.Context(), "app.example.com")
	if err != nil {
		t.Fatal(err)
	}
	other.Backdate(2 * time.Hour)
	old, err := other.Certificate(t.Context(), "old.example.com")
	if err != nil {
		t.Fatal(err)
	}
	other.Backdate(0)
	w.tlsSecret(t, "app-tls", app)
	w.tlsSecret(t, "old-tls", old)
	appPEM, appKey := proxytest.PEM(t, app)
	w.secret(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns},
		Data: map[string][]byte{corev1.TLSCertKey: appPEM, corev1.TLSPrivateKeyKey: appKey}})

	hold := &contract.IssuanceHold{Reason: "RateLimited", Message: "5 certificates for web.tailnet.test this week"}
	ws := contract.WebService{
		Routes: []contract.Route{
			{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: w.backend.srv.URL}},
			{Host: "app.example.com", Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: newBackend(t, "app").srv.URL}},
		},
		TLS: contract.WebTLS{Hold: hold, Certificates: []contract.CertificateRef{
			{SecretName: "app-tls", Hosts: []string{"app.example.com"}},
			{SecretName: "old-tls", Hosts: []string{"old.example.com"}},
			{SecretName: "plain", Hosts: []string{"plain.example.com"}},
			{SecretName: "gone", Hosts: []string{"gone.example.com"}},
		}},
	}
	writeConfig := func(authKey string) {
		t.Helper()
		data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{Kind: contract.KindIngress, Hostname: "web", Tags: []string{"tag:k8s"},
			ControlURL: w.lt.ControlURL, AuthKey: authKey, StateSecret: "web-0", Serve: &ws})
		if err != nil {
			t.Fatal(err)
		}
		w.mergeSecret(t, "web-0", data)
	}
	writeConfig(w.mintKey(t))
	user := w.kube.User(t, ns, "proxy-web-0", secretRule(proxyVerbs, "web-0"),
		secretRule(readVerbs, "app-tls", "old-tls", "plain", "gone"))
	runPod := func(ctx context.Context, pod string) <-chan error {
		return w.run(ctx, proxy.Options{ConfigSecret: "web-0", Kube: user, Namespace: ns, PodUID: pod, StateDir: t.TempDir()})
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := runPod(ctx, "pod-1")
	stop := sync.OnceFunc(func() { cancel(); <-done }) //nolint:errcheck // how the proxy stops after the cancel is not what this test checks
	t.Cleanup(stop)
	client := w.clients(t, 1)[0]
	ownRoots := other.Pool()

	// The hold and the bring-your-own hosts are judged apart (the hosts once their Secrets are
	// seen): wait for every one to be reported.
	var st *contract.ProxyState
	waitFor(t, "the hold and every bring-your-own host reported", 30*time.Second, func() bool {
		st = w.state(t, "web-0")
		for _, host := range []string{"app.example.com", "old.example.com", "plain.example.com", "gone.example.com"} {
			if _, ok := st.Certificates[host]; !ok {
				return false
			}
		}
		return st.Certificates[fqdn].Reason == contract.CertReasonIssuanceHeld
	})
	if cs := st.Certificates[fqdn]; cs.Message != hold.Message || cs.Serial != "" {
		t.Errorf("held: %+v", cs)
	}
	if cs := st.Certificates["app.example.com"]; cs.Source != contract.CertSourceSecret || cs.Serial != hex.EncodeToString(app.Leaf.SerialNumber.Bytes()) {
		t.Errorf("app.example.com: %+v", cs)
	}
	for host, want := range map[string]string{
		"old.example.com":   "Secret old-tls: its certificate expired at",
		"plain.example.com": `Secret plain: it is of type "Opaque", not kubernetes.io/tls`,
		"gone.example.com":  "Secret gone: it does not exist",
	} {
		if cs := st.Certificates[host]; cs.Reason != contract.CertReasonSecretInvalid || !strings.HasPrefix(cs.Message, want) || cs.Serial != "" {
			t.Errorf("%s: %+v, want SecretInvalid: %s", host, cs, want)
		}
	}
	// A bring-your-own host is served under the hold, on its own routes.
	if body, serial, err := fetch(t.Context(), client, "https://app.example.com/x", ownRoots); err != nil || body != "app /x" || serial != st.Certificates["app.example.com"].Serial {
		t.Errorf("app.example.com: %q %s %v", body, serial, err)
	}
	for _, host := range []string{fqdn, "old.example.com", "plain.example.com", "gone.example.com"} {
		if _, _, err := fetch(t.Context(), client, "https://"+host+"/", nil); err == nil || !strings.Contains(err.Error(), "tls") {
			t.Errorf("%s: %v, want a failed handshake", host, err)
		}
	}
	if o := w.ca.Orders(fqdn); o != 0 {
		t.Fatalf("the CA got %d orders under the hold", o)
	}

	var issued string // the serial of the certificate issued once the hold is lifted
	t.Run("lifted", func(t *testing.T) {
		ws.TLS.Hold = nil
		writeConfig("")
		waitFor(t, "the tailnet name served", 30*time.Second, func() bool {
			var err error
			_, issued, err = fetch(t.Context(), client, "https://"+fqdn+"/x", w.ca.Roots())
			return err == nil
		})
		// Reported after it is served.
		waitFor(t, "the serial served reported", 10*time.Second, func() bool {
			cs := w.state(t, "web-0").Certificates[fqdn]
			return cs.Serial == issued && cs.Source == contract.CertSourceACME
		})
		if o := w.ca.Orders(fqdn); o != 1 {
			t.Errorf("%d orders, want 1", o)
		}
		// The invalid Secrets stay reported while the tailnet name is served.
		if cs := w.state(t, "web-0").Certificates["old.example.com"]; cs.Reason != contract.CertReasonSecretInvalid {
			t.Errorf("old.example.com: %+v", cs)
		}
	})

	t.Run("reload", func(t *testing.T) {
		renewed, err := other.Certificate(t.Context(), "app.example.com")
		if err != nil {
			t.Fatal(err)
		}
		w.tlsSecret(t, "app-tls", renewed)
		serial := hex.EncodeToString(renewed.Leaf.SerialNumber.Bytes())
		waitFor(t, "the new certificate of app.example.com", 10*time.Second, func() bool {
			_, got, err := fetch(t.Context(), client, "https://app.example.com/", ownRoots)
			return err == nil && got == serial
		})
		// Reported after it is served, so possibly after the client saw it.
		w.waitCert(t, "app.example.com", func(cs contract.CertificateStatus) bool {
			return cs.Source == contract.CertSourceSecret && cs.Serial == serial
		})
		// A Secret made valid is served from then on.
		w.tlsSecret(t, "gone", mustCert(t, other, "gone.example.com"))
		waitFor(t, "gone.example.com served", 10*time.Second, func() bool {
			_, _, err := fetch(t.Context(), client, "https://gone.example.com/", ownRoots)
			return err == nil
		})
	})

	// A rescheduled Pod (fresh disk) under a hold serves the certificate cached in its state
	// Secret, and orders nothing.
	t.Run("cached under a hold", func(t *testing.T) {
		stop()
		ws.TLS.Hold = hold
		writeConfig("")
		ctx, cancel2 := context.WithCancel(t.Context())
		defer cancel2()
		done2 := runPod(ctx, "pod-2")
		defer func() { cancel2(); <-done2 }() //nolint:errcheck // how the proxy stops after the cancel is not what this test checks
		waitFor(t, "the cached certificate served", 30*time.Second, func() bool {
			_, _, err := fetch(t.Context(), client, "https://"+fqdn+"/", w.ca.Roots())
			return err == nil
		})
		w.waitCert(t, fqdn, func(cs contract.CertificateStatus) bool {
			return cs.Source == contract.CertSourceACME && cs.Serial == issued
		})
		if o := w.ca.Orders(fqdn); o != 1 {
			t.Errorf("%d orders, want still 1", o)
		}
	})
	if out := w.logs.String(); strings.Contains(out, "PRIVATE KEY") {
		t.Error("a private key appears in the logs")
	}
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}

func mustCert(t *testing.T, ca *proxytest.CA, name string) *tls.Certificate {
	t.Helper()
	c, err := ca.Certificate(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// With the CA out of reach, the tailnet name reports IssuanceFailed with the error, and is
// tried again with backoff; a bring-your-own host is served all the same.
func TestIssuanceFailed(t *testing.T) {
	start := time.Now()
	w := newACMEWorld(t, 0)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	dir := "https://" + closed.Addr().String() + "/dir"
	t.Setenv("TS_DEBUG_ACME_DIRECTORY_URL", dir) // restored after the test; the proxy sets it from its config
	other := proxytest.NewCA(t)
	w.tlsSecret(t, "app-tls", mustCert(t, other, "app.example.com"))
	data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{Kind: contract.KindIngress, Hostname: "web", Tags: []string{"tag:k8s"},
		ControlURL: w.lt.ControlURL, AuthKey: w.mintKey(t), StateSecret: "web-0", TLS: contract.TLSConfig{ACMEDirectoryURL: dir},
		Serve: &contract.WebService{
			Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: w.backend.srv.URL}}},
			TLS:    contract.WebTLS{Certificates: []contract.CertificateRef{{SecretName: "app-tls", Hosts: []string{"app.example.com"}}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	w.mergeSecret(t, "web-0", data)
	user := w.kube.User(t, ns, "proxy-web-0", secretRule(proxyVerbs, "web-0"), secretRule(readVerbs, "app-tls"))
	ctx, cancel := context.WithCancel(t.Context())
	done := w.run(ctx, proxy.Options{ConfigSecret: "web-0", Kube: user, Namespace: ns, PodUID: "pod-1", StateDir: t.TempDir()})
	t.Cleanup(func() { cancel(); <-done }) //nolint:errcheck // how the proxy stops after the cancel is not what this test checks
	client := w.clients(t, 1)[0]

	const fqdn = "web.tailnet.test"
	waitFor(t, "the failure reported", 30*time.Second, func() bool {
		return w.state(t, "web-0").Certificates[fqdn].Reason == contract.CertReasonIssuanceFailed
	})
	if cs := w.state(t, "web-0").Certificates[fqdn]; !strings.Contains(cs.Message, "connection refused") || cs.Serial != "" {
		t.Errorf("reported %+v, want the refused connection", cs)
	}
	if body, _, err := fetch(t.Context(), client, "https://app.example.com/x", other.Pool()); err != nil || body != "b /x" {
		t.Errorf("app.example.com: %q, %v", body, err)
	}
	waitFor(t, "a second attempt", 10*time.Second, func() bool {
		return strings.Count(w.logs.String(), "getting the certificate failed; trying again") >= 2
	})
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}

// A CA's rate limit is waited out (tailscaled's ACME client honours its Retry-After) unless a
// hold comes: the attempt under way then ends at once, and nothing is ordered until the hold is
// lifted. A renewal the CA refuses leaves the current certificate served and reported, and
// comes once the CA allows it, without any request coming in.
func TestRateLimited(t *testing.T) {
	start := time.Now()
	w := newACMEWorld(t, 15*time.Second)
	const fqdn = "web.tailnet.test"
	ws := contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: w.backend.srv.URL}}}}
	writeConfig := func(authKey string) {
		t.Helper()
		data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{Kind: contract.KindIngress, Hostname: "web", Tags: []string{"tag:k8s"},
			ControlURL: w.lt.ControlURL, AuthKey: authKey, StateSecret: "web-0", Serve: &ws})
		if err != nil {
			t.Fatal(err)
		}
		w.mergeSecret(t, "web-0", data)
	}
	writeConfig(w.mintKey(t))
	user := w.kube.User(t, ns, "proxy-web-0", secretRule(proxyVerbs, "web-0"))
	w.ca.InjectRateLimit(localacme.RateLimit{RetryAfter: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	done := w.run(ctx, proxy.Options{ConfigSecret: "web-0", Kube: user, Namespace: ns, PodUID: "pod-1", StateDir: t.TempDir()})
	t.Cleanup(func() { cancel(); <-done }) //nolint:errcheck // how the proxy stops after the cancel is not what this test checks
	client := w.clients(t, 1)[0]

	waitFor(t, "the order to be refused", 30*time.Second, func() bool { return w.ca.RateLimited() == 1 })
	ws.TLS.Hold = &contract.IssuanceHold{Reason: "RateLimited", Message: "the CA said so"}
	writeConfig("")
	waitFor(t, "the hold to apply", 10*time.Second, func() bool {
		return w.state(t, "web-0").Certificates[fqdn].Reason == contract.CertReasonIssuanceHeld
	})
	ws.TLS.Hold = nil
	writeConfig("")
	var first string
	waitFor(t, "a certificate once the hold is lifted", 30*time.Second, func() bool {
		first = w.state(t, "web-0").Certificates[fqdn].Serial
		return first != ""
	})
	if r, o := w.ca.RateLimited(), w.ca.Orders(fqdn); r != 1 || o != 1 {
		t.Errorf("%d refused and %d accepted orders; want 1 and 1", r, o)
	}

	const retryAfter = 3 * time.Second
	w.ca.InjectRateLimit(localacme.RateLimit{RetryAfter: retryAfter})
	waitFor(t, "the renewal to be refused", 15*time.Second, func() bool { return w.ca.RateLimited() == 2 })
	refused := time.Now()
	if cs := w.state(t, "web-0").Certificates[fqdn]; cs.Serial != first || cs.Reason != "" {
		t.Errorf("after the refusal: %+v, want serial %s still", cs, first)
	}
	if _, serial, err := fetch(t.Context(), client, "https://"+fqdn+"/", w.ca.Roots()); err != nil || serial != first {
		t.Errorf("after the refusal: serial %s, %v; want %s", serial, err, first)
	}
	var renewed string
	waitFor(t, "the renewal", 15*time.Second, func() bool {
		renewed = w.state(t, "web-0").Certificates[fqdn].Serial
		return renewed != first
	})
	if after := time.Since(refused); after < retryAfter-200*time.Millisecond { // the refusal is seen a poll late
		t.Errorf("renewed %v after the refusal, before the CA's Retry-After of %v", after, retryAfter)
	}
	if _, serial, err := fetch(t.Context(), client, "https://"+fqdn+"/", w.ca.Roots()); err != nil || serial != renewed {
		t.Errorf("after the renewal: serial %s, %v; want %s", serial, err, renewed)
	}
	if o := w.ca.Orders(fqdn); o != 2 {
		t.Errorf("%d orders, want 2", o)
	}
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}
