//go:build e2e

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/test/framework"
)

var _ = Describe("A standalone Ingress with a bring-your-own certificate", func() {
	It("serves its custom host with the Secret's certificate beside the tailnet name, and drops it once expired", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		host, custom := "e2e-byo-"+framework.Token(), "app-"+framework.Token()+".example.com"
		ca := newTestCA()
		now := time.Now()
		data, leaf := ca.issue(custom, now.Add(-time.Hour), now.Add(24*time.Hour))
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app-tls"}, Type: corev1.SecretTypeTLS, Data: data}
		suite.Create(ctx, secret)
		ing := framework.Ingress(ns, "byo", host, "")
		ing.Spec.TLS = append(ing.Spec.TLS, networkingv1.IngressTLS{Hosts: []string{custom}, SecretName: secret.Name})
		ing.Spec.Rules = []networkingv1.IngressRule{{Host: custom, IngressRuleValue: networkingv1.IngressRuleValue{
			HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{
				Path: "/", PathType: ptr.To(networkingv1.PathTypePrefix),
				Backend: *ing.Spec.DefaultBackend,
			}}},
		}}}
		suite.Create(ctx, ing)
		operator := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "operator", Namespace: suite.opNS}
		if suite.localBackend == "" {
			By("refusing to read the Secret until the namespace's owner lets the operator (RBAC as deployed)")
			expectWarning(ctx, ing, kit.ReasonTLSSecretNotPermitted)
			suite.Create(ctx, kubeobj.TLSSecretReaderBinding(ns, operator))
			Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			// What the API server returns has no annotations map when the Ingress has none.
			if ing.Annotations == nil {
				ing.Annotations = map[string]string{}
			}
			ing.Annotations["e2e/touch"] = "allowed"
			Expect(suite.K8s.Update(ctx, ing)).To(Succeed())
		} else {
			// The local environment's operator runs as an administrator.
			suite.Create(ctx, kubeobj.TLSSecretReaderBinding(ns, operator))
		}

		var fqdn string
		Eventually(ctx, func(g Gomega) {
			hosts := statusHosts(ctx, g, ing)
			g.Expect(hosts).To(ContainElement(HavePrefix(host+"."), &fqdn), "the tailnet name")
			g.Expect(hosts).To(ConsistOf(fqdn, custom))
		}).Should(Succeed(), "Ingress %s/%s status lists the tailnet name and %s", ns, ing.Name, custom)
		addr := netip.AddrPortFrom(peerIPv4(ctx, fqdn), 443).String()

		By("serving the custom host at the proxy's tailnet address with the test CA's certificate")
		expectCustomHost(ctx, addr, custom, ca, leaf)
		expectTailnetName(ctx, addr, fqdn)

		By("dropping the custom host with a CertificateExpired Event once its Secret holds an expired certificate")
		Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(secret), secret)).To(Succeed())
		secret.Data, _ = ca.issue(custom, now.Add(-48*time.Hour), now.Add(-time.Hour))
		Expect(suite.K8s.Update(ctx, secret)).To(Succeed())
		expectWarning(ctx, ing, "CertificateExpired")
		Eventually(ctx, func(g Gomega) {
			g.Expect(statusHosts(ctx, g, ing)).To(Equal([]string{fqdn}))
			cs, err := handshake(ctx, g, addr, &tls.Config{ServerName: custom, RootCAs: ca.pool})
			g.Expect(err).To(HaveOccurred(), "TLS for %s still verifies, presenting %v", custom, peerNames(cs))
		}).Should(Succeed(), "%s no longer served", custom)
		expectTailnetName(ctx, addr, fqdn)
	})
})

// expectCustomHost waits until the proxy at addr presents leaf, issued by ca, for host, and
// answers requests for host through it from the backend.
func expectCustomHost(ctx context.Context, addr, host string, ca *testCA, leaf *x509.Certificate) {
	GinkgoHelper()
	Eventually(ctx, func(g Gomega) {
		cs, err := handshake(ctx, g, addr, &tls.Config{ServerName: host, RootCAs: ca.pool})
		g.Expect(err).NotTo(HaveOccurred(), "TLS for %s at %s", host, addr)
		g.Expect(cs.PeerCertificates[0].Raw).To(Equal(leaf.Raw), "the Secret's certificate")
	}).Should(Succeed())
	expectEcho(ctx, customHostClient(addr, ca.pool), "https://"+host)
}

