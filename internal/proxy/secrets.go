package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/backoff"
)

// secretState is a watched Secret as last seen.
type secretState struct {
	exists bool
	typ    corev1.SecretType
	data   map[string][]byte
	err    error // reading it failed (forbidden, say)

	pair     *tls.Certificate // tls.crt and tls.key, parsed once per change
	rejected string           // why the Secret cannot be a kubernetes.io/tls certificate; "" if it can
}

func newSecretState(sec *corev1.Secret, err error) secretState {
	st := secretState{err: err}
	switch {
	case err != nil:
		st.rejected = "reading it failed: " + err.Error()
		return st
	case sec == nil:
		st.rejected = "it does not exist"
		return st
	}
	st.exists, st.typ, st.data = true, sec.Type, sec.Data
	if sec.Type != corev1.SecretTypeTLS {
		st.rejected = fmt.Sprintf("it is of type %q, not %s", sec.Type, corev1.SecretTypeTLS)
		return st
	}
	if len(sec.Data[corev1.TLSCertKey]) == 0 || len(sec.Data[corev1.TLSPrivateKeyKey]) == 0 {
		st.rejected = "it holds no certificate (empty tls.crt or tls.key)"
		return st
	}
	pair, perr := tls.X509KeyPair(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if perr != nil {
		st.rejected = "its tls.crt and tls.key are not a certificate and its key: " + perr.Error()
		return st
	}
	if pair.Leaf == nil {
		if pair.Leaf, perr = x509.ParseCertificate(pair.Certificate[0]); perr != nil {
			st.rejected = "its tls.crt is not a certificate: " + perr.Error()
			return st
		}
	}
	st.pair = &pair
	return st
}

func (s secretState) same(o secretState) bool {
	return s.exists == o.exists && s.typ == o.typ && maps.EqualFunc(s.data, o.data, func(a, b []byte) bool { return string(a) == string(b) }) &&
		errString(s.err) == errString(o.err)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// shared is the state as a ProxyGroup's certificate Secret.
func (s secretState) shared() sharedSecret {
	sh := sharedSecret{certPEM: s.data[corev1.TLSCertKey], keyPEM: s.data[corev1.TLSPrivateKeyKey], problem: s.rejected}
	if !s.exists || s.typ != corev1.SecretTypeTLS {
		sh.unusable = s.rejected
	}
	return sh
}

// watchSecret follows one Secret, by name (a field selector: all that a Role granting it by
// resourceNames allows), and sends each state it sees: missing, present, or unreadable.
func watchSecret(ctx context.Context, secrets corev1client.SecretInterface, name string, send func(secretState)) {
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
	retry := backoff.Backoff{Min: time.Second, Max: time.Minute, Jitter: true}
	for ctx.Err() == nil {
		list, err := secrets.List(ctx, opts)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			send(newSecretState(nil, err))
			sleep(ctx, retry.Fail(time.Now()))
			continue
		}
		retry.Reset()
		var cur *corev1.Secret
		if len(list.Items) > 0 {
			cur = &list.Items[0]
		}
		send(newSecretState(cur, nil))
		wopts := opts
		wopts.ResourceVersion = list.ResourceVersion
		w, err := secrets.Watch(ctx, wopts)
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			sec, _ := ev.Object.(*corev1.Secret)
			switch ev.Type {
			case watch.Added, watch.Modified:
				send(newSecretState(sec, nil))
			case watch.Deleted:
				send(newSecretState(nil, nil))
			case watch.Error: // an expired resource version, say: list again
				w.Stop()
			}
		}
		w.Stop()
	}
}

// secretWatches keeps one watch per Secret that the served names need, and their last states.
// It belongs to the owner's loop: watches hand their news to it through send, which the loop
// runs and then judges the certificates again.
type secretWatches struct {
	secrets corev1client.SecretInterface // nil without the Kubernetes API
	send    func(ctx context.Context, ev func())
	log     *slog.Logger
	watches map[string]context.CancelFunc
	states  map[string]secretState // only of watched Secrets that reported
}

func newSecretWatches(secrets corev1client.SecretInterface, send func(context.Context, func()), log *slog.Logger) *secretWatches {
	return &secretWatches{secrets: secrets, send: send, log: log,
		watches: map[string]context.CancelFunc{}, states: map[string]secretState{}}
}

