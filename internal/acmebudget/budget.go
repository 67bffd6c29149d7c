// Package acmebudget keeps an account of the certificates a tailnet's proxies obtain from an
// ACME CA, so that the operator stops asking before the CA's rate limits refuse it.
//
// Let's Encrypt allows 50 new certificates per registered domain and 5 certificates for one
// exact set of names in any 7 days. A tailnet's names (x.tailnet-1234.ts.net) share one
// registered domain, since ts.net is a public suffix. Renewals are exempt from the first limit
// but not from the second.
package acmebudget

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/publicsuffix"
)

// Limits are a CA's rate limits.
type Limits struct {
	// PerDomain is how many new (non-renewal) certificates one registered domain may get per Window.
	PerDomain int
	// PerName is how many certificates one name may get per Window, renewals included.
	PerName int
	Window  time.Duration
}

// LetsEncrypt are Let's Encrypt's production limits.
var LetsEncrypt = Limits{PerDomain: 50, PerName: 5, Window: 7 * 24 * time.Hour}

// Entry is one certificate counted against the limits: issued (Serial known) or reserved (the
// operator allowed a proxy to ask for it and has not seen the certificate yet).
type Entry struct {
	Name     string    `json:"name"`
	At       time.Time `json:"at"`
	Serial   string    `json:"serial,omitempty"`
	Renewal  bool      `json:"renewal,omitempty"`
	Reserved bool      `json:"reserved,omitempty"`
}

// Ledger is the account of one registered domain.
type Ledger struct {
	Entries []Entry `json:"entries"`
	// Known lists names that have had a certificate, with when it was last seen, so that a new
	// request for them is a renewal. Kept for a certificate's lifetime.
	Known map[string]time.Time `json:"known,omitempty"`
}

// knownFor is how long a name counts as having had a certificate: Let's Encrypt's lifetime.
const knownFor = 90 * 24 * time.Hour

// Domain is the registered domain a name's certificate counts against.
func Domain(name string) (string, error) {
	d, err := publicsuffix.EffectiveTLDPlusOne(strings.ToLower(strings.TrimSuffix(name, ".")))
	if err != nil {
		return "", fmt.Errorf("registered domain of %q: %w", name, err)
	}
	return d, nil
}

// Prune forgets what no longer counts at now.
func (l *Ledger) Prune(now time.Time, lim Limits) {
	l.Entries = slices.DeleteFunc(l.Entries, func(e Entry) bool { return !now.Before(e.At.Add(lim.Window)) })
	for name, at := range l.Known {
		if !now.Before(at.Add(knownFor)) {
			delete(l.Known, name)
		}
	}
}

// Issued is a certificate a proxy serves: the name it is for and its serial.
type Issued struct{ Name, Serial string }

// Observe records certificates proxies serve, and returns the names of those it counted. Each
// serial counts once: it fills its name's reservation if there is one, else it is a
// certificate the operator did not see coming (a proxy that lost its cache) and is added.
// The ledger is indexed once per call: a large group's report brings thousands at once.
func (l *Ledger) Observe(now time.Time, certs ...Issued) (counted []string) {
	serials := make(map[string]bool, len(l.Entries))
	reservations := map[string]int{}
	for i, e := range l.Entries {
		if e.Serial != "" {
			serials[e.Serial] = true
		}
		if _, ok := reservations[e.Name]; e.Reserved && !ok {
			reservations[e.Name] = i
		}
	}
	for _, c := range certs {
		if c.Serial == "" || serials[c.Serial] {
			continue
		}
		serials[c.Serial] = true
		counted = append(counted, c.Name)
		renewal := l.knownBefore(c.Name, now)
		l.remember(c.Name, now)
		if i, ok := reservations[c.Name]; ok {
			l.Entries[i].Serial, l.Entries[i].Reserved = c.Serial, false
			delete(reservations, c.Name)
			continue
		}
		l.Entries = append(l.Entries, Entry{Name: c.Name, At: now, Serial: c.Serial, Renewal: renewal})
	}
	return counted
}

func (l *Ledger) remember(name string, now time.Time) {
	if l.Known == nil {
		l.Known = map[string]time.Time{}
	}
	if _, ok := l.Known[name]; !ok {
		l.Known[name] = now
	}
}

// knownBefore reports whether name had a certificate before now.
func (l *Ledger) knownBefore(name string, now time.Time) bool {
	at, ok := l.Known[name]
	return ok && at.Before(now)
}

