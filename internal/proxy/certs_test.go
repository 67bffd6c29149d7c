package proxy

import (
	"crypto/tls"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// Each host of a bring-your-own certificate is judged alone: served when its Secret holds a
// kubernetes.io/tls certificate valid now and for the host, reported SecretInvalid with the
// reason otherwise, and left unjudged while its Secret was not seen yet.
func TestJudgeHosts(t *testing.T) {
	ca := proxytest.NewCA(t)
	issue := func(name string, age time.Duration) *tls.Certificate {
		ca.Backdate(age)
		defer ca.Backdate(0)
		c, err := ca.Certificate(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tlsSecret := func(c *tls.Certificate) secretState {
		certPEM, keyPEM := proxytest.PEM(t, c)
		return newSecretState(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}, nil)
	}
	app := issue("app.example.com", 0)
	future := issue("soon.example.com", -time.Hour)
	certPEM, _ := proxytest.PEM(t, app)
	states := map[string]secretState{
		"app":      tlsSecret(app),
		"expired":  tlsSecret(issue("old.example.com", 2*time.Hour)),
		"future":   tlsSecret(future),
		"other":    tlsSecret(issue("other.example.com", 0)),
		"opaque":   newSecretState(&corev1.Secret{Type: corev1.SecretTypeOpaque}, nil),
		"garbled":  newSecretState(&corev1.Secret{Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: []byte("no key")}}, nil),
		"empty":    newSecretState(&corev1.Secret{Type: corev1.SecretTypeTLS}, nil),
		"missing":  newSecretState(nil, nil),
		"denied":   newSecretState(nil, errForbidden{}),
		"fallback": tlsSecret(issue("both.example.com", 0)),
	}
	ref := func(secret string, hosts ...string) contract.CertificateRef {
		return contract.CertificateRef{SecretName: secret, Hosts: hosts}
	}
	ws := contract.WebService{TLS: contract.WebTLS{Certificates: []contract.CertificateRef{
		ref("app", "app.example.com", "APP2.example.com"),
		ref("expired", "old.example.com"), ref("future", "soon.example.com"), ref("other", "wrong.example.com"),
		ref("opaque", "opaque.example.com"), ref("garbled", "garbled.example.com"), ref("empty", "empty.example.com"),
		ref("missing", "missing.example.com"), ref("denied", "denied.example.com"), ref("unseen", "unseen.example.com"),
		ref("missing", "both.example.com"), ref("fallback", "both.example.com"), // the first usable one serves
	}}}
	lookup := func(name string) (secretState, bool) {
		st, ok := states[name]
		return st, ok
	}
	now := time.Now()
	hc := judgeHosts(ws, lookup, now)

	if hc.certs["app.example.com"] != states["app"].pair || hc.certs["both.example.com"] != states["fallback"].pair {
		t.Errorf("usable certificates not served: %v", hc.certs)
	}
	if cs := hc.status["app.example.com"]; cs.Source != contract.CertSourceSecret || cs.Serial != hex.EncodeToString(app.Leaf.SerialNumber.Bytes()) ||
		!cs.NotAfter.Equal(app.Leaf.NotAfter) || cs.Reason != "" {
		t.Errorf("app.example.com: %+v", cs)
	}
	// The certificate is for app.example.com only.
	for host, want := range map[string]string{
		"APP2.example.com":    "Secret app: its certificate is not for APP2.example.com",
		"old.example.com":     "Secret expired: its certificate expired at",
		"soon.example.com":    "Secret future: its certificate is not valid before",
		"wrong.example.com":   "Secret other: its certificate is not for wrong.example.com",
		"opaque.example.com":  `Secret opaque: it is of type "Opaque", not kubernetes.io/tls`,
		"garbled.example.com": "Secret garbled: its tls.crt and tls.key are not a certificate and its key",
		"empty.example.com":   "Secret empty: it holds no certificate",
		"missing.example.com": "Secret missing: it does not exist",
		"denied.example.com":  "Secret denied: reading it failed: forbidden",
	} {
		if c := hc.certs[host]; c != nil {
			t.Errorf("%s is served", host)
		}
		if cs := hc.status[host]; cs.Reason != contract.CertReasonSecretInvalid || !strings.HasPrefix(cs.Message, want) || cs.Serial != "" {
			t.Errorf("%s: %+v, want SecretInvalid: %s", host, cs, want)
		}
	}
	if c, ok := hc.certs["unseen.example.com"]; !ok || c != nil {
		t.Error("a host whose Secret was not seen yet is not refused")
	}
	if _, ok := hc.status["unseen.example.com"]; ok {
		t.Error("a host whose Secret was not seen yet is reported")
	}
	// Judged again when the first certificate expires, or one becomes valid.
	if hc.next.IsZero() || hc.next.After(app.Leaf.NotAfter) {
		t.Errorf("judged again at %v, want by %v, when app.example.com expires", hc.next, app.Leaf.NotAfter)
	}
	soon := contract.WebService{TLS: contract.WebTLS{Certificates: []contract.CertificateRef{ref("future", "soon.example.com")}}}
	if next := judgeHosts(soon, lookup, now).next; !next.Equal(future.Leaf.NotBefore) {
		t.Errorf("judged again at %v, want when soon.example.com becomes valid, %v", next, future.Leaf.NotBefore)
	}
	if !hc.serving() || judgeHosts(contract.WebService{}, lookup, now).serving() {
		t.Error("serving")
	}
}

type errForbidden struct{}

func (errForbidden) Error() string { return "forbidden" }

// A certificate that no CA just handed over must verify as tailscaled verifies its cache: to a
// system or built-in root, or to any root when the ACME directory is not Let's Encrypt's; and
// serve the name now.
func TestParseCached(t *testing.T) {
	ca := proxytest.NewCA(t)
	c, err := ca.Certificate(t.Context(), "web.tailnet.test")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := proxytest.PEM(t, c)
	now := time.Now()
	for _, dir := range []string{"", "https://acme-v02.api.letsencrypt.org/directory"} {
		t.Setenv(acmeDirectoryEnv, dir)
		if _, err := parseCached(certPEM, keyPEM, "web.tailnet.test", now); err == nil {
			t.Errorf("directory %q: a certificate of an unknown root was accepted", dir)
		}
	}
	t.Setenv(acmeDirectoryEnv, "https://acme-staging-v02.api.letsencrypt.org/directory")
	got, err := parseCached(certPEM, keyPEM, "web.tailnet.test", now)
	if err != nil || got.leaf.SerialNumber.Cmp(c.Leaf.SerialNumber) != 0 {
		t.Errorf("staging: %v", err)
	}
	if _, err := parseCached(certPEM, keyPEM, "other.tailnet.test", now); err == nil {
		t.Error("a certificate for another name was accepted")
	}
	if _, err := parseCached(certPEM, keyPEM, "web.tailnet.test", c.Leaf.NotAfter); err == nil {
		t.Error("an expired certificate was accepted")
	}
	_, otherKey := proxytest.PEM(t, mustIssue(t, ca, "web.tailnet.test"))
	if _, err := parseCached(certPEM, otherKey, "web.tailnet.test", now); err == nil {
		t.Error("a certificate with another's key was accepted")
	}
}

func mustIssue(t *testing.T, ca *proxytest.CA, name string) *tls.Certificate {
	t.Helper()
	c, err := ca.Certificate(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
