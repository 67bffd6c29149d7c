// Package certs decides the certificates of the operator's tailnet names: whether a proxy may ask
// the CA for one, kept within the CA's weekly limits by a ledger of issuances, and the users'
// bring-your-own TLS Secrets it copies to proxies. It reconciles nothing itself; the Ingress
// reconcilers call it.
package certs

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"weak"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// Secret types (LabelSecretType) of certificate Secrets in the operator's namespace.
const (
	SecretTypeCertCopy  = "byo-certificate"   // a copy of a user's kubernetes.io/tls Secret
	SecretTypeGroupCert = "group-certificate" // a ProxyGroup's shared certificate of one name
)

// byoHosts lists the custom hosts an Ingress's bring-your-own entries name, lower-cased.
func BYOHosts(ing *networkingv1.Ingress) map[string]bool {
	hosts := map[string]bool{}
	for _, t := range ing.Spec.TLS {
		if kit.IsBYO(t) {
			for _, h := range t.Hosts {
				if kit.CustomHost(h) {
					hosts[strings.ToLower(h)] = true
				}
			}
		}
	}
	return hosts
}

// CheckTLSSecret validates a user's certificate Secret for hosts at now. It returns the leaf's
// expiry, or a finding saying why the Secret cannot be served.
func CheckTLSSecret(s *corev1.Secret, hosts []string, now time.Time) (time.Time, *kit.Finding) {
	where := fmt.Sprintf("TLS Secret %s/%s", s.Namespace, s.Name)
	if s.Type != corev1.SecretTypeTLS {
		f := kit.Warnf(kit.ReasonTLSSecretWrongType, "%s has type %q, not %s; %s not served", where, s.Type, corev1.SecretTypeTLS, strings.Join(hosts, ", "))
		return time.Time{}, &f
	}
	pair, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		f := kit.Warnf(kit.ReasonTLSSecretInvalid, "%s: %v; %s not served", where, err, strings.Join(hosts, ", "))
		return time.Time{}, &f
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		f := kit.Warnf(kit.ReasonTLSSecretInvalid, "%s: %v", where, err)
		return time.Time{}, &f
	}
	if !now.Before(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		f := kit.Warnf(kit.ReasonCertificateExpired, "%s: the certificate is valid from %s to %s, not now; %s not served",
			where, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), strings.Join(hosts, ", "))
		return time.Time{}, &f
	}
	var uncovered []string
	for _, h := range hosts {
		if leaf.VerifyHostname(h) != nil {
			uncovered = append(uncovered, h)
		}
	}
	if len(uncovered) > 0 {
		f := kit.Warnf(kit.ReasonCertificateHostMismatch, "%s: the certificate (for %s) does not cover %s; not served",
			where, strings.Join(leaf.DNSNames, ", "), strings.Join(uncovered, ", "))
		return time.Time{}, &f
	}
	return leaf.NotAfter, nil
}

// CertCopyName names the copy, in the operator's namespace, of a user's certificate Secret.
func CertCopyName(prefix, namespace, secret string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + secret))
	return prefix + "-byo-" + hex.EncodeToString(sum[:])[:10]
}

// buildCertCopy copies the certificate and key of a user's Secret, and nothing else.
func buildCertCopy(name, namespace string, labels map[string]string, src *corev1.Secret) *corev1.Secret {
	l := make(map[string]string, len(labels)+1)
	for k, v := range labels {
		l[k] = v
	}
	l[kit.LabelSecretType] = SecretTypeCertCopy
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: l},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey:       src.Data[corev1.TLSCertKey],
			corev1.TLSPrivateKeyKey: src.Data[corev1.TLSPrivateKeyKey],
		},
	}
}

// byoCertificates is what an Ingress's bring-your-own entries resolve to.
type BYOCertificates struct {
	Refs     []contract.CertificateRef
	Copies   []*corev1.Secret
	Findings []kit.Finding
	// Recheck is when the earliest served certificate expires, to report it then, or when to
	// try again a Secret the operator may not read, whichever is sooner.
	Recheck time.Duration
}

// CertSecrets reads users' certificate Secrets through the API, by name: the operator caches
// no Secret outside its namespace, only sees the kubernetes.io/tls ones change (metadata only),
// so its memory does not grow with the certificates of the cluster. It may read them only in
// the namespaces whose owners bound TLSSecretReaderRole to it; it watches those it could read.
type CertSecrets struct {
	API     client.Reader
	Now     func() time.Time
	Watches NamespaceWatch
}

