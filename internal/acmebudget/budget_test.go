package acmebudget

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

// issue reserves and observes one certificate for name at now, as a proxy's life would.
func issue(t *testing.T, l *Ledger, name string, now time.Time, lim Limits) {
	t.Helper()
	if h := l.Reserve(name, false, now, lim); h != nil {
		t.Fatalf("%s at %s: held: %s", name, now, h.Message)
	}
	l.Observe(now, Issued{name, fmt.Sprintf("%s-%d", name, now.UnixNano())})
}

func TestDomainLimitOverARollingWeek(t *testing.T) {
	l := &Ledger{}
	lim := LetsEncrypt
	now := t0
	for i := range 50 {
		issue(t, l, fmt.Sprintf("app%d.tail1.ts.net", i), now, lim)
		now = now.Add(time.Hour)
	}
	h := l.Reserve("late.tail1.ts.net", false, now, lim)
	if h == nil || h.Reason != ReasonDomainLimit {
		t.Fatalf("51st new name: hold = %+v, want %s", h, ReasonDomainLimit)
	}
	if want := t0.Add(lim.Window); !h.Until.Equal(want) {
		t.Errorf("held until %s, want %s (when the oldest leaves the window)", h.Until, want)
	}
	// A renewal of a name already issued is exempt from the domain limit.
	if h := l.Reserve("app0.tail1.ts.net", true, now, lim); h != nil {
		t.Errorf("renewal held: %s", h.Message)
	}
	// One second before the oldest leaves the window: still held; at that moment: allowed.
	if h := l.Reserve("late.tail1.ts.net", false, h.Until.Add(-time.Second), lim); h == nil {
		t.Error("allowed before the window moved")
	}
	if h := l.Reserve("late.tail1.ts.net", false, t0.Add(lim.Window), lim); h != nil {
		t.Errorf("held after the window moved: %s", h.Message)
	}
}

func TestDuplicateLimitCountsRenewals(t *testing.T) {
	l := &Ledger{}
	lim := LetsEncrypt
	now := t0
	for range 5 {
		issue(t, l, "web.tail1.ts.net", now, lim)
		now = now.Add(10 * time.Minute)
	}
	h := l.Reserve("web.tail1.ts.net", true, now, lim)
	if h == nil || h.Reason != ReasonNameLimit {
		t.Fatalf("6th certificate for one name: hold = %+v, want %s", h, ReasonNameLimit)
	}
	if want := t0.Add(lim.Window); !h.Until.Equal(want) {
		t.Errorf("held until %s, want %s", h.Until, want)
	}
	if h := l.Reserve("other.tail1.ts.net", false, now, lim); h != nil {
		t.Errorf("another name held by one name's limit: %s", h.Message)
	}
}

// A CA that keeps failing costs nothing: asking again reuses the open reservation.
func TestReservationIsReusedUntilObserved(t *testing.T) {
	l := &Ledger{}
	lim := Limits{PerDomain: 2, PerName: 5, Window: 24 * time.Hour}
	for i := range 10 {
		if h := l.Reserve("web.tail1.ts.net", false, t0.Add(time.Duration(i)*time.Minute), lim); h != nil {
			t.Fatalf("retry %d held: %s", i, h.Message)
		}
	}
	if len(l.Entries) != 1 {
		t.Fatalf("%d entries after retries, want 1", len(l.Entries))
	}
	if len(l.Observe(t0.Add(time.Hour), Issued{"web.tail1.ts.net", "01"})) == 0 {
		t.Fatal("observing the certificate changed nothing")
	}
	if len(l.Observe(t0.Add(2*time.Hour), Issued{"web.tail1.ts.net", "01"})) > 0 {
		t.Error("the same serial counted twice")
	}
	if len(l.Entries) != 1 || l.Entries[0].Reserved || l.Entries[0].Serial != "01" {
		t.Errorf("entries = %+v, want the reservation filled", l.Entries)
	}
}

// A certificate the operator did not reserve (a proxy that lost its cache) still counts.
func TestUnexpectedCertificateCounts(t *testing.T) {
	l := &Ledger{}
	lim := Limits{PerDomain: 1, PerName: 5, Window: 24 * time.Hour}
	l.Observe(t0, Issued{"a.tail1.ts.net", "01"})
	if h := l.Reserve("b.tail1.ts.net", false, t0.Add(time.Hour), lim); h == nil {
		t.Error("an observed, unreserved certificate did not count against the domain")
	}
	// A second serial of a known name is a renewal: it counts for the name only.
	l.Observe(t0.Add(2*time.Hour), Issued{"a.tail1.ts.net", "02"})
	if n := len(l.Entries); n != 2 || !l.Entries[1].Renewal {
		t.Errorf("entries = %+v, want the second serial counted as a renewal", l.Entries)
	}
}