// statusHosts lists the names in an Ingress's status.loadBalancer.
func statusHosts(ctx context.Context, g Gomega, ing *networkingv1.Ingress) []string {
	g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
	var hosts []string
	for _, lb := range ing.Status.LoadBalancer.Ingress {
		hosts = append(hosts, lb.Hostname)
	}
	return hosts
}

// peerIPv4 waits until the suite's client sees the device named fqdn, and returns its IPv4:
// custom hosts have no MagicDNS name, so clients reach them at the proxy's address.
func peerIPv4(ctx context.Context, fqdn string) netip.Addr {
	GinkgoHelper()
	lc, err := suite.Client.LocalClient()
	Expect(err).NotTo(HaveOccurred())
	var ip netip.Addr
	Eventually(ctx, func(g Gomega) {
		st, err := lc.Status(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		for _, p := range st.Peer {
			if strings.TrimSuffix(p.DNSName, ".") == fqdn {
				for _, a := range p.TailscaleIPs {
					if a.Is4() {
						ip = a
					}
				}
			}
		}
		g.Expect(ip.IsValid()).To(BeTrue(), "an IPv4 of peer %s", fqdn)
	}).Should(Succeed(), "the client sees %s", fqdn)
	return ip
}

// handshake connects to addr over the tailnet and does a TLS handshake with cfg. Only the
// handshake's error is returned: an unreachable proxy fails g, so it cannot pass for a refusal.
func handshake(ctx context.Context, g Gomega, addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := suite.Dial(dctx, "tcp", addr)
	g.Expect(err).NotTo(HaveOccurred(), "connecting to %s over the tailnet", addr)
	defer conn.Close()
	tc := tls.Client(conn, cfg)
	err = tc.HandshakeContext(dctx)
	return tc.ConnectionState(), err
}

func peerNames(cs tls.ConnectionState) []string {
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	return cs.PeerCertificates[0].DNSNames
}

// customHostClient sends every request to addr over the tailnet, so that SNI and Host are the
// URL's host, trusting only roots.
func customHostClient(addr string, roots *x509.CertPool) *http.Client {
	hc := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return suite.Dial(ctx, network, addr)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
	DeferCleanup(hc.CloseIdleConnections)
	return hc
}

// expectTailnetName checks that the tailnet name is still served with its ACME certificate,
// at addr and by its MagicDNS name, and answers from the backend.
func expectTailnetName(ctx context.Context, addr, fqdn string) {
	GinkgoHelper()
	Eventually(ctx, func(g Gomega) {
		cs, err := handshake(ctx, g, addr, &tls.Config{ServerName: fqdn, RootCAs: suite.roots})
		g.Expect(err).NotTo(HaveOccurred(), "TLS for %s at %s", fqdn, addr)
		g.Expect(cs.PeerCertificates[0].DNSNames).To(ContainElement(fqdn))
	}).Should(Succeed())
	expectHTTPSEcho(ctx, fqdn)
}

// testCA issues certificates that only this spec trusts.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA() *testCA {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tsingress e2e CA " + framework.Token()},
		NotBefore: time.Now().Add(-72 * time.Hour), NotAfter: time.Now().Add(72 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	Expect(err).NotTo(HaveOccurred())
	cert, err := x509.ParseCertificate(der)
	Expect(err).NotTo(HaveOccurred())
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns the data of a kubernetes.io/tls Secret (a certificate for host, valid from
// notBefore to notAfter, followed by the CA's, and its key) and the certificate.
func (ca *testCA) issue(host string, notBefore, notAfter time.Time) (map[string][]byte, *x509.Certificate) {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	Expect(err).NotTo(HaveOccurred())
	leaf, err := x509.ParseCertificate(der)
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})...)
	return map[string][]byte{
		corev1.TLSCertKey:       chain,
		corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, leaf
}
