package web

import (
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
)

// certificates are what the HTTPS listener presents: the served tailnet name's certificate, and
// bring-your-own certificates chosen by SNI. A handshake for a bring-your-own host whose
// certificate is unusable fails, rather than presenting the tailnet name's.
type certificates struct {
	mu    sync.RWMutex
	name  string
	cert  *tls.Certificate            // for name; nil while there is none
	hosts map[string]*tls.Certificate // by HostOf; a nil value is a host without a usable certificate
}

func (c *certificates) setName(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if name != c.name {
		c.name, c.cert = name, nil
	}
}

// get is the TLS server's GetCertificate. A server name that is no bring-your-own host (none at
// all, when a client connects by IP) gets the tailnet name's certificate.
func (c *certificates) get(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	sni := HostOf(hello.ServerName)
	c.mu.RLock()
	defer c.mu.RUnlock()
	if cert, ok := c.hostCert(sni); ok {
		if cert == nil {
			return nil, fmt.Errorf("no usable certificate for %q", sni)
		}
		return cert, nil
	}
	if c.cert == nil {
		return nil, fmt.Errorf("no certificate for %q yet", c.name)
	}
	return c.cert, nil
}

// hostCert finds the bring-your-own certificate of host: its own, else that of the wildcard
// covering it ("*.example.com" for a.example.com). ok is false for a host that is neither.
// The caller holds mu.
func (c *certificates) hostCert(host string) (cert *tls.Certificate, ok bool) {
	if cert, ok := c.hosts[host]; ok {
		return cert, true
	}
	if _, parent, found := strings.Cut(host, "."); found {
		cert, ok = c.hosts["*."+parent]
	}
	return cert, ok
}

// redirectHost is where port 80 sends a request for host: to host itself when it is a
// bring-your-own host with a usable certificate, so that the request keeps its host's routes,
// else to the tailnet name.
func (c *certificates) redirectHost(host string) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if cert, ok := c.hostCert(host); ok && cert != nil {
		return host
	}
	return c.name
}

// nameServed is the tailnet name served.
func (c *certificates) nameServed() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.name
}
