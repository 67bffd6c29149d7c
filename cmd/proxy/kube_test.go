package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"tailscale.com/net/netns"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// Kubernetes mode through a kubeconfig, as the local development environment runs proxies:
// the namespace comes from the kubeconfig's context and the Pod UID from POD_UID.
func TestKubernetesMode(t *testing.T) {
	netns.SetEnabled(false) // in-process tailnet node without privileges
	kube := proxytest.StartKube(t)
	lt, api := localtailnettest.Start(t, localtailnet.Options{})
	key, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{
		Kind: contract.KindIngress, Hostname: "web", Tags: []string{"tag:k8s"}, ControlURL: lt.ControlURL,
		AuthKey: key.Secret.Reveal(), StateSecret: "web-0",
		Serve: &contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://127.0.0.1:1"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	kube.Secret(t, "tailscale", "web-0", data)

	kc, err := clientcmd.Load(kube.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	kc.Contexts[kc.CurrentContext].Namespace = "tailscale"
	kcPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kcPath); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kcPath)
	t.Setenv("POD_NAMESPACE", "")
	t.Setenv("POD_UID", "uid-1")

	t.Run("check config", func(t *testing.T) {
		var out, errOut bytes.Buffer
		code := run(t.Context(), []string{"--config-secret", "web-0", "--check-config"}, &out, &errOut)
		v := contract.ProxyConfigs.Newest()
		if code != 0 || !strings.Contains(out.String(), fmt.Sprintf("config v%d ok: ProxyConfig{v%d ingress web", v, v)) {
			t.Errorf("code %d, stdout %q, stderr %q", code, out.String(), errOut.String())
		}
		if strings.Contains(out.String()+errOut.String(), key.Secret.Reveal()) {
			t.Error("auth key printed")
		}
	})

	t.Run("run", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var out, errOut bytes.Buffer
		code := make(chan int, 1)
		go func() {
			code <- run(ctx, []string{"--config-secret", "web-0", "--health-addr", "", "--state-dir", t.TempDir()}, &out, &errOut)
		}()
		deadline := time.Now().Add(20 * time.Second)
		for {
			sec, err := kube.Client.CoreV1().Secrets("tailscale").Get(t.Context(), "web-0", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			st, err := contract.ParseState(sec.Data)
			if err == nil && st.DeviceID != "" && st.PodUID == "uid-1" {
				break
			}
			select {
			case c := <-code:
				t.Fatalf("run returned %d early: %s", c, errOut.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no device_id and pod_uid in the state Secret: %+v", st)
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel() // SIGTERM
		if c := <-code; c != 0 {
			t.Errorf("exit code %d after SIGTERM: %s", c, errOut.String())
		}
		if !strings.Contains(errOut.String(), "logged in to the tailnet") || strings.Contains(errOut.String(), key.Secret.Reveal()) {
			t.Errorf("logs:\n%s", errOut.String())
		}
	})
}
