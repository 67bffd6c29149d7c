package localacme_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	xacme "tailscale.com/tempfork/acme"

	"github.com/tsingress/tsingress/internal/testing/localacme"
)

// txtServer is the DNS server the CA checks DNS-01 against, over TCP as Pebble asks.
type txtServer struct {
	addr string
	mu   sync.Mutex
	txt  map[string]string // by FQDN
}

func startTXTServer(t *testing.T) *txtServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &txtServer{addr: ln.Addr().String(), txt: map[string]string{}}
	started := make(chan struct{})
	srv := &dns.Server{Listener: ln, NotifyStartedFunc: func() { close(started) }, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		res := new(dns.Msg)
		res.SetReply(req)
		s.mu.Lock()
		v, ok := s.txt[req.Question[0].Name]
		s.mu.Unlock()
		if ok {
			res.Answer = []dns.RR{&dns.TXT{Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{v}}}
		} else {
			res.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(res) // the CA's connection gone: its check fails and says so
	})}
	served := make(chan error, 1)
	go func() { served <- srv.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-served:
		t.Fatalf("DNS server: %v", err)
	}
	t.Cleanup(func() { srv.Shutdown() })
	return s
}

func (s *txtServer) set(name, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.txt[dns.Fqdn(name)] = value
}

func startCA(t *testing.T, dnsServer string) *localacme.CA {
	t.Helper()
	return startCAWith(t, localacme.Options{DNSServer: dnsServer, Logf: t.Logf})
}

func startCAWith(t *testing.T, opts localacme.Options) *localacme.CA {
	t.Helper()
	ca, err := localacme.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ca.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return ca
}

// acmeClient is the ACME client tailscaled uses, trusting the CA's API explicitly.
func acmeClient(t *testing.T, ca *localacme.CA, retry bool) *xacme.Client {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c := &xacme.Client{
		Key:          key,
		DirectoryURL: ca.DirectoryURL,
		HTTPClient:   &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.APIRoots()}}},
	}
	if !retry {
		c.RetryBackoff = func(int, *http.Request, *http.Response) time.Duration { return 0 }
	}
	if _, err := c.Register(t.Context(), new(xacme.Account), xacme.AcceptTOS); err != nil {
		t.Fatal(err)
	}
	return c
}

// order runs an ACME order for name through DNS-01 up to a certificate, publishing the
// challenge record with publish.
func order(ctx context.Context, c *xacme.Client, name string, publish func(name, value string)) ([][]byte, error) {
	o, err := c.AuthorizeOrder(ctx, xacme.DomainIDs(name))
	if err != nil {
		return nil, err
	}
	for _, u := range o.AuthzURLs {
		az, err := c.GetAuthorization(ctx, u)
		if err != nil {
			return nil, err
		}
		for _, ch := range az.Challenges {
			if ch.Type != "dns-01" {
				continue
			}
			rec, err := c.DNS01ChallengeRecord(ch.Token)
			if err != nil {
				return nil, err
			}
			publish("_acme-challenge."+name, rec)
			if _, err := c.Accept(ctx, ch); err != nil {
				return nil, err
			}
		}
	}
	if o, err = c.WaitOrder(ctx, o.URI); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{name}}, key)
	if err != nil {
		return nil, err
	}
	der, _, err := c.CreateOrderCert(ctx, o.FinalizeURL, csr, true)
	return der, err
}

// UseInProcess must come before anything in this process loads the system roots; the other
// tests trust the CA through explicit pools, which does not load them.
func TestUseInProcess(t *testing.T) {
	for i := range 2 { // every CA of the process serves under the root the process loaded
		ca := startCA(t, "127.0.0.1:1")
		if err := ca.UseInProcess(t.Setenv); err != nil {
			t.Fatal(err)
		}
		if got := os.Getenv("TS_DEBUG_ACME_DIRECTORY_URL"); got != ca.DirectoryURL {
			t.Errorf("directory URL in the environment = %q, want %q", got, ca.DirectoryURL)
		}
		res, err := http.Get(ca.DirectoryURL) // Go's default client, as tailscaled's ACME client uses
		if err != nil {
			t.Fatalf("CA %d: %v", i, err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("CA %d: directory: %s", i, res.Status)
		}
	}
}

// The CA issues a certificate once the DNS-01 record is served, refuses to without it, and
// counts both orders.
func TestIssue(t *testing.T) {
	t.Parallel()
	txt := startTXTServer(t)
	ca := startCA(t, txt.addr)
	c := acmeClient(t, ca, true)

	const name = "host.tailnet.test"
	start := time.Now()
	der, err := order(t.Context(), c, name, txt.set)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("issued in %v", time.Since(start))
	leaf, err := x509.ParseCertificate(der[0])
	if err != nil {
		t.Fatal(err)
	}
	inter := x509.NewCertPool()
	for _, d := range der[1:] {
		c, err := x509.ParseCertificate(d)
		if err != nil {
			t.Fatal(err)
		}
		inter.AddCert(c)
	}
	rootsPEM, err := os.ReadFile(ca.RootsFile)
	if err != nil {
		t.Fatal(err)
	}
	fromFile := x509.NewCertPool()
	if !fromFile.AppendCertsFromPEM(rootsPEM) {
		t.Fatalf("no certificate in %s", ca.RootsFile)
	}
	for _, roots := range []*x509.CertPool{ca.Roots(), fromFile} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, Intermediates: inter}); err != nil {
			t.Errorf("issued certificate does not verify: %v", err)
		}
	}
	if o, i := ca.Orders(name), ca.Issued(name); o != 1 || i != 1 {
		t.Errorf("orders %d, issued %d for %s; want 1 and 1", o, i, name)
	}

	const unproven = "other.tailnet.test"
	_, err = order(t.Context(), c, unproven, func(string, string) {})
	if oe, ok := errors.AsType[*xacme.OrderError](err); !ok || oe.Status != xacme.StatusInvalid {
		t.Errorf("order without a DNS record: err = %v, want it invalid", err)
	}
	if o, i := ca.Orders(unproven), ca.Issued(unproven); o != 1 || i != 0 {
		t.Errorf("orders %d, issued %d for %s; want 1 and 0", o, i, unproven)
	}

	apiRootPEM, err := os.ReadFile(ca.APIRootFile)
	if err != nil {
		t.Fatal(err)
	}
	apiRoots := x509.NewCertPool()
	if !apiRoots.AppendCertsFromPEM(apiRootPEM) {
		t.Fatalf("no certificate in %s", ca.APIRootFile)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: apiRoots}}}
	res, err := hc.Get(ca.DirectoryURL)
	if err != nil {
		t.Fatalf("the API root file does not verify the API: %v", err)
	}
	res.Body.Close()
}

