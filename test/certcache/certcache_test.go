// Package certcache proves that a proxy keeps its certificate in its Kubernetes state Secret: a
// proxy restarted on a fresh disk (a rescheduled Pod) serves the cached certificate and never
// orders a second one.
package certcache

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"tailscale.com/net/netns"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/testenv"
)

func TestMain(m *testing.M) {
	netns.SetEnabled(false)
	// tailscaled keeps certificates in a custom state store only when it runs in Kubernetes,
	// which it reads once from these variables; a proxy Pod has them. The proxy here reaches
	// the API server through an explicit config, so they lead nowhere else.
	os.Setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
	os.Setenv("KUBERNETES_SERVICE_PORT", "1")
	os.Exit(m.Run())
}

func TestCertificateSurvivesRescheduling(t *testing.T) {
	lt, api := localtailnettest.Start(t, localtailnet.Options{ACME: true})
	if err := lt.ACME.UseInProcess(t.Setenv); err != nil {
		t.Fatal(err)
	}
	cp, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	kube, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	key, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}})
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	t.Cleanup(backend.Close)
	data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{
		Kind: contract.KindIngress, Hostname: "cached", Tags: []string{"tag:k8s"}, ControlURL: lt.ControlURL,
		AuthKey: key.Secret.Reveal(), StateSecret: "cached-0",
		Serve: &contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: backend.URL}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := kube.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "cached-0"}, Data: data}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	clientKey, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}})
	if err != nil {
		t.Fatal(err)
	}
	client := &tsnet.Server{Dir: t.TempDir(), Hostname: "client", ControlURL: lt.ControlURL, AuthKey: clientKey.Secret.Reveal(), Ephemeral: true}
	t.Cleanup(func() { client.Close() })
	if _, err := client.Up(t.Context()); err != nil {
		t.Fatal(err)
	}

	// serve runs the proxy as a fresh Pod would (a new, empty state directory) until the name
	// answers over HTTPS with a certificate from the CA, then stops it.
	serve := func(pod string) {
		t.Helper()
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- proxy.Run(runCtx, proxy.Options{ConfigSecret: "cached-0", Kube: cp.Config, Namespace: "default",
				PodUID: pod, StateDir: t.TempDir()})
		}()
		defer func() { cancel(); <-done }() //nolint:errcheck // how the proxy stops after the cancel is not what this test checks
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: client.Dial,
			TLSClientConfig: &tls.Config{RootCAs: lt.ACME.Roots()}, DisableKeepAlives: true}}
		deadline := time.Now().Add(60 * time.Second)
		for {
			resp, err := hc.Get("https://cached.tailnet.test/")
			if err == nil {
				resp.Body.Close()
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no HTTPS: %v", pod, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	serve("pod-1")
	if got := lt.ACME.Orders("cached.tailnet.test"); got != 1 {
		t.Fatalf("orders after the first Pod: %d, want 1", got)
	}
	s, err := kube.CoreV1().Secrets("default").Get(ctx, "cached-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var certKeys []string
	for k := range s.Data {
		if strings.Contains(k, "cached.tailnet.test") {
			certKeys = append(certKeys, k)
		}
	}
	if len(certKeys) == 0 {
		t.Fatalf("no certificate in the state Secret (keys: %d)", len(s.Data))
	}

	serve("pod-2")
	if got := lt.ACME.Orders("cached.tailnet.test"); got != 1 {
		t.Errorf("orders after a rescheduled Pod: %d, want still 1 (certificate keys in the Secret: %v)", got, certKeys)
	}
}
