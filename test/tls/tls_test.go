// Package tls tests what the proxy does about certificates when its tailnet client does not run
// as in a Pod: tailscaled then keeps certificates in files, never in the proxy's Secret store,
// so a ProxyGroup's issuer copies each shared certificate into its Secret itself (as in the
// local environment, whose proxies run in one process outside any cluster).
package tls

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"tailscale.com/hostinfo"
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
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func TestMain(m *testing.M) {
	netns.SetEnabled(false)
	os.Unsetenv("KUBERNETES_SERVICE_HOST") // not in a Pod, whatever runs the tests
	os.Exit(m.Run())
}

const (
	ns   = "tailscale"
	svc  = "svc:web"
	fqdn = "web.tailnet.test"
	cm   = "pg-ingress-config"
)

// syncBuffer collects the proxies' logs.
type syncBuffer struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}

// The issuer copies the certificate tailscaled issued into the name's Secret, where a reader
// loads it; an issuer restarted on a fresh disk serves the certificate in the Secret at once
// and orders none.
func TestSharedCertificateOutsideKubernetes(t *testing.T) {
	start := time.Now()
	if hostinfo.GetEnvType() == hostinfo.Kubernetes {
		t.Fatal("the test process looks like a Pod")
	}
	lt, api := localtailnettest.Start(t, localtailnet.Options{HTTPS: true})
	// Not on the test's context, as the tailnet: that ends before the cleanups that stop the replicas.
	ca, err := localacme.Start(context.Background(), localacme.Options{DNSServer: lt.DNSAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Close() })
	if err := ca.UseInProcess(t.Setenv); err != nil {
		t.Fatal(err)
	}
	mintKey := func() string {
		k, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return k.Secret.Reveal()
	}
	if _, err := api.PutService(t.Context(), tailnet.Service{Name: svc, Ports: []string{"tcp:443"}, Tags: []string{"tag:k8s"}}); err != nil {
		t.Fatal(err)
	}
	kube := proxytest.StartKube(t)
	secrets := kube.Client.CoreV1().Secrets(ns)
	if _, err := kube.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: contract.GroupCertSecret(fqdn)}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: nil, corev1.TLSPrivateKeyKey: nil}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	t.Cleanup(backend.Close)
	doc, err := contract.ServeConfigs.Encode(&contract.ServeConfig{Services: map[string]contract.WebService{
		svc: {Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: backend.URL}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	cmData := map[string]string{}
	for k, v := range doc {
		cmData[k] = string(v)
	}
	if _, err := kube.Client.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cm}, Data: cmData}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	logs := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy logs:\n%s", logs)
		}
	})
	netNS := map[int]string{}
	if os.Geteuid() == 0 { // the replicas' L3 data paths get namespaces of their own for their TUNs
		for i := range 2 {
			netNS[i] = netnstest.New(t, fmt.Sprintf("pg-%d", i)).Path
		}
	}
	var stops []func()
	t.Cleanup(func() {
		for _, stop := range stops {
			stop()
		}
	})
	// replica runs replica i as a new Pod on a fresh disk (dir), with what the operator grants it.
	replica := func(i int, pod string) (stop func(), dir string) {
		role, certVerbs := contract.CertReader, []string{"get", "list", "watch"}
		if i == 0 {
			role, certVerbs = contract.CertIssuer, []string{"get", "list", "watch", "update", "patch"}
		}
		config, state := fmt.Sprintf("pg-%d-config", i), fmt.Sprintf("pg-%d", i)
		if _, err := secrets.Get(t.Context(), config, metav1.GetOptions{}); err != nil {
			data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{
				Kind: contract.KindProxyGroup, Hostname: state, Tags: []string{"tag:k8s"}, ControlURL: lt.ControlURL,
				AuthKey: mintKey(), StateSecret: state, AdvertiseServices: []string{svc}, TLS: contract.TLSConfig{CertShareMode: role},
			})
			if err != nil {
				t.Fatal(err)
			}
			kube.Secret(t, ns, config, data)
			kube.Secret(t, ns, state, nil)
		}
		name := "replica-" + state + "-" + pod
		cfg := kube.User(t, ns, name,
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{config, state}, Verbs: []string{"get", "list", "watch", "patch"}},
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{contract.GroupCertSecret(fqdn)}, Verbs: certVerbs},
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{cm}, Verbs: []string{"get", "list", "watch"}})
		dir = t.TempDir()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			done <- proxy.Run(ctx, proxy.Options{ConfigSecret: config, GroupConfigMap: cm, Kube: cfg, Namespace: ns, PodUID: pod,
				StateDir: dir, GroupWithdrawWait: 100 * time.Millisecond, NetNS: netNS[i],
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("pod", pod)})
		}()
		stop = sync.OnceFunc(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: Run: %v", pod, err)
			}
		})
		stops = append(stops, stop)
		return stop, dir
	}
	state := func(secret string) *contract.ProxyState {
		sec, err := secrets.Get(t.Context(), secret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := contract.ParseState(sec.Data)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	servingBoth := func(pod0 string) string {
		t.Helper()
		var serial string
		waitFor("both replicas to serve", func() bool {
			s0, s1 := state("pg-0"), state("pg-1")
			serial = s0.Certificates[fqdn].Serial
			return s0.PodUID == pod0 && slices.Contains(s0.Advertised, svc) && slices.Contains(s1.Advertised, svc) &&
				serial != "" && s1.Certificates[fqdn].Serial == serial
		})
		return serial
	}

	stopIssuer, issuerDir := replica(0, "pod-0a")
	replica(1, "pod-1a")
	serial := servingBoth("pod-0a")
	// tailscaled kept the certificate in its files; the Secret has the copy.
	if _, err := os.Stat(filepath.Join(issuerDir, ns+".pg-0", "certs", fqdn+".crt")); err != nil {
		t.Errorf("the issuer's tailscaled kept no certificate file: %v", err)
	}
	sec, err := secrets.Get(t.Context(), contract.GroupCertSecret(fqdn), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pair, _ := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if pair.Leaf == nil || hex.EncodeToString(pair.Leaf.SerialNumber.Bytes()) != serial {
		t.Fatalf("the Secret does not hold the certificate served (serial %s)", serial)
	}
	client := &tsnet.Server{Dir: t.TempDir(), ControlURL: lt.ControlURL, Hostname: "client", Store: new(mem.Store),
		Ephemeral: true, AuthKey: mintKey(), Logf: logger.Discard, UserLogf: logger.Discard}
	t.Cleanup(func() { client.Close() })
	if _, err := client.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: client.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: ca.Roots()}}}
	res, err := hc.Get("https://" + fqdn + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if got := hex.EncodeToString(res.TLS.PeerCertificates[0].SerialNumber.Bytes()); string(body) != "ok" || got != serial {
		t.Errorf("got %q with serial %s, want serial %s", body, got, serial)
	}

	stopIssuer()
	replica(0, "pod-0b")
	if again := servingBoth("pod-0b"); again != serial {
		t.Errorf("the restarted issuer serves serial %s, want %s from the Secret", again, serial)
	}
	if o := ca.Orders(fqdn); o != 1 {
		t.Errorf("the CA got %d orders, want 1", o)
	}
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}
