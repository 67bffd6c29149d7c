package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"tailscale.com/client/local"
	"tailscale.com/hostinfo"
	"tailscale.com/ipn"
	"tailscale.com/net/bakedroots"
	xacme "tailscale.com/tempfork/acme"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/backoff"
	"github.com/tsingress/tsingress/internal/proxy/secretstore"
	"github.com/tsingress/tsingress/internal/proxy/web"
)

// CertSource stands in for the tailnet's certificate flow (in tests): it issues a certificate
// for a name whenever asked, and caches none.
type CertSource interface {
	Certificate(ctx context.Context, name string) (*tls.Certificate, error)
}

// acmeFlow obtains the certificates of tailnet names.
type acmeFlow interface {
	// obtain returns a certificate and key (PEM) for name, from the flow's cache or the CA; with
	// renew set, a newer certificate than renew, which is due for renewal.
	obtain(ctx context.Context, name string, renew *x509.Certificate) (certPEM, keyPEM []byte, err error)
	// cached returns what the flow has cached for name without asking the CA; nil if nothing.
	cached(name string) (certPEM, keyPEM []byte, err error)
	// check parses a certificate and key that no CA just handed over (a cache, a shared
	// Secret) and checks that they serve name now and come from the flow's CA.
	check(certPEM, keyPEM []byte, name string, now time.Time) (*servedCert, error)
}

// tailnetFlow is tailscaled's: ACME through the control plane's DNS-01, certificates cached
// in tailscaled's certificate store.
type tailnetFlow struct {
	lc    *local.Client
	store *secretstore.Store // nil when the state is in files
	dir   string             // the node's directory
}

func (f tailnetFlow) obtain(ctx context.Context, name string, renew *x509.Certificate) ([]byte, []byte, error) {
	var minValidity time.Duration
	if renew != nil {
		// More than renew has left, so that tailscaled renews now, whatever ARI suggests.
		minValidity = max(time.Until(renew.NotAfter)+time.Second, time.Second)
	}
	return f.lc.CertPairWithValidity(ctx, name, minValidity)
}

