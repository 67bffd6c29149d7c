package controller

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/ingress"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// selfSigned returns PEM certificate and key for hosts, valid from notBefore to notAfter.

func tlsSecret(ns, name string, certPEM, keyPEM []byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
}

func TestCheckTLSSecret(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	certPEM, keyPEM := proxytest.SelfSigned(t, []string{"app.example.com", "*.apps.example.com"}, now.Add(-time.Hour), now.Add(30*24*time.Hour))
	oldPEM, oldKey := proxytest.SelfSigned(t, []string{"app.example.com"}, now.Add(-60*24*time.Hour), now.Add(-time.Hour))
	_, otherKey := proxytest.SelfSigned(t, []string{"app.example.com"}, now.Add(-time.Hour), now.Add(time.Hour))
	cases := map[string]struct {
		secret *corev1.Secret
		hosts  []string
		reason string
	}{
		"valid":             {tlsSecret("ns", "s", certPEM, keyPEM), []string{"app.example.com", "x.apps.example.com"}, ""},
		"expired":           {tlsSecret("ns", "s", oldPEM, oldKey), []string{"app.example.com"}, kit.ReasonCertificateExpired},
		"other host":        {tlsSecret("ns", "s", certPEM, keyPEM), []string{"shop.example.com"}, kit.ReasonCertificateHostMismatch},
		"key of other cert": {tlsSecret("ns", "s", certPEM, otherKey), []string{"app.example.com"}, kit.ReasonTLSSecretInvalid},
		"not PEM":           {tlsSecret("ns", "s", []byte("junk"), keyPEM), []string{"app.example.com"}, kit.ReasonTLSSecretInvalid},
		"opaque": {&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}, []string{"app.example.com"}, kit.ReasonTLSSecretWrongType},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			notAfter, f := certs.CheckTLSSecret(c.secret, c.hosts, now)
			switch {
			case c.reason == "" && f != nil:
				t.Fatalf("finding %s: %s", f.Reason, f.Message)
			case c.reason == "" && !notAfter.Equal(now.Add(30*24*time.Hour)):
				t.Errorf("notAfter = %s", notAfter)
			case c.reason != "" && (f == nil || f.Reason != c.reason):
				t.Fatalf("finding = %+v, want reason %s", f, c.reason)
			}
		})
	}
}

func TestBYOEntries(t *testing.T) {
	ing := &networkingv1.Ingress{Spec: networkingv1.IngressSpec{TLS: []networkingv1.IngressTLS{
		{Hosts: []string{"app.example.com"}, SecretName: "app-tls"},  // custom host with its Secret
		{Hosts: []string{"shop"}, SecretName: "ignored"},             // tailnet name: secretName ignored, as in the original
		{Hosts: []string{"web.tail1234.ts.net"}, SecretName: "also"}, // tailnet name too
		{Hosts: []string{"api.example.com"}},                         // no Secret: a tailnet hostname "api"
	}}}
	if got := kit.TLSHost(ing); got != "shop" {
		t.Errorf("tailnet host = %q, want shop (the first entry that is not bring-your-own)", got)
	}
	if got := certs.BYOHosts(ing); len(got) != 1 || !got["app.example.com"] {
		t.Errorf("custom hosts = %v, want app.example.com only", got)
	}
	if got := ingress.TLSSecretNames(ing); len(got) != 1 || got[0] != "app-tls" {
		t.Errorf("watched Secrets = %v", got)
	}
}