// One call observes a report's certificates at once: each reservation filled by its own
// serial, a serial met twice counted once, an unreserved one added.
func TestObserveMany(t *testing.T) {
	lim := Limits{PerDomain: 10, PerName: 5, Window: 24 * time.Hour}
	l := &Ledger{}
	for _, name := range []string{"a.tail1.ts.net", "b.tail1.ts.net"} {
		if h := l.Reserve(name, false, t0, lim); h != nil {
			t.Fatal(h.Message)
		}
	}
	counted := l.Observe(t0.Add(time.Minute),
		Issued{"b.tail1.ts.net", "0b"}, Issued{"a.tail1.ts.net", "0a"}, Issued{"b.tail1.ts.net", "0b"},
		Issued{"c.tail1.ts.net", "0c"}, Issued{"d.tail1.ts.net", ""})
	if want := []string{"b.tail1.ts.net", "a.tail1.ts.net", "c.tail1.ts.net"}; !slices.Equal(counted, want) {
		t.Errorf("counted %v, want %v", counted, want)
	}
	want := []Entry{
		{Name: "a.tail1.ts.net", At: t0, Serial: "0a"},
		{Name: "b.tail1.ts.net", At: t0, Serial: "0b"},
		{Name: "c.tail1.ts.net", At: t0.Add(time.Minute), Serial: "0c"},
	}
	if !slices.Equal(l.Entries, want) {
		t.Errorf("entries = %+v, want %+v", l.Entries, want)
	}
	if len(l.Known) != 3 {
		t.Errorf("known = %v, want the three names", l.Known)
	}
	if again := l.Observe(t0.Add(time.Hour), Issued{"a.tail1.ts.net", "0a"}); len(again) != 0 {
		t.Errorf("a serial counted in an earlier call counted again: %v", again)
	}
}

func TestPruneForgetsOldEntries(t *testing.T) {
	l := &Ledger{}
	issue(t, l, "a.tail1.ts.net", t0, LetsEncrypt)
	l.Prune(t0.Add(LetsEncrypt.Window), LetsEncrypt)
	if len(l.Entries) != 0 {
		t.Errorf("entries after a week: %+v", l.Entries)
	}
	if _, ok := l.Known["a.tail1.ts.net"]; !ok {
		t.Error("the name was forgotten with its entry; a new request would not count as a renewal")
	}
	l.Prune(t0.Add(knownFor), LetsEncrypt)
	if len(l.Known) != 0 {
		t.Errorf("known after a certificate lifetime: %v", l.Known)
	}
}

