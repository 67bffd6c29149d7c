// Package localacme runs a real ACME certificate authority on loopback: Pebble, Let's Encrypt's
// test CA, in-process, validating DNS-01 challenges against a DNS server it is given (the
// local tailnet's, see internal/testing/localtailnet). Its API is served over HTTPS, as Let's
// Encrypt's is, so a client must trust the API's root as well as the roots that verify the
// certificates it issues.
//
// # Pointing tailscaled or tsnet at it
//
// tailscaled's ACME client takes its directory from the environment variable
// TS_DEBUG_ACME_DIRECTORY_URL, read at every issuance, and talks to it with Go's default HTTP
// client, which trusts only the system roots; there is no knob for more. So a process gets
// certificates from this CA when it runs with the environment [CA.Env] returns:
//
//	TS_DEBUG_ACME_DIRECTORY_URL=<CA.DirectoryURL>
//	SSL_CERT_DIR=<CA.APIRootDir>   (Go adds the certificates there to the system bundle file)
//
// A child process gets them at start. Inside one process (tsnet in a test), [CA.UseInProcess]
// sets them, and they must be set before the process first verifies a TLS certificate, because
// Go loads the system roots once per process: call it before any node starts. For the same
// reason every CA of a process serves its API under one root, made once per process; and since
// the directory URL is process-wide too, one process uses one CA at a time.
//
// # Behaviour
//
// Pebble runs with its randomness turned off where it would only slow tests down: challenges
// are validated at once (not after up to 5 s), no valid nonce is refused, and authorizations
// are almost never reused, so orders go through DNS-01 (Pebble still reuses one in a hundred:
// its check is rand.Intn(100) > percent). Three changes on its API make tailscaled's ACME
// client work as it does with Let's Encrypt: a finalize response names the order in Location,
// as Boulder's does (the client polls that URL, and fails without it); a challenge accepted
// again once its authorization is valid is answered with the challenge, as Boulder does,
// where Pebble refuses it (tailscaled accepts every challenge of an order, reused or not);
// and the answers to an accepted challenge and to a finalization wait, up to 2 s, for Pebble's
// background validation and issuance, which spares the client its 1 s polling interval.
// Issued certificates live 90 days (Options.Validity) and chain to an ECDSA root through one
// intermediate.
// State is in memory and ends with Close; Pebble's validation loop keeps one idle goroutine.
package localacme

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/letsencrypt/pebble/v2/acme"
	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"tailscale.com/types/logger"
)

// Pebble's paths (unexported in package wfe).
const (
	newOrderPath  = "/order-plz"
	orderPath     = "/my-order/"
	finalizePath  = "/finalize-order/"
	challengePath = "/chalZ/"
	noncePath     = "/nonce-plz"
)

// settleTimeout bounds the wait for Pebble's background work before answering.
const settleTimeout = 2 * time.Second

// Options configures a CA.
type Options struct {
	// DNSServer is the host:port of the DNS server that holds the _acme-challenge TXT records;
	// Pebble asks it over TCP. Required.
	DNSServer string
	// Addr is where the ACME API listens, "127.0.0.1:0" by default.
	Addr string
	// Logf receives a line per ACME request (method, path, status) and per refused order;
	// nil discards them. Pebble's own logs, which dump accounts and challenges, are dropped.
	Logf logger.Logf
	// Validity is how long issued certificates live, in whole seconds; 90 days by default.
	// Seconds make renewal testable: a client renews at two thirds of the lifetime.
	Validity time.Duration
}

// CA is a running ACME certificate authority.
type CA struct {
	// DirectoryURL is the ACME directory, for TS_DEBUG_ACME_DIRECTORY_URL.
	DirectoryURL string
	// RootsFile holds, in PEM, the roots that verify the certificates the CA issues.
	RootsFile string
	// APIRootFile holds, in PEM, the root of the API's own HTTPS certificate.
	APIRootFile string
	// APIRootDir is a directory holding APIRootFile only, for SSL_CERT_DIR.
	APIRootDir string

	logf      logger.Logf
	pebble    *ca.CAImpl
	db        *db.MemoryStore
	wfe       http.Handler
	http      *http.Server
	apiRoot   *x509.Certificate
	apiCert   *x509.Certificate
	dir       string
	stopOnCtx func() bool

	mu      sync.Mutex
	orders  []string // IDs of the orders Pebble created, oldest first
	limits  []RateLimit
	limited int

	closeOnce sync.Once
	closeErr  error
}

// RateLimit makes the CA refuse new orders as Let's Encrypt does when a limit is hit: HTTP
// 429, a urn:ietf:params:acme:error:rateLimited problem and a Retry-After header.
type RateLimit struct {
	// RetryAfter is sent in whole seconds, rounded up.
	RetryAfter time.Duration
	// Times is how many new-order requests are refused; zero means one.
	Times int
}

