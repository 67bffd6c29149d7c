package proxy_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localacme"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// The proxy's production certificate flow (ACME DNS-01 through the control server) against
// real CAs: the config's ACME directory (a ProxyClass's staging switch) decides which CA issues.
func TestACMEDirectoryFromConfig(t *testing.T) {
	lt, api := localtailnettest.Start(t, localtailnet.Options{ACME: true})
	if err := lt.ACME.UseInProcess(t.Setenv); err != nil {
		t.Fatal(err)
	}
	staging, err := localacme.Start(context.Background(), localacme.Options{DNSServer: lt.DNSAddr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { staging.Close() })
	t.Setenv("TS_DEBUG_ACME_DIRECTORY_URL", lt.ACME.DirectoryURL) // restored after the test
	key, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}})
	if err != nil {
		t.Fatal(err)
	}
	backend := newBackend(t, "web")
	cfg := &contract.ProxyConfig{
		Kind: contract.KindIngress, Hostname: "staged", Tags: []string{"tag:k8s"}, ControlURL: lt.ControlURL,
		AuthKey: key.Secret.Reveal(), StateSecret: "staged-0",
		TLS:   contract.TLSConfig{ACMEDirectoryURL: staging.DirectoryURL},
		Serve: &contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: backend.srv.URL}}}},
	}
	dir := t.TempDir()
	proxytest.WriteConfig(t, dir, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- proxy.Run(ctx, proxy.Options{ConfigDir: dir, StateDir: t.TempDir()}) }()
	t.Cleanup(func() { cancel(); <-done }) //nolint:errcheck // how the proxy stops after the cancel is not what this test checks

	clientKey, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}})
	if err != nil {
		t.Fatal(err)
	}
	client := &tsnet.Server{Dir: t.TempDir(), Hostname: "client", ControlURL: lt.ControlURL, AuthKey: clientKey.Secret.Reveal(), Ephemeral: true}
	t.Cleanup(func() { client.Close() })
	if _, err := client.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: client.Dial,
		TLSClientConfig: &tls.Config{RootCAs: staging.Roots()}}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get("https://staged.tailnet.test/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %s", resp.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no HTTPS with a certificate from the configured CA: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := staging.Issued("staged.tailnet.test"); got != 1 {
		t.Errorf("the configured CA issued %d certificates, want 1", got)
	}
	if got := lt.ACME.Orders("staged.tailnet.test"); got != 0 {
		t.Errorf("the process's default CA got %d orders, want none", got)
	}
}