// NamespaceWatch starts and stops the watch of a namespace's TLS Secrets (kit.NamespaceNameWatch).
type NamespaceWatch interface {
	Watch(ctx context.Context, namespace string) error
	Forget(ctx context.Context, namespace string)
}

// TLSSecretReaderRole is the ClusterRole (config/rbac) a namespace's owner binds to the
// operator's ServiceAccount there to let its Ingresses bring their own certificates.
const TLSSecretReaderRole = "tsingress-tls-secret-reader"

// NotPermittedRecheck is how soon an Ingress whose Secret the operator may not read is looked
// at again without a change: granting the right is a RoleBinding, which the operator does not watch.
const NotPermittedRecheck = 2 * time.Minute

func (c CertSecrets) get(ctx context.Context, key client.ObjectKey) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	return s, c.API.Get(ctx, key, s)
}

// Resolve validates an Ingress's bring-your-own Secrets and builds their copies, named with
// prefix and labelled with labels, in namespace. A bad Secret leaves its hosts out with a
// finding; the other names are unaffected.
func (c CertSecrets) Resolve(ctx context.Context, ing *networkingv1.Ingress, prefix, namespace string, labels map[string]string) (BYOCertificates, error) {
	var out BYOCertificates
	for i, t := range ing.Spec.TLS {
		if !kit.IsBYO(t) {
			continue
		}
		var hosts []string
		for _, h := range t.Hosts {
			if kit.CustomHost(h) {
				hosts = append(hosts, strings.ToLower(h))
			} else {
				out.Findings = append(out.Findings, kit.Warnf(kit.ReasonUnsupportedHost,
					"tls %d: host %q is a tailnet name; it cannot share an entry with the custom hosts of Secret %s", i, h, t.SecretName))
			}
		}
		if _, err := c.Add(ctx, &out, client.ObjectKey{Namespace: ing.Namespace, Name: t.SecretName}, hosts, true, prefix, namespace, labels); err != nil {
			return out, err
		}
	}
	return out, nil
}

// Add validates the bring-your-own Secret key and adds its copy, named with prefix and labelled
// with labels, in namespace, to out, served for hosts (none: the names its certificate is for);
// or the finding saying why it is not served, which it also returns. With verifyHosts, a
// certificate that does not cover every host is not served (an Ingress's tls entry); without, it
// is served for them all the same (a Gateway listener's certificateRef, which the Gateway API
// takes as given).
func (c CertSecrets) Add(ctx context.Context, out *BYOCertificates, key client.ObjectKey, hosts []string, verifyHosts bool, prefix, namespace string, labels map[string]string) (*kit.Finding, error) {
	now := c.Now()
	src, err := c.get(ctx, key)
	if apierrors.IsForbidden(err) {
		c.Watches.Forget(ctx, key.Namespace)
		f := kit.Warnf(kit.ReasonTLSSecretNotPermitted,
			"the operator may not read Secrets in namespace %s, so TLS Secret %s is not read; %s not served: "+
				"to allow it, bind ClusterRole %s to the operator's ServiceAccount with a RoleBinding in %s",
			key.Namespace, key.Name, hostList(hosts), TLSSecretReaderRole, key.Namespace)
		out.Findings = append(out.Findings, f)
		if out.Recheck == 0 || NotPermittedRecheck < out.Recheck {
			out.Recheck = NotPermittedRecheck
		}
		return &f, nil
	}
	if err == nil || apierrors.IsNotFound(err) {
		// Readable here: see the Secret change, or appear.
		if werr := c.Watches.Watch(ctx, key.Namespace); werr != nil {
			return nil, fmt.Errorf("watching the TLS Secrets of namespace %s: %w", key.Namespace, werr)
		}
	}
	if apierrors.IsNotFound(err) {
		f := kit.Warnf(kit.ReasonTLSSecretNotFound, "TLS Secret %s does not exist; %s not served", key, hostList(hosts))
		out.Findings = append(out.Findings, f)
		return &f, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading TLS Secret %s: %w", key, err)
	}
	if len(hosts) == 0 {
		hosts = certificateNames(src)
	}
	verified := hosts
	if !verifyHosts {
		verified = nil
	}
	notAfter, f := CheckTLSSecret(src, verified, now)
	if f == nil && len(hosts) == 0 {
		g := kit.Warnf(kit.ReasonTLSSecretInvalid, "TLS Secret %s: the certificate names no DNS name to serve it for", key)
		f = &g
	}
	if f != nil {
		out.Findings = append(out.Findings, *f)
		return f, nil
	}
	if d := notAfter.Sub(now); out.Recheck == 0 || d < out.Recheck {
		out.Recheck = d
	}
	name := CertCopyName(prefix, key.Namespace, key.Name)
	if slices.ContainsFunc(out.Copies, func(s *corev1.Secret) bool { return s.Name == name }) {
		for i := range out.Refs {
			if out.Refs[i].SecretName == name {
				out.Refs[i].Hosts = slices.Compact(slices.Sorted(slices.Values(append(out.Refs[i].Hosts, hosts...))))
			}
		}
		return nil, nil
	}
	out.Copies = append(out.Copies, buildCertCopy(name, namespace, labels, src))
	out.Refs = append(out.Refs, contract.CertificateRef{SecretName: name, Hosts: hosts})
	return nil, nil
}

