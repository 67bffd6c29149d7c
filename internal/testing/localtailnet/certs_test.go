package localtailnet_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"tailscale.com/client/local"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localacme"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/poll"
)

// The certificate tests are not parallel: tailscaled reads its ACME directory from the
// process environment, so one CA serves the process at a time.

// startACMETailnet starts a local tailnet with its CA and points this process's tailscaled
// code at the CA.
func startACMETailnet(t *testing.T) *localtailnet.LocalTailnet {
	t.Helper()
	lt := startTailnet(t, localtailnet.Options{ACME: true})
	if err := lt.ACME.UseInProcess(t.Setenv); err != nil {
		t.Fatal(err)
	}
	return lt
}

// verifyChain checks that certPEM is a chain for name that the CA's roots verify.
func verifyChain(t *testing.T, ca *localacme.CA, certPEM []byte, name string) *x509.Certificate {
	t.Helper()
	var certs []*x509.Certificate
	for rest := certPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, c)
	}
	if len(certs) < 2 {
		t.Fatalf("got %d certificates, want a leaf and its intermediate", len(certs))
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{DNSName: name, Roots: ca.Roots(), Intermediates: inter}); err != nil {
		t.Fatalf("certificate for %s does not verify against the CA: %v", name, err)
	}
	return certs[0]
}

// httpsGet fetches url through node, verifying the server against the CA's roots, retrying
// until the tailnet has a path.
func httpsGet(t *testing.T, node *tsnet.Server, ca *localacme.CA, url string) (string, *x509.Certificate) {
	t.Helper()
	c := &http.Client{
		Timeout: 20 * time.Second,
		Transport: &http.Transport{
			DialContext:     node.Dial,
			TLSClientConfig: &tls.Config{RootCAs: ca.Roots()},
		},
	}
	defer c.CloseIdleConnections()
	var lastErr error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		res, err := c.Get(url)
		if err != nil {
			lastErr = err
			continue
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		return string(body), res.TLS.PeerCertificates[0]
	}
	t.Fatalf("GET %s: %v", url, lastErr)
	return "", nil
}

// serveHTTP answers every request on ln with body.
func serveHTTP(t *testing.T, ln net.Listener, body string) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	})}
	go func() { _ = srv.Serve(ln) }() // returns once srv closes
	t.Cleanup(func() { srv.Close() })
}

// lookupTXT asks the tailnet's DNS server for the TXT records of name over network.
func lookupTXT(t *testing.T, lt *localtailnet.LocalTailnet, network, name string) ([]string, int) {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeTXT)
	res, _, err := (&dns.Client{Net: network, Timeout: 5 * time.Second}).Exchange(q, lt.DNSAddr)
	if err != nil {
		t.Fatalf("DNS over %s: %v", network, err)
	}
	var vals []string
	for _, rr := range res.Answer {
		vals = append(vals, strings.Join(rr.(*dns.TXT).Txt, ""))
	}
	return vals, res.Rcode
}

// A node gets a certificate for its MagicDNS name through tailscaled's own ACME flow (DNS-01
// through set-dns, validated by the CA against the tailnet's DNS server); the chain verifies
// against the CA's roots, tailscaled keeps it, and a peer sees it served.
func TestNodeCertificate(t *testing.T) {
	lt := startACMETailnet(t)
	c := apiClient(t, lt, nil)
	web := joinNode(t, lt, "web", mintKey(t, c, "web"))
	const name = "web.tailnet.test"
	lc, err := web.LocalClient()
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	certPEM, keyPEM, err := lc.CertPair(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("issued a certificate for %s in %v", name, time.Since(start))
	leaf := verifyChain(t, lt.ACME, certPEM, name)
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Errorf("key and certificate do not match: %v", err)
	}
	if o, i := lt.ACME.Orders(name), lt.ACME.Issued(name); o != 1 || i != 1 {
		t.Errorf("CA saw %d orders and issued %d certificates for %s, want 1 and 1", o, i, name)
	}
	if o, i := lt.ACME.OrderTotals(); o != 1 || i != 1 {
		t.Errorf("CA totals: %d orders, %d issued, want 1 and 1", o, i)
	}

	again, _, err := lc.CertPair(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, certPEM) {
		t.Error("second request got another certificate")
	}

	// tsnet's ListenTLS takes its certificate from the LocalAPI, as a proxy's listener does.
	ln, err := web.ListenTLS("tcp", ":443")
	if err != nil {
		t.Fatal(err)
	}
	serveHTTP(t, ln, "hello from web")
	client := joinNode(t, lt, "client", mintKey(t, c, "client"))
	body, served := httpsGet(t, client, lt.ACME, "https://"+name+"/")
	if body != "hello from web" || !served.Equal(leaf) {
		t.Errorf("served %q with certificate serial %v, want the issued one, serial %v", body, served.SerialNumber, leaf.SerialNumber)
	}
	if o := lt.ACME.Orders(name); o != 1 {
		t.Errorf("CA saw %d orders for %s after the cached uses, want 1", o, name)
	}
}

