package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/testenv"
)

// Workload identity federation with a real API server's ServiceAccount tokens: the tailnet's
// OAuth client trusts the cluster's issuer for the operator's ServiceAccount and an audience;
// the control-plane client, given the client ID and a token file but no secret, mints an auth
// key. A token of another ServiceAccount, or for another audience, is refused, and so is the
// operator's once the trust is for another subject.
func TestWorkloadIdentityFederation(t *testing.T) {
	lt, _ := localtailnettest.Start(t, localtailnet.Options{})
	cp, err := testenv.Start(filepath.Join("..", "..", "config", "crd", "bases"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Stop() })
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tailscale"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const audience = "api.tailscale.test"
	token := func(sa, aud string) string {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts("tailscale").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts("tailscale").CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}

	// The cluster's issuer and keys, as its OIDC discovery publishes them.
	var discovery struct {
		Issuer string `json:"issuer"`
	}
	raw, err := cs.RESTClient().Get().AbsPath("/.well-known/openid-configuration").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &discovery); err != nil {
		t.Fatal(err)
	}
	var keys jose.JSONWebKeySet
	raw, err = cs.RESTClient().Get().AbsPath("/openid/v1/jwks").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &keys); err != nil {
		t.Fatal(err)
	}
	trust := localtailnet.FederatedIdentity{Issuer: discovery.Issuer, Audience: audience,
		Subject: "system:serviceaccount:tailscale:operator", Keys: keys}
	lt.TrustIdentity(trust)

	dir := t.TempDir()
	mint := func(name, tok string) error {
		t.Helper()
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		api, err := tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: lt.APIBaseURL, ClientID: lt.OAuthClientID, IDTokenFile: file})
		if err != nil {
			t.Fatal(err)
		}
		k, err := api.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour, Description: "workload identity"})
		if err == nil && k.ID == "" {
			t.Errorf("%s: a key without an ID", name)
		}
		return err
	}
	if err := mint("operator", token("operator", audience)); err != nil {
		t.Fatalf("the operator's token: %v", err)
	}
	for _, tc := range []struct{ name, sa, aud string }{
		{"another ServiceAccount", "intruder", audience},
		{"another audience", "operator", "https://kubernetes.default.svc"},
	} {
		tok := token(tc.sa, tc.aud)
		err := mint(tc.name, tok)
		if tailnet.ReasonOf(err) != tailnet.ReasonUnauthorized {
			t.Errorf("%s: got %v, want %s", tc.name, err, tailnet.ReasonUnauthorized)
		}
		if err != nil && strings.Contains(err.Error(), tok[len(tok)-20:]) {
			t.Errorf("%s: the error carries the identity token", tc.name)
		}
	}
	trust.Subject = "system:serviceaccount:tailscale:someone-else"
	lt.TrustIdentity(trust)
	if err := mint("after the trust changed", token("operator", audience)); tailnet.ReasonOf(err) != tailnet.ReasonUnauthorized {
		t.Errorf("the operator's token for a trust of another subject: got %v, want %s", err, tailnet.ReasonUnauthorized)
	}
}