// hostList names hosts in a message: "its names" when there are none yet (a certificate's own).
func hostList(hosts []string) string {
	if len(hosts) == 0 {
		return "its names"
	}
	return strings.Join(hosts, ", ")
}

// certificateNames are the DNS names, lower-cased, of a TLS Secret's certificate (none when it
// does not parse: CheckTLSSecret says why).
func certificateNames(s *corev1.Secret) []string {
	block, _ := pem.Decode(s.Data[corev1.TLSCertKey])
	if block == nil {
		return nil
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(leaf.DNSNames))
	for _, n := range leaf.DNSNames {
		if contract.ValidHost(strings.ToLower(n)) {
			names = append(names, strings.ToLower(n))
		}
	}
	return names
}

// indexCertCopies indexes the certificate copies among the operator's Secrets, which both
// Ingress reconcilers prune on every pass: a label selector alone scanned every Secret of the
// namespace (each Ingress on a group has one), which grew with the square of their number.
const indexCertCopies = "tsingress.secret.certificate-copy"

func IndexCertificateCopies(mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Secret{}, indexCertCopies, func(o client.Object) []string {
		if o.GetLabels()[kit.LabelSecretType] != SecretTypeCertCopy {
			return nil
		}
		return []string{"true"}
	})
}

// PruneCertCopies deletes the certificate copies labelled with labels that are not in keep.
func PruneCertCopies(ctx context.Context, c client.Client, namespace string, labels map[string]string, keep []*corev1.Secret) error {
	list := &corev1.SecretList{}
	if err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels(labels), client.MatchingFields{indexCertCopies: "true"}); err != nil {
		return fmt.Errorf("listing the certificate copies in %s: %w", namespace, err)
	}
	for i := range list.Items {
		s := &list.Items[i]
		if slices.ContainsFunc(keep, func(k *corev1.Secret) bool { return k.Name == s.Name }) {
			continue
		}
		if err := kit.Remove(ctx, c, s); err != nil {
			return fmt.Errorf("deleting the certificate copy %s/%s: %w", s.Namespace, s.Name, err)
		}
	}
	return nil
}

func SecretNames(ss []*corev1.Secret) []string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.Name
	}
	return names
}

// CertGuard keeps proxies within the ACME CA's rate limits: it records every certificate the
// proxies report and decides, before a proxy may ask the CA, whether the limits allow it.
type CertGuard struct {
	client.Client
	Namespace string
	Limits    acmebudget.Limits
	Now       func() time.Time
	// api reads the ledger after a conflict, when the cache may lag; nil means the cache.
	API       client.Reader
	batch     kit.Batcher[ledgerChange] // one writer per operator; the API's optimistic locking covers others
	batchOnce sync.Once
	last      kit.LastWritten[*corev1.ConfigMap]

	// observed is the serial last counted per name: replicas report every certificate of the
	// group in every report, and each reconcile of an object on the group passes them all here.
	observedMu sync.Mutex
	observed   map[string]string
	// observedReports are the parsed reports (shared, unchanged while their Secrets are) whose
	// every certificate was counted: each reconcile of an object on a large group would
	// otherwise look at every certificate of the group again.
	observedReports map[weak.Pointer[contract.ProxyState]]bool

	parts       ledgerParts
	domainsMu   sync.Mutex
	domains     map[string]*domainLedger // as last read
	SegmentSize int                      // of the ledger's segments; ledgerSegmentBytes when 0
}