// Start runs a CA until Close is called or ctx is done.
func Start(ctx context.Context, opts Options) (*CA, error) {
	if opts.DNSServer == "" {
		return nil, errors.New("localacme: Options.DNSServer is required")
	}
	root, err := apiRoot()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cmp.Or(opts.Addr, "127.0.0.1:0"))
	if err != nil {
		return nil, err
	}
	c := &CA{logf: opts.Logf, apiRoot: root.cert}
	if c.logf == nil {
		c.logf = logger.Discard
	}
	if opts.Validity != 0 && opts.Validity < time.Second {
		ln.Close()
		return nil, fmt.Errorf("localacme: Options.Validity %v is under a second", opts.Validity)
	}
	if err := c.setUp(ln, root, opts.DNSServer, opts.Validity); err != nil {
		ln.Close()
		if c.dir != "" {
			_ = os.RemoveAll(c.dir) // best effort: the setup error is the one to report
		}
		return nil, err
	}
	go c.http.ServeTLS(ln, "", "") //nolint:errcheck // ends with Close
	c.stopOnCtx = context.AfterFunc(ctx, func() { _ = c.Close() })
	c.logf("localacme: ACME directory at %s, DNS-01 checked at %s", c.DirectoryURL, opts.DNSServer)
	return c, nil
}

// setUp builds Pebble, the API server and the PEM files.
func (c *CA) setUp(ln net.Listener, root *issuer, dnsServer string, validity time.Duration) error {
	ip := ln.Addr().(*net.TCPAddr).IP
	cert, err := root.issueServing(ip)
	if err != nil {
		return err
	}
	c.apiCert = cert.Leaf
	c.DirectoryURL = "https://" + ln.Addr().String() + wfe.DirectoryPath

	pebbleLog := log.New(io.Discard, "", 0)
	c.db = db.NewMemoryStore()
	profile := ca.Profile{Description: "90 days, as Let's Encrypt's default"}
	if validity > 0 {
		// Pebble makes NotAfter NotBefore + ValidityPeriod - 1s; the extra second keeps the lifetime.
		profile = ca.Profile{Description: validity.String(), ValidityPeriod: uint64(validity/time.Second) + 1}
	}
	c.pebble = ca.New(pebbleLog, c.db, "", "ecdsa", 0, 1, map[string]ca.Profile{"default": profile})
	withPebbleEnv(func() {
		v := va.New(pebbleLog, 0, 0, false, dnsServer, c.db)
		w := wfe.New(pebbleLog, c.db, v, c.pebble, nil, false, false, 0, 0)
		c.wfe = w.Handler()
	})
	c.http = &http.Server{
		Handler:           http.HandlerFunc(c.serve),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}},
		ErrorLog:          logger.StdLogger(c.logf),
		ReadHeaderTimeout: 10 * time.Second,
	}

	if c.dir, err = os.MkdirTemp("", "localacme-"); err != nil {
		return err
	}
	var roots []byte
	for i := range c.pebble.GetNumberOfRootCerts() {
		roots = append(roots, c.pebble.GetRootCert(i).PEM()...)
	}
	c.RootsFile = filepath.Join(c.dir, "roots.pem")
	c.APIRootDir = filepath.Join(c.dir, "api-root")
	c.APIRootFile = filepath.Join(c.APIRootDir, "localacme-api-root.pem")
	if err := os.WriteFile(c.RootsFile, roots, 0o644); err != nil {
		return err
	}
	if err := os.Mkdir(c.APIRootDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(c.APIRootFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.cert.Raw}), 0o644)
}

// Pebble reads these in va.New and wfe.New. Its defaults add random delays and failures that
// exercise clients' patience; here they would only slow tests down.
var pebbleEnv = map[string]string{
	"PEBBLE_VA_NOSLEEP":      "1", // validate at once, not after up to 5 s
	"PEBBLE_WFE_NONCEREJECT": "0", // each refused nonce costs tailscaled a 1 s retry
	"PEBBLE_AUTHZREUSE":      "0", // nearly every order proves control through DNS-01 (see the package doc)
}

// pebbleEnvMu keeps concurrent Starts from restoring each other's settings too early.
var pebbleEnvMu sync.Mutex

// withPebbleEnv runs f with pebbleEnv set, then restores the environment.
func withPebbleEnv(f func()) {
	pebbleEnvMu.Lock()
	defer pebbleEnvMu.Unlock()
	for k, v := range pebbleEnv {
		// os.Setenv and os.Unsetenv fail only on a name with '=' or NUL; pebbleEnv's are constants.
		if old, ok := os.LookupEnv(k); ok {
			defer os.Setenv(k, old) //nolint:errcheck // see above
		} else {
			defer os.Unsetenv(k) //nolint:errcheck // see above
		}
		_ = os.Setenv(k, v)
	}
	f()
}

