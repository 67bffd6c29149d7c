package web

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"tailscale.com/client/local"
)

// CertSource supplies the TLS certificate for a MagicDNS name.
type CertSource interface {
	Certificate(ctx context.Context, name string) (*tls.Certificate, error)
}

// TailnetCerts obtains certificates through the tailnet client's own flow: ACME (DNS-01 through
// the control plane), with the client caching and renewing them in its state store.
type TailnetCerts struct {
	Client *local.Client
}

// Certificate implements CertSource.
func (c TailnetCerts) Certificate(ctx context.Context, name string) (*tls.Certificate, error) {
	certPEM, keyPEM, err := c.Client.CertPair(ctx, name)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &cert, nil
}

// certCache holds the certificate for the served name, so that handshakes do not each ask the
// source, and renews it in the background once two thirds of its lifetime have passed.
type certCache struct {
	src CertSource
	log *slog.Logger

	mu         sync.Mutex
	name       string
	cert       *tls.Certificate
	refreshing bool
	nextTry    time.Time // after a failed renewal, so that handshakes do not hammer the source
}

// setName changes the served name, dropping a certificate for the old one.
func (c *certCache) setName(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if name != c.name {
		c.name, c.cert = name, nil
	}
}

func (c *certCache) currentName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.name
}

// obtain fetches the certificate for the current name from the source.
func (c *certCache) obtain(ctx context.Context) error {
	c.mu.Lock()
	name := c.name
	c.mu.Unlock()
	if name == "" {
		return errors.New("no name to get a certificate for")
	}
	cert, err := c.src.Certificate(ctx, name)
	if err != nil {
		return fmt.Errorf("certificate for %s: %w", name, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("certificate for %s: %w", name, err)
		}
	}
	if err := cert.Leaf.VerifyHostname(name); err != nil {
		return fmt.Errorf("certificate from the source does not cover %s: %w", name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.name == name {
		c.cert = cert
	}
	return nil
}

// getCertificate is the TLS server's GetCertificate: the one name's certificate, whatever the
// SNI (a client may connect by IP).
func (c *certCache) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert == nil {
		return nil, fmt.Errorf("no certificate for %q yet", c.name)
	}
	leaf := c.cert.Leaf
	renewAt := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
	if now := time.Now(); now.After(renewAt) && now.After(c.nextTry) && !c.refreshing {
		c.refreshing = true
		go c.refresh()
	}
	return c.cert, nil
}

// refresh renews in the background; until it succeeds the current certificate is served.
func (c *certCache) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := c.obtain(ctx)
	if err != nil {
		c.log.Warn("renewing the certificate failed; serving the current one", "err", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshing = false
	if err != nil {
		c.nextTry = time.Now().Add(time.Minute)
	}
}