func TestRouteHosts(t *testing.T) {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}, Spec: networkingv1.IngressSpec{
		TLS: []networkingv1.IngressTLS{{Hosts: []string{"shop"}}, {Hosts: []string{"App.Example.com"}, SecretName: "app-tls"}},
		Rules: []networkingv1.IngressRule{
			kubeobj.Rule("app.example.com", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", "admin"))),
			kubeobj.Rule("shop", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", "http"))),
			kubeobj.Rule("other.example.com", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", "http"))),
		},
	}}
	services := map[string]*corev1.Service{"web": kubeobj.Service("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80}, corev1.ServicePort{Name: "admin", Port: 8080})}
	ws, findings := ingress.BuildWebService(ing, ingress.RouteInputs{Services: services})
	want := []contract.Route{
		{Host: "app.example.com", Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://10.96.0.10:8080"}},
		{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://10.96.0.10:80"}},
	}
	if !reflect.DeepEqual(ws.Routes, want) {
		t.Errorf("routes = %+v\nwant %+v", ws.Routes, want)
	}
	if len(findings) != 1 || findings[0].Reason != kit.ReasonUnsupportedHost {
		t.Errorf("findings = %+v, want one %s for other.example.com", findings, kit.ReasonUnsupportedHost)
	}
}

func TestCertPortError(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	fresh := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "01", NotBefore: now.Add(-24 * time.Hour), NotAfter: now.Add(89 * 24 * time.Hour)}
	old := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "02", NotBefore: now.Add(-61 * 24 * time.Hour), NotAfter: now.Add(29 * 24 * time.Hour)}
	hold := &contract.IssuanceHold{Reason: kit.ReasonCertificateRateLimited}
	failed := contract.CertificateStatus{Reason: contract.CertReasonIssuanceFailed, Message: "connection refused"}
	for _, c := range []struct {
		hold *contract.IssuanceHold
		cur  contract.CertificateStatus
		want string
	}{
		{nil, fresh, ""},
		{hold, old, ""}, // held, but a valid certificate is served meanwhile
		{hold, contract.CertificateStatus{}, kit.ReasonCertificateRateLimited},
		{nil, failed, kit.ReasonCertificateIssueFailed},
		{nil, contract.CertificateStatus{}, ""}, // not obtained yet
	} {
		if got := certs.CertPortError(c.hold, c.cur, now); got != c.want {
			t.Errorf("certPortError(%v, %+v) = %q, want %q", c.hold, c.cur, got, c.want)
		}
	}
}

// ledgerOf reads the guard's account of one registered domain.
func ledgerOf(g Gomega, domain string) *acmebudget.Ledger {
	return ledgerIn(g, testSetup.Namespace, domain)
}

// ledgerIn reads a domain's account from the ledger's segments in namespace ns.
func ledgerIn(g Gomega, ns, domain string) *acmebudget.Ledger {
	segs, err := certs.ListLedgerSegments(ctx, k8s, ns)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(segs).NotTo(BeEmpty())
	var parts []*acmebudget.Ledger
	for _, seg := range segs {
		if v := seg.CM.Data[certs.LedgerKey(domain)]; v != "" {
			l := &acmebudget.Ledger{}
			g.Expect(json.Unmarshal([]byte(v), l)).To(Succeed())
			parts = append(parts, l)
		}
	}
	return acmebudget.Union(parts...)
}

// writeLedger replaces the account of one registered domain, as if certificates had been
// issued, in the one ConfigMap an operator before ledger segments kept.
func writeLedger(domain string, l *acmebudget.Ledger) {
	b, err := json.Marshal(l)
	Expect(err).NotTo(HaveOccurred())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: certs.LedgerConfigMap,
		Labels: map[string]string{kit.LabelManaged: "true"}}}
	err = k8s.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	if err != nil {
		cm.Data = map[string]string{domain + ".json": string(b)}
		Expect(k8s.Create(ctx, cm)).To(Succeed())
		return
	}
	cm.Data[domain+".json"] = string(b)
	Expect(k8s.Update(ctx, cm)).To(Succeed())
}

func portError(ing *networkingv1.Ingress) string {
	for _, lb := range ing.Status.LoadBalancer.Ingress {
		for _, p := range lb.Ports {
			if p.Error != nil {
				return lb.Hostname + ":" + *p.Error
			}
		}
	}
	return ""
}