func (f tailnetFlow) cached(name string) ([]byte, []byte, error) {
	// Where feature/acme keeps certificates (its getCertStore): a custom state store when it runs
	// in Kubernetes, files in the node's directory otherwise.
	if f.store != nil && hostinfo.GetEnvType() == hostinfo.Kubernetes {
		c, k, err := f.store.ReadTLSCertAndKey(name)
		if errors.Is(err, ipn.ErrStateNotExist) {
			return nil, nil, nil
		}
		return c, k, err
	}
	c, err := os.ReadFile(filepath.Join(f.dir, "certs", name+".crt"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	k, err := os.ReadFile(filepath.Join(f.dir, "certs", name+".key"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	return c, k, err
}

func (tailnetFlow) check(certPEM, keyPEM []byte, name string, now time.Time) (*servedCert, error) {
	return parseCached(certPEM, keyPEM, name, now)
}

// sourceFlow is a CertSource as a flow. Its certificates chain to a root of its own, which no
// proxy trusts, so a cached one is checked for its name and validity only.
type sourceFlow struct{ src CertSource }

func (f sourceFlow) obtain(ctx context.Context, name string, _ *x509.Certificate) ([]byte, []byte, error) {
	cert, err := f.src.Certificate(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	var certPEM []byte
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil, nil, err
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), nil
}

func (sourceFlow) cached(string) ([]byte, []byte, error) { return nil, nil, nil }

func (sourceFlow) check(certPEM, keyPEM []byte, name string, now time.Time) (*servedCert, error) {
	return parsePair(certPEM, keyPEM, name, now)
}

// servedCert is a certificate with its key, parsed and as PEM.
type servedCert struct {
	tls             *tls.Certificate
	leaf            *x509.Certificate
	certPEM, keyPEM []byte
}

// parsePair parses a certificate chain and its key (PEM) and checks that they serve name now.
func parsePair(certPEM, keyPEM []byte, name string, now time.Time) (*servedCert, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, err
		}
	}
	switch {
	case now.Before(leaf.NotBefore):
		return nil, fmt.Errorf("the certificate is not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	case !now.Before(leaf.NotAfter):
		return nil, fmt.Errorf("the certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if err := leaf.VerifyHostname(name); err != nil {
		return nil, err
	}
	return &servedCert{tls: &pair, leaf: leaf, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// parseCached is parsePair for a certificate that no CA just handed over (a cache, a shared
// Secret): its chain must verify as tailscaled verifies its cache (validCertPEM), against the
// system roots or the Let's Encrypt roots built in, or against any root when the ACME directory
// is not Let's Encrypt's (its staging, a private CA), whose roots a proxy does not have.
func parseCached(certPEM, keyPEM []byte, name string, now time.Time) (*servedCert, error) {
	c, err := parsePair(certPEM, keyPEM, name, now)
	if err != nil {
		return nil, err
	}
	inter := x509.NewCertPool()
	for _, der := range c.tls.Certificate[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		inter.AddCert(ic)
	}
	verify := func(roots *x509.CertPool) error {
		_, err := c.leaf.Verify(x509.VerifyOptions{DNSName: name, CurrentTime: now, Roots: roots, Intermediates: inter})
		return err
	}
	if verify(nil) == nil {
		return c, nil
	}
	err = verify(bakedroots.Get())
	if dir := os.Getenv(acmeDirectoryEnv); err == nil || (errors.As(err, new(x509.UnknownAuthorityError)) && dir != "" && dir != xacme.LetsEncryptURL) {
		return c, nil
	}
	return nil, err
}

// renewAt is when a certificate is due for renewal, by the contract's rule that the operator's
// guard applies too.
func renewAt(leaf *x509.Certificate) time.Time {
	return contract.RenewAt(leaf.NotBefore, leaf.NotAfter)
}

func certStatus(c *servedCert, source string) contract.CertificateStatus {
	return contract.CertificateStatus{Source: source, Serial: hex.EncodeToString(c.leaf.SerialNumber.Bytes()),
		NotBefore: c.leaf.NotBefore, NotAfter: c.leaf.NotAfter}
}

const (
	// mayIssuePoll is how often a name that the tailnet does not offer this node yet is checked:
	// a service's name arrives in the node's cert domains once the node advertises it.
	mayIssuePoll = 250 * time.Millisecond
	// mayIssueWait is how long that is waited for before asking anyway, so that the refusal is
	// reported.
	mayIssueWait = 30 * time.Second
	// obtainTimeout bounds one attempt at a certificate. tailscaled's ACME client waits out a
	// CA's Retry-After (a rate limit) within the attempt, so it is long: a short one would only
	// send the CA more refused requests. A hold ends an attempt at once.
	obtainTimeout = 15 * time.Minute
)

// sharedSecret is a ProxyGroup's certificate Secret as last seen.
type sharedSecret struct {
	certPEM, keyPEM []byte
	problem         string // why it holds no certificate, if it does not
	// unusable says why the issuer cannot store a certificate there (missing, unreadable, not
	// kubernetes.io/tls): issuing then would lose the certificate.
	unusable string
}

// acmeCert keeps the certificate of one tailnet name served. It obtains the certificate as soon
// as it starts (not on a first request), renews it at two thirds of its lifetime whether
// traffic comes or not, and backs off with jitter after failures. In a ProxyGroup sharing
// certificates, the issuer keeps the certificate in the name's Secret too, and the readers only
// load it from there. Under an issuance hold it never asks the CA: it serves a cached
// certificate, or none. Its goroutine sets the server's certificate before the status says so.
type acmeCert struct {
	name string
	role contract.CertShareMode // "" for a proxy that issues for itself alone
	flow acmeFlow
	srv  *web.Server
	log  *slog.Logger
	// mayIssue reports whether the tailnet offers this node a certificate for name (one of its
	// cert domains).
	mayIssue func(context.Context) bool
	// publish stores a certificate in the shared Secret (issuer).
	publish func(certPEM, keyPEM []byte) error
	// changed tells the owner that the certificate or the status changed.
	changed func()
	kick    chan struct{}

	// The goroutine's own.
	retry        backoff.Backoff
	waitingSince time.Time // since when mayIssue has said no

	mu       sync.Mutex
	hold     *contract.IssuanceHold
	lifted   bool               // a hold was lifted: ask at once, whatever the backoff
	inFlight context.CancelFunc // ends the attempt at a certificate under way, if any
	shared   *sharedSecret      // nil until first seen (issuer, reader)
	cur      *servedCert
	status   contract.CertificateStatus // zero until there is something to say
}

func newACMECert(name string, role contract.CertShareMode, flow acmeFlow, srv *web.Server, log *slog.Logger) *acmeCert {
	return &acmeCert{name: name, role: role, flow: flow, srv: srv, log: log.With("name", name), kick: make(chan struct{}, 1),
		retry: backoff.Backoff{Min: time.Second, Max: 10 * time.Minute, Jitter: true}}
}

// setHold sets the issuance hold; lifting it asks for the certificate at once.
func (a *acmeCert) setHold(h *contract.IssuanceHold) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if (a.hold == nil) == (h == nil) && (h == nil || *a.hold == *h) {
		return
	}
	a.lifted = h == nil
	a.hold = h
	if h != nil && a.inFlight != nil {
		a.inFlight()
	}
	a.poke()
}

// setShared passes on the shared Secret's content.
func (a *acmeCert) setShared(s sharedSecret) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if old := a.shared; old != nil && bytes.Equal(old.certPEM, s.certPEM) && bytes.Equal(old.keyPEM, s.keyPEM) &&
		old.problem == s.problem && old.unusable == s.unusable {
		return
	}
	a.shared = &s
	a.poke()
}

func (a *acmeCert) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// state returns whether a certificate is served, and the status to report (zero if none yet).
func (a *acmeCert) state() (served bool, st contract.CertificateStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur != nil, a.status
}

// ready reports whether the name may be served (listened on, advertised): with a certificate,
// or to obtain one, since the tailnet offers a service's certificate only to the nodes that
// advertise it. The window without a certificate lasts one issuance.
func (a *acmeCert) ready() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.cur != nil:
		return true
	case a.role == contract.CertReader || activeHold(a.hold, time.Now()) != nil:
		return false
	case a.role == contract.CertIssuer:
		// Once what the Secret holds is known (a certificate is loaded long before clients learn
		// of the advertisement), and only if it can take a new one.
		return a.shared != nil && a.shared.unusable == ""
	}
	return true
}

// held reports whether issuance is held for the name.
func (a *acmeCert) held() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return activeHold(a.hold, time.Now()) != nil
}

func activeHold(h *contract.IssuanceHold, now time.Time) *contract.IssuanceHold {
	if h == nil || (!h.Until.IsZero() && !now.Before(h.Until)) {
		return nil
	}
	return h
}

// run keeps the certificate until ctx ends.
func (a *acmeCert) run(ctx context.Context) {
	for {
		wait := a.step(ctx)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// forever stands for "until something changes".
const forever = 24 * time.Hour

// step does what is due and returns how long to wait for the next step.
func (a *acmeCert) step(ctx context.Context) time.Duration {
	now := time.Now()
	a.mu.Lock()
	hold, shared, cur := activeHold(a.hold, now), a.shared, a.cur
	if a.lifted {
		a.lifted = false
		a.retry.Reset()
	}
	a.mu.Unlock()
	if cur != nil && !now.Before(cur.leaf.NotAfter) {
		a.set(nil, contract.CertificateStatus{Reason: contract.CertReasonIssuanceFailed,
			Message: "the certificate expired at " + cur.leaf.NotAfter.UTC().Format(time.RFC3339) + " without a renewal"})
		cur = nil
	}
	if a.role == contract.CertReader {
		return a.load(shared, hold, now)
	}
	if a.role == contract.CertIssuer && shared == nil {
		return forever // until the Secret is seen: it may hold the certificate
	}
	if a.role == contract.CertIssuer {
		// The Secret may hold a newer certificate than the one served (an earlier issuer's).
		if c, err := a.flow.check(shared.certPEM, shared.keyPEM, a.name, now); err == nil && (cur == nil || c.leaf.NotAfter.After(cur.leaf.NotAfter)) {
			cur = c
		}
	}
	if hold != nil {
		if cur == nil {
			cur = a.fromCache(now)
		}
		if cur == nil {
			a.set(nil, contract.CertificateStatus{Reason: contract.CertReasonIssuanceHeld, Message: holdMessage(hold)})
			return untilOr(hold.Until, now)
		}
		a.set(cur, contract.CertificateStatus{})
		return a.published(cur, min(cur.leaf.NotAfter.Sub(now), untilOr(hold.Until, now)))
	}
	if cur != nil && now.Before(renewAt(cur.leaf)) {
		a.set(cur, contract.CertificateStatus{})
		return a.published(cur, renewAt(cur.leaf).Sub(now))
	}
	if cur != nil {
		a.set(cur, contract.CertificateStatus{}) // served while it is renewed
	}
	if a.role == contract.CertIssuer && shared.unusable != "" {
		if cur == nil {
			a.set(nil, contract.CertificateStatus{Reason: contract.CertReasonSecretInvalid,
				Message: fmt.Sprintf("no certificate is requested while Secret %s cannot hold it: %s", contract.GroupCertSecret(a.name), shared.unusable)})
		}
		return forever // until the Secret changes
	}
	if now.Before(a.retry.Next()) {
		return a.retry.Next().Sub(now)
	}
	if !a.mayIssue(ctx) {
		if a.waitingSince.IsZero() {
			a.waitingSince = now
		}
		if now.Sub(a.waitingSince) < mayIssueWait {
			return mayIssuePoll
		}
	}
	a.waitingSince = time.Time{}
	return a.obtain(ctx, cur)
}

// obtain asks the flow for a certificate, a renewal of cur if set.
func (a *acmeCert) obtain(ctx context.Context, cur *servedCert) time.Duration {
	var renew *x509.Certificate
	if cur != nil {
		renew = cur.leaf
	}
	octx, cancel := context.WithTimeout(ctx, obtainTimeout)
	defer cancel()
	a.mu.Lock()
	held := activeHold(a.hold, time.Now()) != nil // since step looked
	a.inFlight = cancel
	a.mu.Unlock()
	var certPEM, keyPEM []byte
	err := errors.New("issuance held")
	if !held {
		certPEM, keyPEM, err = a.flow.obtain(octx, a.name, renew)
	}
	a.mu.Lock()
	a.inFlight = nil
	held = activeHold(a.hold, time.Now()) != nil
	a.mu.Unlock()
	var c *servedCert
	if err == nil {
		c, err = parsePair(certPEM, keyPEM, a.name, time.Now())
	}
	if err != nil {
		if ctx.Err() != nil || held {
			return 0 // the next step says why
		}
		wait := a.retry.Fail(time.Now())
		if cur == nil {
			a.set(nil, contract.CertificateStatus{Reason: contract.CertReasonIssuanceFailed, Message: err.Error()})
			a.log.Warn("getting the certificate failed; trying again", "in", wait.Round(time.Millisecond), "err", err)
		} else {
			a.log.Warn("renewing the certificate failed; serving the current one and trying again", "in", wait.Round(time.Millisecond), "err", err)
		}
		return wait
	}
	a.set(c, contract.CertificateStatus{})
	wait := time.Until(renewAt(c.leaf))
	if wait <= 0 { // a certificate due at once: asking again at once would not help
		wait = a.retry.Fail(time.Now())
	} else {
		a.retry.Reset()
	}
	return a.published(c, wait)
}

// published makes sure an issuer's Secret holds the served certificate (tailscaled writes it
// there itself in Kubernetes; elsewhere, or after the operator recreated the Secret, this does)
// and returns wait, or less when that failed and must be tried again.
func (a *acmeCert) published(c *servedCert, wait time.Duration) time.Duration {
	if a.role != contract.CertIssuer {
		return wait
	}
	a.mu.Lock()
	shared := a.shared
	a.mu.Unlock()
	if shared == nil || shared.unusable != "" || bytes.Equal(shared.certPEM, c.certPEM) {
		return wait
	}
	if err := a.publish(c.certPEM, c.keyPEM); err != nil {
		retry := a.retry.Fail(time.Now())
		a.log.Error("storing the certificate for the other replicas failed; trying again", "in", retry.Round(time.Millisecond), "err", err)
		return min(wait, retry)
	}
	return wait
}

// fromCache is the flow's cached certificate, if it serves the name.
func (a *acmeCert) fromCache(now time.Time) *servedCert {
	certPEM, keyPEM, err := a.flow.cached(a.name)
	if err != nil {
		a.log.Warn("reading the cached certificate failed", "err", err)
		return nil
	}
	if certPEM == nil {
		return nil
	}
	c, err := a.flow.check(certPEM, keyPEM, a.name, now)
	if err != nil {
		a.log.Info("the cached certificate cannot be served", "err", err)
		return nil
	}
	return c
}

// load serves what the shared Secret holds (reader).
func (a *acmeCert) load(shared *sharedSecret, hold *contract.IssuanceHold, now time.Time) time.Duration {
	if shared == nil {
		return forever
	}
	problem := shared.problem
	if problem == "" {
		c, err := a.flow.check(shared.certPEM, shared.keyPEM, a.name, now)
		if err == nil {
			a.set(c, contract.CertificateStatus{})
			return c.leaf.NotAfter.Sub(now)
		}
		problem = err.Error()
	}
	st := contract.CertificateStatus{Reason: contract.CertReasonWaiting,
		Message: fmt.Sprintf("waiting for the issuing replica to store a certificate in Secret %s: %s", contract.GroupCertSecret(a.name), problem)}
	if hold != nil {
		st = contract.CertificateStatus{Reason: contract.CertReasonIssuanceHeld, Message: holdMessage(hold)}
	}
	a.set(nil, st)
	return forever
}

// set serves c, or nothing with the reason in why. The server has the certificate before the
// status reports it.
func (a *acmeCert) set(c *servedCert, why contract.CertificateStatus) {
	st := why
	if c != nil {
		source := contract.CertSourceACME
		if a.role == contract.CertReader {
			source = contract.CertSourceSecret
		}
		st = certStatus(c, source)
	}
	a.mu.Lock()
	newCert := a.cur != c && (a.cur == nil || c == nil || !bytes.Equal(a.cur.certPEM, c.certPEM))
	same := !newCert && a.status == st
	if newCert {
		a.cur = c
	}
	a.mu.Unlock()
	if same {
		return
	}
	if newCert {
		if c == nil {
			a.srv.SetCertificate(nil)
		} else {
			a.srv.SetCertificate(c.tls)
			a.log.Info("serving a certificate", "source", st.Source, "serial", st.Serial, "notAfter", st.NotAfter, "renewAt", renewAt(c.leaf))
		}
	}
	a.mu.Lock()
	a.status = st
	a.mu.Unlock()
	if c == nil && st.Reason != contract.CertReasonIssuanceFailed { // failures are logged with their retry
		a.log.Info("not serving a certificate", "reason", st.Reason, "message", st.Message)
	}
	a.changed()
}

func holdMessage(h *contract.IssuanceHold) string {
	if h.Message != "" {
		return h.Message
	}
	return "certificate issuance is held: " + h.Reason
}

// untilOr is how long until t, or forever when t is zero or past.
func untilOr(t, now time.Time) time.Duration {
	if t.IsZero() || !t.After(now) {
		return forever
	}
	return t.Sub(now)
}