// Close stops the CA and removes its files.
func (c *CA) Close() error {
	c.closeOnce.Do(func() {
		c.stopOnCtx()
		// Not Shutdown: it gives HTTP/2 clients a second to leave, and the CA's are idle.
		c.closeErr = errors.Join(c.http.Close(), os.RemoveAll(c.dir))
	})
	return c.closeErr
}

// Env is the environment that makes tailscaled or tsnet get certificates from the CA, as
// KEY=value pairs: the directory URL and a trust directory for the API's root.
func (c *CA) Env() []string {
	return []string{
		"TS_DEBUG_ACME_DIRECTORY_URL=" + c.DirectoryURL,
		"SSL_CERT_DIR=" + c.APIRootDir,
	}
}

// UseInProcess sets [CA.Env] with setenv (t.Setenv in a test) and checks that this process
// then trusts the API. That fails when the process loaded its system roots before, for
// example by making an HTTPS request: call it before any tsnet node starts.
func (c *CA) UseInProcess(setenv func(key, value string)) error {
	for _, kv := range c.Env() {
		k, v, _ := strings.Cut(kv, "=")
		setenv(k, v)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		return fmt.Errorf("localacme: loading the system roots: %w", err)
	}
	if _, err := c.apiCert.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
		return fmt.Errorf("localacme: this process loaded its system roots before SSL_CERT_DIR named %s, "+
			"so tailscaled's ACME client cannot trust the CA; call UseInProcess earlier: %w", c.APIRootDir, err)
	}
	return nil
}

// Roots returns the roots that verify the certificates the CA issues.
func (c *CA) Roots() *x509.CertPool {
	pool := x509.NewCertPool()
	for i := range c.pebble.GetNumberOfRootCerts() {
		pool.AddCert(c.pebble.GetRootCert(i).Cert)
	}
	return pool
}

// APIRoots returns the root of the API's HTTPS certificate, for a client of the API.
func (c *CA) APIRoots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(c.apiRoot)
	return pool
}

// InjectRateLimit makes the CA refuse the next new orders. Limits queue up.
func (c *CA) InjectRateLimit(l RateLimit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limits = append(c.limits, l)
}

// Orders returns how many orders the CA accepted that include name.
func (c *CA) Orders(name string) int { return c.countOrders(name, false) }

// Issued returns how many certificates the CA issued that include name.
func (c *CA) Issued(name string) int { return c.countOrders(name, true) }

// OrderTotals returns how many orders the CA accepted, whatever their names, and how many of
// them got a certificate.
func (c *CA) OrderTotals() (orders, issued int) {
	c.mu.Lock()
	ids := slices.Clone(c.orders)
	c.mu.Unlock()
	for _, id := range ids {
		o := c.db.GetOrderByID(id)
		if o == nil {
			continue
		}
		orders++
		o.RLock()
		if o.CertificateObject != nil {
			issued++
		}
		o.RUnlock()
	}
	return orders, issued
}

// RateLimited returns how many new-order requests an injected rate limit refused.
func (c *CA) RateLimited() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limited
}

// countOrders counts the recorded orders for name, or only those that got a certificate.
func (c *CA) countOrders(name string, issuedOnly bool) int {
	c.mu.Lock()
	ids := slices.Clone(c.orders)
	c.mu.Unlock()
	name = strings.ToLower(name)
	n := 0
	for _, id := range ids {
		o := c.db.GetOrderByID(id)
		if o == nil {
			continue
		}
		o.RLock()
		if !issuedOnly || o.CertificateObject != nil {
			for _, ident := range o.Identifiers {
				if ident.Value == name {
					n++
				}
			}
		}
		o.RUnlock()
	}
	return n
}

// serve is Pebble's API with rate limits injected and orders recorded.
func (c *CA) serve(w http.ResponseWriter, r *http.Request) {
	isNewOrder := r.Method == http.MethodPost && r.URL.Path == newOrderPath
	if isNewOrder && c.takeRateLimit(w) {
		c.logf("localacme: %s %s: %d (injected rate limit)", r.Method, r.URL.Path, http.StatusTooManyRequests)
		return
	}
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	if id, ok := strings.CutPrefix(r.URL.Path, finalizePath); ok && r.Method == http.MethodPost {
		// Let's Encrypt names the order in a finalize response, and tailscaled's ACME client
		// polls that URL while the certificate is still being issued. Pebble leaves it out.
		sw.locationOnOK = "https://" + r.Host + orderPath + id
	}
	if id, ok := strings.CutPrefix(r.URL.Path, challengePath); ok && r.Method == http.MethodPost {
		c.serveChallenge(sw, r, id)
	} else {
		c.wfe.ServeHTTP(sw, r)
	}
	if r.Method == http.MethodPost && sw.status == http.StatusOK {
		c.settle(r.URL.Path)
	}
	if isNewOrder && sw.status == http.StatusCreated {
		c.mu.Lock()
		c.orders = append(c.orders, path.Base(sw.Header().Get("Location")))
		c.mu.Unlock()
	}
	c.logf("localacme: %s %s: %d", r.Method, r.URL.Path, sw.status)
}

