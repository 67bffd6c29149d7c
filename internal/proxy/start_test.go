package proxy_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// A proxy Pod can start before its Role is in effect and before its config Secret exists (an
// API server just back from an outage, a slow operator). It waits in the process, says why in
// /readyz, and serves once both are there; it does not exit into the kubelet's crash back-off.
func TestStartWaitsForTheAPIServer(t *testing.T) {
	env := proxytest.StartKube(t)
	w := newWorld(t)
	if _, err := env.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A user whose Role allows nothing yet: every read is refused (403).
	user := env.User(t, ns, "late-proxy")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	health, done := w.start(t, ctx, proxy.Options{ConfigSecret: "web-0", Kube: user, Namespace: ns, PodUID: "pod-1", StateDir: t.TempDir()})

	eventually(t, "/readyz to say the config cannot be read", func() bool {
		reason := readyz(t, health)
		return strings.Contains(reason, "reading the config") && strings.Contains(reason, "forbidden")
	})
	// Past a few tries, it is still there.
	select {
	case err := <-done:
		t.Fatalf("Run returned while the API server refused it: %v", err)
	case <-time.After(3 * time.Second):
	}

	// The Role takes effect; the config Secret does not exist yet.
	role, err := env.Client.RbacV1().Roles(ns).Get(t.Context(), "late-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.Rules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"web-0"},
		Verbs: []string{"get", "list", "watch", "patch"}}}
	if _, err := env.Client.RbacV1().Roles(ns).Update(t.Context(), role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "/readyz to say the config Secret does not exist", func() bool {
		return strings.Contains(readyz(t, health), "does not exist")
	})

	data, err := contract.ProxyConfigs.Encode(w.config(w.mintKey(t).Secret.Reveal(), contract.WebService{Routes: w.routes()}))
	if err != nil {
		t.Fatal(err)
	}
	env.Secret(t, ns, "web-0", data)
	waitReady(t, health, done)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after a stop: %v", err)
	}
	if !strings.Contains(w.logs.String(), "start step done after failures") {
		t.Errorf("the retries were not logged:\n%s", w.logs.String())
	}
}

// A config of a version this proxy cannot read does not get better by waiting: the proxy exits
// at once, saying so.
func TestStartStopsOnAConfigItCannotRead(t *testing.T) {
	env := proxytest.StartKube(t)
	w := newWorld(t)
	env.Secret(t, ns, "web-0", map[string][]byte{"proxy-config.v99.json": []byte(`{}`)})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, done := w.start(t, ctx, proxy.Options{ConfigSecret: "web-0", Kube: env.ProxyUser(t, ns, "web-0"), Namespace: ns, StateDir: t.TempDir()})
	err := <-done
	if _, ok := errors.AsType[*proxy.ConfigError](err); !ok || !errors.Is(err, contract.ErrNoSupportedVersion) || ctx.Err() != nil {
		t.Fatalf("Run = %v; want a ConfigError for an unsupported version, at once", err)
	}
}

// readyz returns why the proxy is not ready, "" when it is or does not answer.
func readyz(t *testing.T, health string) string {
	t.Helper()
	res, err := http.Get(health + "/readyz")
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusOK {
		return ""
	}
	return string(body)
}