// want watches exactly the named Secrets.
func (w *secretWatches) want(ctx context.Context, names []string) {
	if w.secrets == nil {
		return
	}
	for name, stop := range w.watches {
		if !slices.Contains(names, name) {
			stop()
			delete(w.watches, name)
			delete(w.states, name)
		}
	}
	for _, name := range names {
		if _, ok := w.watches[name]; ok {
			continue
		}
		wctx, stop := context.WithCancel(ctx)
		w.watches[name] = stop
		go watchSecret(wctx, w.secrets, name, func(st secretState) {
			w.send(wctx, func() {
				if wctx.Err() != nil {
					return // no longer wanted
				}
				if st.err != nil {
					w.log.Warn("reading a certificate Secret failed", "secret", name, "err", st.err)
				}
				old, seen := w.states[name]
				if next, changed := nextSecretState(old, seen, st); changed {
					w.states[name] = next
				}
			})
		})
	}
}

// nextSecretState is what a watched Secret's state becomes when st is seen, and whether it
// changed. A read that fails keeps what the last good read saw: an API server away for a while
// must not take a certificate from a proxy that serves it (a ProxyGroup's reading replicas
// stopped advertising their services during an API server outage).
func nextSecretState(old secretState, seen bool, st secretState) (secretState, bool) {
	switch {
	case seen && old.same(st):
		return old, false
	case seen && st.err != nil && old.err == nil:
		return old, false
	}
	return st, true
}

// state returns the Secret's last state, and whether it has reported yet.
func (w *secretWatches) state(name string) (secretState, bool) {
	if w.secrets == nil {
		return secretState{rejected: "this proxy does not use the Kubernetes API, where bring-your-own certificates are kept"}, true
	}
	st, ok := w.states[name]
	return st, ok
}

// byoNames lists the Secrets of a web service's bring-your-own certificates.
func byoNames(ws contract.WebService) []string {
	var names []string
	for _, c := range ws.TLS.Certificates {
		names = append(names, c.SecretName)
	}
	return names
}

// hostCerts are a web service's bring-your-own certificates as judged now: per host, the
// certificate to present (nil when there is no usable one) and the status to report.
type hostCerts struct {
	certs  map[string]*tls.Certificate
	status map[string]contract.CertificateStatus
	// next is when a certificate becomes valid or expires, so that they are judged again; zero
	// if never.
	next time.Time
}

// judgeHosts judges the bring-your-own certificates of ws. A Secret not seen yet gives its
// hosts no certificate and no status; one that is missing, not kubernetes.io/tls, malformed,
// expired or not for the host gives reason SecretInvalid.
func judgeHosts(ws contract.WebService, lookup func(secret string) (secretState, bool), now time.Time) hostCerts {
	hc := hostCerts{certs: map[string]*tls.Certificate{}, status: map[string]contract.CertificateStatus{}}
	soon := func(t time.Time) {
		if hc.next.IsZero() || t.Before(hc.next) {
			hc.next = t
		}
	}
	for _, ref := range ws.TLS.Certificates {
		st, seen := lookup(ref.SecretName)
		for _, host := range ref.Hosts {
			if hc.certs[host] != nil {
				continue // an earlier Secret serves it
			}
			hc.certs[host] = nil
			if !seen {
				continue
			}
			why := st.rejected
			if why == "" {
				leaf := st.pair.Leaf
				switch {
				case now.Before(leaf.NotBefore):
					why = "its certificate is not valid before " + leaf.NotBefore.UTC().Format(time.RFC3339)
					soon(leaf.NotBefore)
				case !now.Before(leaf.NotAfter):
					why = "its certificate expired at " + leaf.NotAfter.UTC().Format(time.RFC3339)
				default:
					if err := leaf.VerifyHostname(host); err != nil {
						why = "its certificate is not for " + host + ": " + err.Error()
					}
				}
			}
			if why != "" {
				if _, ok := hc.status[host]; !ok {
					hc.status[host] = contract.CertificateStatus{Reason: contract.CertReasonSecretInvalid,
						Message: fmt.Sprintf("Secret %s: %s", ref.SecretName, why)}
				}
				continue
			}
			hc.certs[host] = st.pair
			hc.status[host] = certStatus(&servedCert{leaf: st.pair.Leaf}, contract.CertSourceSecret)
			soon(st.pair.Leaf.NotAfter)
		}
	}
	return hc
}

// serving reports whether some host has a usable certificate.
func (hc hostCerts) serving() bool {
	for _, c := range hc.certs {
		if c != nil {
			return true
		}
	}
	return false
}

// sameCerts reports whether two judgements present the same certificates.
func (hc hostCerts) sameCerts(o hostCerts) bool {
	return maps.Equal(hc.certs, o.certs)
}