// serveChallenge passes a challenge POST to Pebble, but answers with the challenge where Pebble
// refuses to accept one that is already valid.
func (c *CA) serveChallenge(w http.ResponseWriter, r *http.Request, id string) {
	rec := httptest.NewRecorder()
	c.wfe.ServeHTTP(rec, r)
	maps.Copy(w.Header(), rec.Header())
	status, body := rec.Code, rec.Body.Bytes()
	if valid, ok := c.validChallenge(id); ok && status == http.StatusBadRequest {
		c.logf("localacme: challenge %s accepted again once valid: answered with it, as Boulder does", id)
		w.Header().Set("Content-Type", "application/json")
		status, body = http.StatusOK, valid
	}
	w.WriteHeader(status)
	_, _ = w.Write(body) // a client gone away is not the CA's concern
}

// validChallenge is the challenge's JSON if it is valid.
func (c *CA) validChallenge(id string) ([]byte, bool) {
	ch := c.db.GetChallengeByID(id)
	if ch == nil {
		return nil, false
	}
	ch.RLock()
	defer ch.RUnlock()
	if ch.Status != acme.StatusValid {
		return nil, false
	}
	body, err := json.Marshal(ch.Challenge)
	return body, err == nil
}

// settle holds the answer to an accepted challenge or a finalization until Pebble, which
// validates and issues in the background, is done: then the ACME client's first poll finds
// the result instead of waiting out its 1 s interval. The answer is still buffered here.
func (c *CA) settle(urlPath string) {
	var busy func() bool
	if id, ok := strings.CutPrefix(urlPath, challengePath); ok {
		ch := c.db.GetChallengeByID(id)
		if ch == nil {
			return
		}
		busy = func() bool {
			ch.RLock()
			defer ch.RUnlock()
			return ch.Status == acme.StatusProcessing
		}
	} else if id, ok := strings.CutPrefix(urlPath, finalizePath); ok {
		o := c.db.GetOrderByID(id)
		if o == nil {
			return
		}
		busy = func() bool {
			s, err := o.GetStatus()
			return err == nil && s == acme.StatusProcessing
		}
	} else {
		return
	}
	for deadline := time.Now().Add(settleTimeout); busy() && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
}

// takeRateLimit answers with a rate-limit error if one is queued.
func (c *CA) takeRateLimit(w http.ResponseWriter) bool {
	c.mu.Lock()
	if len(c.limits) == 0 {
		c.mu.Unlock()
		return false
	}
	l := c.limits[0]
	if c.limits[0].Times--; c.limits[0].Times <= 0 {
		c.limits = c.limits[1:]
	}
	c.limited++
	c.mu.Unlock()

	// ACME answers every POST with a fresh nonce, errors included; Pebble makes it.
	nonce := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodHead, noncePath, nil)
	req.Header.Set("User-Agent", "localacme")
	c.wfe.ServeHTTP(nonce, req)
	secs := int((l.RetryAfter + time.Second - 1) / time.Second)
	w.Header().Set("Replay-Nonce", nonce.Header().Get("Replay-Nonce"))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type":   "urn:ietf:params:acme:error:rateLimited",
		"detail": fmt.Sprintf("too many new orders recently (injected by localacme): retry after %d seconds", secs),
		"status": http.StatusTooManyRequests,
	})
	return true
}

type statusWriter struct {
	http.ResponseWriter
	status       int
	locationOnOK string // a Location header to add to a 200 response
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	if code == http.StatusOK && w.locationOnOK != "" {
		w.Header().Set("Location", w.locationOnOK)
	}
	w.ResponseWriter.WriteHeader(code)
}

// issuer is a certificate that signs others, with its key.
type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// apiRoot signs the API's serving certificates. There is one per process: a process loads
// its trusted roots once, so every CA it starts must chain to the root it loaded.
var apiRoot = sync.OnceValues(func() (*issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "localacme API root " + strconv.Itoa(os.Getpid())},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(1, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &issuer{cert: cert, key: key}, nil
})

// issueServing makes a serving certificate for ip and localhost.
func (is *issuer) issueServing(ip net.IP) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: "localacme API"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     is.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{ip},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.cert, key.Public(), is.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
