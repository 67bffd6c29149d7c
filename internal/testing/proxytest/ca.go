package proxytest

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
	"sync"
	"testing"
	"time"
)

// CA is a certificate authority generated in a test: a proxy.CertSource that issues
// certificates for any name, and the pool a client needs to trust them.
type CA struct {
	root    *x509.Certificate
	rootKey *ecdsa.PrivateKey

	mu     sync.Mutex
	issued map[string]int // how many certificates each name got
	age    time.Duration
}

// Backdate makes the next certificates this old already (of their one hour): past two thirds
// of it, a server should renew them.
func (ca *CA) Backdate(age time.Duration) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	ca.age = age
}

// NewCA generates a root.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tsingress test CA"},
		NotBefore:             time.Now().Add(-2 * time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{root: root, rootKey: key, issued: map[string]int{}}
}

// Pool holds the root, for clients.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.root)
	return p
}

// RootPEM is the root certificate in PEM, as a CA bundle holds it.
func (ca *CA) RootPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.root.Raw}))
}

// Issued reports how many certificates were issued for name.
func (ca *CA) Issued(name string) int {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.issued[name]
}

// Certificate issues a fresh certificate for name; it is a proxy.CertSource.
func (ca *CA) Certificate(_ context.Context, name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	age := ca.age
	ca.mu.Unlock()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-age),
		NotAfter:     time.Now().Add(time.Hour - age),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.root, &key.PublicKey, ca.rootKey)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca.mu.Lock()
	ca.issued[name]++
	ca.mu.Unlock()
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// PEM encodes a certificate's chain and key, as a kubernetes.io/tls Secret holds them.
func PEM(t testing.TB, cert *tls.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})
}