// ObserveReport is observe for a replica's parsed report, once per report.
func (g *CertGuard) ObserveReport(ctx context.Context, st *contract.ProxyState, staging bool) error {
	key := weak.Make(st)
	g.observedMu.Lock()
	done := g.observedReports[key]
	g.observedMu.Unlock()
	if done {
		return nil
	}
	if err := g.Observe(ctx, st.Certificates, staging); err != nil {
		return err
	}
	g.observedMu.Lock()
	defer g.observedMu.Unlock()
	if g.observedReports == nil || len(g.observedReports) >= 1024 { // reports replaced since: start over
		g.observedReports = map[weak.Pointer[contract.ProxyState]]bool{}
	}
	g.observedReports[key] = true
	return nil
}

func (g *CertGuard) alreadyObserved(name, serial string) bool {
	g.observedMu.Lock()
	defer g.observedMu.Unlock()
	return g.observed[name] == serial
}

func (g *CertGuard) markObserved(name, serial string) {
	g.observedMu.Lock()
	defer g.observedMu.Unlock()
	if g.observed == nil {
		g.observed = map[string]string{}
	}
	g.observed[name] = serial
}

// Hold decides whether the proxy serving fqdn may ask the CA for a certificate now. cur is
// what the proxy reports for fqdn (zero when nothing). No hold means go ahead; a certificate
// that needs no issuance now costs nothing. An empty fqdn (tailnet domain not known yet) holds
// until the proxy has joined and reported it.
func (g *CertGuard) Hold(ctx context.Context, fqdn string, cur contract.CertificateStatus) (*contract.IssuanceHold, error) {
	now := g.Now()
	if fqdn == "" {
		return &contract.IssuanceHold{Reason: kit.ReasonWaitingForTailnetDomain,
			Message: "the tailnet's domain is not known yet; the certificate is requested once the proxy has joined"}, nil
	}
	if !cur.RenewDue(now) {
		return nil, nil
	}
	domain, err := acmebudget.Domain(fqdn)
	if err != nil {
		return nil, err
	}
	if g.reserved(ctx, domain, fqdn, now) {
		return nil, nil // as Reserve would say, without a turn at the ledger's writer
	}
	var h *acmebudget.Hold
	var reserved bool
	err = g.update(ctx, domain, func(l *acmebudget.Ledger) {
		n := len(l.Entries)
		h = l.Reserve(fqdn, cur.Serial != "", now, g.Limits)
		reserved = len(l.Entries) > n
	})
	if err != nil {
		return nil, fmt.Errorf("reserving a certificate issuance for %s in the ledger: %w", fqdn, err)
	}
	if reserved && h == nil {
		log.FromContext(ctx).Info("reserved a certificate issuance", "name", fqdn, "domain", domain, "renewal", cur.Serial != "")
	}
	if h == nil {
		return nil, nil
	}
	return &contract.IssuanceHold{Reason: h.Reason, Message: h.Message, Until: h.Until}, nil
}

// Observe records the certificates a proxy reports having obtained from the CA. The staging
// CA's certificates count against its own limits, not the production CA's this ledger keeps.
func (g *CertGuard) Observe(ctx context.Context, certs map[string]contract.CertificateStatus, staging bool) error {
	if staging {
		return nil
	}
	now := g.Now()
	byDomain := map[string][]acmebudget.Issued{}
	for name, c := range certs {
		if c.Source != contract.CertSourceACME || c.Serial == "" || g.alreadyObserved(name, c.Serial) {
			continue
		}
		domain, err := acmebudget.Domain(name)
		if err != nil {
			continue
		}
		byDomain[domain] = append(byDomain[domain], acmebudget.Issued{Name: name, Serial: c.Serial})
	}
	// One change per domain for every new certificate: a report of a large group brings many.
	for domain, certs := range byDomain {
		var counted []string
		err := g.update(ctx, domain, func(l *acmebudget.Ledger) { counted = l.Observe(now, certs...) })
		if err != nil {
			return fmt.Errorf("counting the certificates of %s in the ledger: %w", domain, err)
		}
		for _, c := range certs {
			g.markObserved(c.Name, c.Serial)
		}
		if len(counted) > 0 {
			log.FromContext(ctx).Info("counted certificates against the CA's limits", "domain", domain, "names", counted)
		}
	}
	return nil
}