// An injected rate limit refuses new orders as Let's Encrypt does, in the form tailscaled
// recognises as a rate limit, with its Retry-After; the next order goes through.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	txt := startTXTServer(t)
	ca := startCA(t, txt.addr)
	c := acmeClient(t, ca, false)

	ca.InjectRateLimit(localacme.RateLimit{RetryAfter: 90 * time.Second})
	_, err := c.AuthorizeOrder(t.Context(), xacme.DomainIDs("limited.tailnet.test"))
	ae, _ := errors.AsType[*xacme.Error](err)
	if d, ok := xacme.RateLimit(ae); !ok || d != 90*time.Second || ae.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("rate-limited order: err = %v, retry after %v, rate limit %v; want a 429 rate limit, retry after 90s", err, d, ok)
	}
	if n, o := ca.RateLimited(), ca.Orders("limited.tailnet.test"); n != 1 || o != 0 {
		t.Errorf("%d refused, %d accepted orders; want 1 and 0", n, o)
	}
	if _, err := order(t.Context(), c, "limited.tailnet.test", txt.set); err != nil {
		t.Fatalf("order after the limit: %v", err)
	}
	if n, o := ca.RateLimited(), ca.Issued("limited.tailnet.test"); n != 1 || o != 1 {
		t.Errorf("%d refused orders, %d certificates; want 1 and 1", n, o)
	}
}

// Options.Validity sets the lifetime of issued certificates, so that tests can watch renewals.
func TestValidity(t *testing.T) {
	t.Parallel()
	txt := startTXTServer(t)
	ca := startCAWith(t, localacme.Options{DNSServer: txt.addr, Validity: 12 * time.Second})
	der, err := order(t.Context(), acmeClient(t, ca, true), "short.tailnet.test", txt.set)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der[0])
	if err != nil {
		t.Fatal(err)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life != 12*time.Second {
		t.Errorf("lifetime %v, want 12s", life)
	}
	if _, err := localacme.Start(t.Context(), localacme.Options{DNSServer: txt.addr, Validity: time.Millisecond}); err == nil {
		t.Error("a validity under a second was accepted")
	}
}

// A challenge accepted again once valid, as tailscaled does with an authorization the CA
// reused, is answered with the challenge, as Let's Encrypt does; Pebble alone refuses it.
func TestAcceptValidChallengeAgain(t *testing.T) {
	t.Parallel()
	txt := startTXTServer(t)
	ca := startCA(t, txt.addr)
	c := acmeClient(t, ca, false)

	const name = "again.tailnet.test"
	o, err := c.AuthorizeOrder(t.Context(), xacme.DomainIDs(name))
	if err != nil {
		t.Fatal(err)
	}
	az, err := c.GetAuthorization(t.Context(), o.AuthzURLs[0])
	if err != nil {
		t.Fatal(err)
	}
	var dns01 *xacme.Challenge
	for _, ch := range az.Challenges {
		if ch.Type == "dns-01" {
			dns01 = ch
		}
	}
	if dns01 == nil {
		t.Fatal("no dns-01 challenge offered")
	}
	rec, err := c.DNS01ChallengeRecord(dns01.Token)
	if err != nil {
		t.Fatal(err)
	}
	txt.set("_acme-challenge."+name, rec)
	if _, err := c.Accept(t.Context(), dns01); err != nil {
		t.Fatalf("first accept: %v", err)
	}
	if _, err := c.WaitAuthorization(t.Context(), o.AuthzURLs[0]); err != nil {
		t.Fatalf("the authorization: %v", err)
	}
	again, err := c.Accept(t.Context(), dns01)
	if err != nil {
		t.Fatalf("second accept of the valid challenge: %v", err)
	}
	if again.Status != xacme.StatusValid || again.Token != dns01.Token {
		t.Errorf("second accept: status %q token %q; want valid and %q", again.Status, again.Token, dns01.Token)
	}
}