func TestDomain(t *testing.T) {
	for name, want := range map[string]string{
		"web.tail1234.ts.net":  "tail1234.ts.net",
		"WEB.tail1234.ts.net.": "tail1234.ts.net",
		"a.b.example.co.uk":    "example.co.uk",
		"hello.tailnet.test":   "tailnet.test",
	} {
		if got, err := Domain(name); err != nil || got != want {
			t.Errorf("Domain(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := Domain("ts.net"); err == nil {
		t.Error("a public suffix has no registered domain")
	}
}

// Usage counts what Reserve counts: a name at its limit shows the limit, the domain its new
// certificates (renewals and entries past the window left out).
func TestUsageAgreesWithReserve(t *testing.T) {
	l := &Ledger{}
	lim := LetsEncrypt
	now := t0
	issue(t, l, "old.tail1.ts.net", now, lim)
	now = now.Add(lim.Window) // the first leaves the window
	for range 5 {
		issue(t, l, "web.tail1.ts.net", now, lim)
		now = now.Add(time.Minute)
	}
	if h := l.Reserve("api.tail1.ts.net", false, now, lim); h != nil { // open: counted too
		t.Fatal(h.Message)
	}
	domain, names := l.Usage(now, lim)
	// web's first is new; its four later ones are renewals of a name already known.
	if domain != 2 {
		t.Errorf("new certificates of the domain = %d, want 2 (web's first and api's reservation)", domain)
	}
	if names["web.tail1.ts.net"] != lim.PerName || names["api.tail1.ts.net"] != 1 || names["old.tail1.ts.net"] != 0 {
		t.Errorf("per name = %v", names)
	}
	if h := l.Reserve("web.tail1.ts.net", true, now, lim); h == nil || h.Reason != ReasonNameLimit {
		t.Errorf("a name Usage shows at its limit is not held: %+v", h)
	}
}

// HasReservation says what Reserve would: a reservation that still counts is reused without a
// change, one that has aged out of the window is not.
func TestHasReservationAgreesWithReserve(t *testing.T) {
	lim := Limits{PerDomain: 5, PerName: 5, Window: 24 * time.Hour}
	l := &Ledger{}
	if l.HasReservation("web.tail1.ts.net", t0, lim) {
		t.Fatal("a reservation in an empty ledger")
	}
	l.Reserve("web.tail1.ts.net", false, t0, lim)
	for _, at := range []time.Time{t0, t0.Add(time.Hour), t0.Add(lim.Window - time.Second), t0.Add(lim.Window)} {
		has := l.HasReservation("web.tail1.ts.net", at, lim)
		c := l.Clone()
		n := len(c.Entries)
		c.Reserve("web.tail1.ts.net", false, at, lim)
		unchanged := len(c.Entries) == n && c.Entries[len(c.Entries)-1].At.Equal(t0)
		if has != unchanged {
			t.Errorf("at %s: HasReservation %t, Reserve left the ledger unchanged %t", at.Sub(t0), has, unchanged)
		}
	}
	if l.HasReservation("other.tail1.ts.net", t0, lim) {
		t.Error("a reservation for another name")
	}
	l.Observe(t0.Add(time.Minute), Issued{"web.tail1.ts.net", "01"})
	if l.HasReservation("web.tail1.ts.net", t0.Add(time.Minute), lim) {
		t.Error("a filled reservation still counts as one")
	}
}

func TestCloneIsIndependent(t *testing.T) {
	lim := Limits{PerDomain: 5, PerName: 5, Window: 24 * time.Hour}
	l := &Ledger{}
	issue(t, l, "a.tail1.ts.net", t0, lim)
	c := l.Clone()
	issue(t, c, "b.tail1.ts.net", t0, lim)
	if len(l.Entries) != 1 || len(l.Known) != 1 {
		t.Errorf("a change of the clone reached the original: %+v", l)
	}
}

func TestUnionOfParts(t *testing.T) {
	a := &Ledger{Entries: []Entry{{Name: "a.x.ts.net", At: t0, Serial: "1"}}, Known: map[string]time.Time{"a.x.ts.net": t0, "b.x.ts.net": t0.Add(time.Hour)}}
	b := &Ledger{Entries: []Entry{{Name: "b.x.ts.net", At: t0.Add(time.Hour), Reserved: true}}, Known: map[string]time.Time{"b.x.ts.net": t0}}
	u := Union(a, nil, b)
	if len(u.Entries) != 2 || u.Entries[0].Name != "a.x.ts.net" || u.Entries[1].Name != "b.x.ts.net" {
		t.Errorf("entries %+v; want a's then b's", u.Entries)
	}
	if !u.Known["b.x.ts.net"].Equal(t0) || len(u.Known) != 2 {
		t.Errorf("known %v; want each name at its earliest", u.Known)
	}
	if !u.HasReservation("b.x.ts.net", t0.Add(2*time.Hour), LetsEncrypt) {
		t.Error("the union lost b's reservation")
	}
	if Union().Empty() != true || u.Empty() {
		t.Error("Empty is wrong")
	}
}

// A reservation in a domain of 5,000 names in the window (raised limits, a private CA), as a
// large ProxyGroup makes one per new name: linear in the entries, without allocating for them.
func BenchmarkReserveLargeDomain(b *testing.B) {
	lim := Limits{PerDomain: 100000, PerName: 5, Window: 7 * 24 * time.Hour}
	l := &Ledger{}
	for i := range 5000 {
		l.Reserve(fmt.Sprintf("web-%05d.x.ts.net", i), false, t0, lim)
	}
	b.ReportAllocs()
	for b.Loop() {
		if h := l.Reserve("new.x.ts.net", false, t0, lim); h != nil {
			b.Fatal(h.Message)
		}
		l.Entries = l.Entries[:5000] // the next reserves anew
	}
}

// A report of a large group observes every one of its certificates in one call.
func BenchmarkObserveLargeDomain(b *testing.B) {
	lim := Limits{PerDomain: 100000, PerName: 5, Window: 7 * 24 * time.Hour}
	base := &Ledger{}
	var certs []Issued
	for i := range 5000 {
		name := fmt.Sprintf("web-%05d.x.ts.net", i)
		base.Reserve(name, false, t0, lim)
		certs = append(certs, Issued{name, fmt.Sprintf("%05d", i)})
	}
	b.ReportAllocs()
	for b.Loop() {
		l := base.Clone()
		if n := len(l.Observe(t0, certs...)); n != len(certs) {
			b.Fatalf("counted %d of %d", n, len(certs))
		}
	}
}