// reserved reports whether the ledger, as last read, holds a reservation for name that still
// counts at now: Reserve would then change nothing and allow the request.
func (g *CertGuard) reserved(ctx context.Context, domain, name string, now time.Time) bool {
	segs, err := g.segments(ctx, g.Client, true)
	if err != nil {
		return false
	}
	return g.readDomain(ctx, segs, domain).ledger.HasReservation(name, now, g.Limits)
}

// ledgerChange is a change of one domain's ledger.
type ledgerChange struct {
	domain string
	change func(*acmebudget.Ledger)
}

// update applies change to one domain's ledger, in one write with the changes other
// reconcilers make meanwhile. The ledger grows with the names of the tailnet's domain, which
// every new name reserves in.
func (g *CertGuard) update(ctx context.Context, domain string, change func(*acmebudget.Ledger)) error {
	g.batchOnce.Do(func() { g.batch.Flush = g.flushLedger })
	return g.batch.Do(ctx, LedgerConfigMap, ledgerChange{domain: domain, change: change}) // one queue for every segment
}

// flushLedger applies a batch of changes to the ledger ConfigMap.
func (g *CertGuard) flushLedger(_ string, batch []ledgerChange) []error {
	ctx, cancel := context.WithTimeout(context.Background(), kit.FlushTimeout)
	defer cancel()
	errs := make([]error, len(batch))
	err := g.writeLedger(ctx, batch)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// Decide sets c.hold for the tailnet name (none when staging: its limits are for testing) and
// reports a hold or a failing CA on obj.
func (g *CertGuard) Decide(ctx context.Context, rep kit.Reporter, obj client.Object, c *TailnetCert, staging bool) error {
	if staging {
		return nil
	}
	hold, err := g.Hold(ctx, c.FQDN, c.Cur)
	if err != nil {
		return err
	}
	c.Hold = hold
	if hold != nil && hold.Reason != kit.ReasonWaitingForTailnetDomain {
		rep.Warning(obj, hold.Reason, "no new certificate for %s: %s", c.FQDN, hold.Message)
	}
	if c.Cur.Reason == contract.CertReasonIssuanceFailed {
		rep.Warning(obj, kit.ReasonCertificateIssueFailed, "certificate for %s: %s", c.FQDN, c.Cur.Message)
	}
	return nil
}

// CertificateIssued reports, once per certificate, the CA's certificate for the tailnet name.
func CertificateIssued(r kit.Reporter, obj client.Object, c TailnetCert, now time.Time) {
	if c.Cur.Source == contract.CertSourceACME && c.Cur.Valid(now) {
		r.Progress(obj, "certificate "+c.FQDN, kit.ReasonCertificateIssued, "the CA issued the certificate for %s, valid until %s",
			c.FQDN, c.Cur.NotAfter.UTC().Format(time.RFC3339))
	}
}

// CertPortError is the status.loadBalancer port error of an HTTPS name: why it is not served
// with a certificate, or "" when it is (or may still be).
func CertPortError(hold *contract.IssuanceHold, cur contract.CertificateStatus, now time.Time) string {
	switch {
	case cur.Valid(now):
		return ""
	case hold != nil:
		return hold.Reason
	case cur.Reason == contract.CertReasonIssuanceFailed:
		return kit.ReasonCertificateIssueFailed
	}
	return ""
}

// TailnetCert is the state of an Ingress's tailnet name's certificate during a pass.
type TailnetCert struct {
	FQDN string
	Cur  contract.CertificateStatus
	Hold *contract.IssuanceHold
}

// Recheck is when to look again without a watch event: when a hold ends or a bring-your-own
// certificate expires (0: no need).
func (c TailnetCert) Recheck(byo time.Duration, now time.Time) time.Duration {
	d := byo
	if c.Hold != nil && !c.Hold.Until.IsZero() {
		if h := c.Hold.Until.Sub(now) + time.Second; d == 0 || h < d {
			d = h
		}
	}
	return d
}