// A node that hosts a Tailscale Service gets the service's name among its cert domains and a
// certificate for it, issued on the first HTTPS request as in an HA ProxyGroup.
func TestServiceCertificate(t *testing.T) {
	lt := startACMETailnet(t)
	c := apiClient(t, lt, nil)
	if _, err := c.PutService(t.Context(), tailnet.Service{Name: "svc:web", Ports: []string{"tcp:443"}}); err != nil {
		t.Fatal(err)
	}
	const name = "web.tailnet.test"
	host := joinNode(t, lt, "web-0", mintKey(t, c, "web-0"))
	ln, err := host.ListenService("svc:web", tsnet.ServiceModeHTTP{Port: 443, HTTPS: true})
	if err != nil {
		t.Fatal(err)
	}
	serveHTTP(t, ln, "hello from web-0")
	poll.True(t, 10*time.Second, "the host to get the service's cert domain", func() bool { return slices.Contains(host.CertDomains(), name) })
	client := joinNode(t, lt, "client", mintKey(t, c, "client"))
	if cd := client.CertDomains(); !slices.Equal(cd, []string{"client.tailnet.test"}) {
		t.Errorf("a node that does not host the service has cert domains %v", cd)
	}

	start := time.Now()
	body, served := httpsGet(t, client, lt.ACME, "https://"+name+"/")
	t.Logf("first HTTPS request to %s, issuance included, took %v", name, time.Since(start))
	if body != "hello from web-0" {
		t.Errorf("body %q", body)
	}
	if err := served.VerifyHostname(name); err != nil {
		t.Error(err)
	}

	// The HA issuer's cert loop asks as the LocalAPI client it is.
	lc, err := host.LocalClient()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := lc.CertPair(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if leaf := verifyChain(t, lt.ACME, certPEM, name); !leaf.Equal(served) {
		t.Error("CertPair returned another certificate than the one served")
	}
	if o, i := lt.ACME.Orders(name), lt.ACME.Issued(name); o != 1 || i != 1 {
		t.Errorf("CA saw %d orders and issued %d certificates for %s, want 1 and 1", o, i, name)
	}
}

// A rate-limited new order is retried by tailscaled after Retry-After, within the same call.
func TestCertificateRateLimited(t *testing.T) {
	lt := startACMETailnet(t)
	c := apiClient(t, lt, nil)
	node := joinNode(t, lt, "limited", mintKey(t, c, "limited"))
	const name = "limited.tailnet.test"
	lc, err := node.LocalClient()
	if err != nil {
		t.Fatal(err)
	}

	lt.ACME.InjectRateLimit(localacme.RateLimit{RetryAfter: time.Second})
	start := time.Now()
	certPEM, _, err := lc.CertPair(t.Context(), name)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("issued after one 429 in %v", elapsed)
	verifyChain(t, lt.ACME, certPEM, name)
	if n, o := lt.ACME.RateLimited(), lt.ACME.Orders(name); n != 1 || o != 1 || elapsed < time.Second {
		t.Errorf("%d refused and %d accepted orders in %v; want 1 and 1, after waiting the 1 s Retry-After", n, o, elapsed)
	}

	// While a limit lasts, tailscaled (v1.102.5) retries inside the call until the caller's
	// deadline: the caller sees that deadline, not the 429, because the LocalAPI handler
	// gives up only when the caller hangs up. Its rate-limit error (a LocalAPI 429 with
	// Retry-After, for local.RateLimitRetryAfter) cannot reach a LocalAPI client that way.
	lt.ACME.InjectRateLimit(localacme.RateLimit{RetryAfter: time.Second, Times: 100})
	ctx, cancel := context.WithTimeout(t.Context(), 2200*time.Millisecond)
	defer cancel()
	_, _, err = lc.CertPairWithValidity(ctx, name, 100*24*time.Hour) // longer than the certificate lives: renews now
	if _, limited := local.RateLimitRetryAfter(err); !errors.Is(err, context.DeadlineExceeded) || limited {
		t.Errorf("renewal under a lasting rate limit: err = %v, rate-limit error %v; want the caller's deadline", err, limited)
	}
	if n := lt.ACME.RateLimited(); n < 3 {
		t.Errorf("%d refused orders in all, want at least 3: tailscaled retries after Retry-After", n)
	}
}

// A node may publish ACME challenge records for its own cert domains only; the tailnet's DNS
// server answers with what was published, over UDP and TCP.
func TestSetDNS(t *testing.T) {
	t.Parallel()
	lt := startTailnet(t, localtailnet.Options{HTTPS: true})
	c := apiClient(t, lt, nil)
	if _, err := c.PutService(t.Context(), tailnet.Service{Name: "svc:web", Ports: []string{"tcp:443"}}); err != nil {
		t.Fatal(err)
	}
	alpha := joinNode(t, lt, "alpha", mintKey(t, c, "alpha"))
	joinNode(t, lt, "beta", mintKey(t, c, "beta"))
	lc, err := alpha.LocalClient()
	if err != nil {
		t.Fatal(err)
	}

	const own = "_acme-challenge.alpha.tailnet.test"
	for _, v := range []string{"first", "second"} {
		if err := lc.SetDNS(t.Context(), own, v); err != nil {
			t.Fatalf("set-dns for its own name: %v", err)
		}
	}
	for _, network := range []string{"udp", "tcp"} {
		if got, rcode := lookupTXT(t, lt, network, own); rcode != dns.RcodeSuccess || !slices.Equal(got, []string{"first", "second"}) {
			t.Errorf("over %s: TXT %s = %q, rcode %d; want both values", network, own, got, rcode)
		}
	}

	for _, name := range []string{
		"_acme-challenge.beta.tailnet.test",      // a peer's name
		"_acme-challenge.web.tailnet.test",       // a service alpha does not host
		"_acme-challenge.sub.alpha.tailnet.test", // no wildcard certificates here
		"_acme-challenge.example.com",            // outside the tailnet
		"alpha.tailnet.test",                     // not a challenge name
	} {
		err := lc.SetDNS(t.Context(), name, "value")
		if err == nil || !strings.Contains(err.Error(), "403 Forbidden") {
			t.Errorf("set-dns for %s: err = %v, want it refused with 403", name, err)
		}
		if got, rcode := lookupTXT(t, lt, "udp", name); rcode != dns.RcodeNameError {
			t.Errorf("after the refused set-dns, %s has TXT %q, rcode %d", name, got, rcode)
		}
	}
}
