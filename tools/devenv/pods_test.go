package main

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tsingress/tsingress/internal/contract"
)

// A proxy whose config asks for an ACME directory other than the process's is not run in it:
// it would move every in-process proxy's certificates there.
func TestNeedsOwnProcess(t *testing.T) {
	const local = "https://127.0.0.1:14000/dir"
	config := func(name, dir string) *corev1.Secret {
		data, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{Kind: contract.KindProxyGroup, Hostname: name,
			Tags: []string{"tag:k8s"}, StateSecret: name, TLS: contract.TLSConfig{ACMEDirectoryURL: dir}})
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "tailscale", Name: name}, Data: data}
	}
	p := &podRunner{acmeDirectory: local, k8s: fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(
		config("plain", ""), config("local", local), config("staging", "https://acme-staging-v02.api.letsencrypt.org/directory"),
	).Build()}
	for name, wantRefused := range map[string]bool{"plain": false, "local": false, "staging": true, "missing": false} {
		why := p.needsOwnProcess(t.Context(), "tailscale", name)
		if (why != "") != wantRefused || (wantRefused && !strings.Contains(why, "acme-staging")) {
			t.Errorf("%s: %q, want refused %v", name, why, wantRefused)
		}
	}
}