// HasReservation reports whether name has a reservation that still counts at now.
func (l *Ledger) HasReservation(name string, now time.Time, lim Limits) bool {
	return slices.ContainsFunc(l.Entries, func(e Entry) bool {
		return e.Name == name && e.Reserved && now.Before(e.At.Add(lim.Window))
	})
}

// Clone copies the ledger, to change it while others read the original.
func (l *Ledger) Clone() *Ledger {
	return &Ledger{Entries: slices.Clone(l.Entries), Known: maps.Clone(l.Known)}
}

// Union is the ledger kept in parts (segments of storage): their entries in order, and each
// known name at the earliest time a part knows it.
func Union(parts ...*Ledger) *Ledger {
	u := &Ledger{}
	for _, p := range parts {
		if p == nil {
			continue
		}
		u.Entries = append(u.Entries, p.Entries...)
		for name, at := range p.Known {
			if prev, ok := u.Known[name]; !ok || at.Before(prev) {
				if u.Known == nil {
					u.Known = map[string]time.Time{}
				}
				u.Known[name] = at
			}
		}
	}
	return u
}

// Empty reports whether the ledger holds nothing.
func (l *Ledger) Empty() bool { return len(l.Entries) == 0 && len(l.Known) == 0 }

func (l *Ledger) reservation(name string) int {
	return slices.IndexFunc(l.Entries, func(e Entry) bool { return e.Name == name && e.Reserved })
}

// Hold says that a certificate may not be requested now, and until when.
type Hold struct {
	Reason  string
	Message string
	Until   time.Time
}

// Stable reasons of a Hold.
const (
	ReasonDomainLimit = "CertificateRateLimited"
	ReasonNameLimit   = "DuplicateCertificateLimit"
)

// Reserve asks to let a proxy request a certificate for name at now. If the limits allow it,
// a reservation is recorded (one per name: asking again while it is open reuses it, so a CA
// that keeps failing costs nothing) and Reserve returns nil. Otherwise it returns the Hold.
// hadCertificate says the proxy holds (or held) a certificate for name: a renewal.
func (l *Ledger) Reserve(name string, hadCertificate bool, now time.Time, lim Limits) *Hold {
	l.Prune(now, lim)
	if l.reservation(name) >= 0 {
		return nil
	}
	renewal := hadCertificate || l.knownBefore(name, now)
	// Counted first: a large domain reserves often, and is rarely held.
	nName, nDomain := 0, 0
	for _, e := range l.Entries {
		if e.Name == name {
			nName++
		}
		if !e.Renewal {
			nDomain++
		}
	}
	if nName >= lim.PerName {
		forName := l.times(func(e Entry) bool { return e.Name == name })
		until := nthOldest(forName, len(forName)-lim.PerName).Add(lim.Window)
		return &Hold{Reason: ReasonNameLimit, Until: until, Message: fmt.Sprintf(
			"%d certificates for %s in the last %s reach the CA's limit of %d; the next may be requested after %s",
			len(forName), name, lim.Window, lim.PerName, until.UTC().Format(time.RFC3339))}
	}
	if !renewal && nDomain >= lim.PerDomain {
		forDomain := l.times(func(e Entry) bool { return !e.Renewal })
		until := nthOldest(forDomain, len(forDomain)-lim.PerDomain).Add(lim.Window)
		return &Hold{Reason: ReasonDomainLimit, Until: until, Message: fmt.Sprintf(
			"%d new certificates for the tailnet's domain in the last %s reach the CA's limit of %d; %s may get one after %s",
			len(forDomain), lim.Window, lim.PerDomain, name, until.UTC().Format(time.RFC3339))}
	}
	l.Entries = append(l.Entries, Entry{Name: name, At: now, Renewal: renewal, Reserved: true})
	return nil
}

// times are the times of the entries that match.
func (l *Ledger) times(match func(Entry) bool) []time.Time {
	var ts []time.Time
	for _, e := range l.Entries {
		if match(e) {
			ts = append(ts, e.At)
		}
	}
	return ts
}

// nthOldest returns the i-th oldest time (0 is the oldest): once it leaves the window, one
// more certificate fits.
func nthOldest(ts []time.Time, i int) time.Time {
	s := slices.Clone(ts)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	return s[i]
}

// Usage is what the ledger counts at now against each limit, as Reserve counts it
// (reservations included): new certificates of the domain, and certificates per name.
func (l *Ledger) Usage(now time.Time, lim Limits) (newForDomain int, perName map[string]int) {
	perName = map[string]int{}
	for _, e := range l.Entries {
		if !now.Before(e.At.Add(lim.Window)) {
			continue
		}
		perName[e.Name]++
		if !e.Renewal {
			newForDomain++
		}
	}
	return newForDomain, perName
}
