package certs

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// The certificate ledger is kept in segments: the ConfigMap ledgerConfigMap (which held the
// whole ledger before segments existed) and ledgerConfigMap-1, -2, ..., each with one key per
// registered domain holding that domain's part. A domain's ledger is the union of its parts.
// An entry or known name stays in the segment it was written to and new ones go to the first
// segment with room, so a change rewrites the segments holding what it changed, not the whole
// account: every new name of a tailnet reserves in its domain's ledger, which held every name
// of the last 90 days in one object (907 KiB at 5,000 names, past the API's 1 MiB near 5,600).
const (
	LedgerConfigMap = "tsingress-acme-ledger"
	// ledgerSegmentBytes is what a segment is filled to with new entries; an entry filled in
	// later (its serial) may grow it by about a third.
	ledgerSegmentBytes = 64 << 10
)

func LedgerSegmentName(i int) string {
	if i == 0 {
		return LedgerConfigMap
	}
	return LedgerConfigMap + "-" + strconv.Itoa(i)
}

func ledgerSegmentIndex(name string) (int, bool) {
	if name == LedgerConfigMap {
		return 0, true
	}
	rest, ok := strings.CutPrefix(name, LedgerConfigMap+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i > 0 && LedgerSegmentName(i) == name
}

func LedgerKey(domain string) string { return domain + ".json" }

// ledgerSegment is one segment as read.
type ledgerSegment struct {
	index int
	CM    *corev1.ConfigMap // shared with the cache: copy it to change it
}

// Size is the bytes of the segment's data.
func (s ledgerSegment) Size() int {
	n := 0
	for k, v := range s.CM.Data {
		n += len(k) + len(v)
	}
	return n
}

// ListLedgerSegments returns the ledger's segments in order, as reader has them.
func ListLedgerSegments(ctx context.Context, reader client.Reader, namespace string) ([]ledgerSegment, error) {
	list := &corev1.ConfigMapList{}
	if err := reader.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{kit.LabelManaged: "true"}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the certificate ledger's ConfigMaps in %s: %w", namespace, err)
	}
	var segs []ledgerSegment
	for i := range list.Items {
		if idx, ok := ledgerSegmentIndex(list.Items[i].Name); ok {
			segs = append(segs, ledgerSegment{index: idx, CM: &list.Items[i]})
		}
	}
	slices.SortFunc(segs, func(a, b ledgerSegment) int { return a.index - b.index })
	return segs, nil
}

// ledgerParts decodes the segments' parts, each once per version of its segment: with many
// names, decoding per reconcile cost more than the reconcile.
type ledgerParts struct {
	mu   sync.Mutex
	segs map[string]decodedSegment // by segment name
}

type decodedSegment struct {
	uid      types.UID
	version  string
	byDomain map[string]*acmebudget.Ledger
}

// part returns domain's part in seg (nil when none), shared: callers must not change it.
func (p *ledgerParts) part(ctx context.Context, seg ledgerSegment, domain string) *acmebudget.Ledger {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.segs[seg.CM.Name]
	if !ok || d.uid != seg.CM.UID || d.version != seg.CM.ResourceVersion || seg.CM.ResourceVersion == "" {
		d = decodedSegment{uid: seg.CM.UID, version: seg.CM.ResourceVersion, byDomain: map[string]*acmebudget.Ledger{}}
		if p.segs == nil {
			p.segs = map[string]decodedSegment{}
		}
		p.segs[seg.CM.Name] = d
	}
	if l, ok := d.byDomain[domain]; ok {
		return l
	}
	var l *acmebudget.Ledger
	if v := seg.CM.Data[LedgerKey(domain)]; v != "" {
		l = &acmebudget.Ledger{}
		if err := json.Unmarshal([]byte(v), l); err != nil {
			// A damaged part must not stop certificates: it counts as empty.
			log.FromContext(ctx).Error(err, "a part of the certificate ledger is damaged; starting it again",
				"configMap", seg.CM.Name, "domain", domain)
			l = nil
		}
	}
	d.byDomain[domain] = l
	return l
}

// written keeps what was just written to a segment, at its new version.
func (p *ledgerParts) written(cm *corev1.ConfigMap, parts map[string]*acmebudget.Ledger) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.segs == nil {
		p.segs = map[string]decodedSegment{}
	}
	p.segs[cm.Name] = decodedSegment{uid: cm.UID, version: cm.ResourceVersion, byDomain: parts}
}

func (p *ledgerParts) forget(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.segs, name)
}

// segmentPart is one segment's part of a domain's ledger.
type segmentPart struct {
	index int
	bytes int // of the part as stored
	// ledger is the part, nil when the segment has none.
	ledger *acmebudget.Ledger
}

// entryKey identifies an entry across changes: a change fills in its serial, never its name
// or time.
type entryKey struct {
	name string
	at   int64
}

func keyOf(e acmebudget.Entry) entryKey { return entryKey{e.Name, e.At.UnixNano()} }

// Estimates of what an entry and a known name take in a segment, an entry with room for the
// serial it gets later.
func entryBytes(e acmebudget.Entry) int { return len(e.Name) + 120 }
func knownBytes(name string) int        { return len(name) + 40 }

// placeLedger decides where a domain's changed ledger l is kept: every entry and known name in
// the segment it was read from (parts, in segment order), new ones in the first segment that
// stays within bound with them, a new segment after the last when none does. sizes are the
// segments' sizes by index, updated to what they hold with the domain's new parts (estimated).
// It returns the parts that changed, by segment index; an empty one means the domain's key
// leaves that segment.
func placeLedger(parts []segmentPart, sizes map[int]int, l *acmebudget.Ledger, bound int) map[int]*acmebudget.Ledger {
	entryHome, knownHome := map[entryKey]int{}, map[string]int{}
	next := map[int]*acmebudget.Ledger{}
	indexes := make([]int, 0, len(parts))
	for _, p := range parts {
		next[p.index] = &acmebudget.Ledger{}
		indexes = append(indexes, p.index)
		sizes[p.index] -= p.bytes // what the segment holds for other domains
		if p.ledger == nil {
			continue
		}
		for _, e := range p.ledger.Entries {
			if _, ok := entryHome[keyOf(e)]; !ok {
				entryHome[keyOf(e)] = p.index
			}
		}
		for name := range p.ledger.Known {
			if _, ok := knownHome[name]; !ok {
				knownHome[name] = p.index
			}
		}
	}
	// A reservation of a name not known yet keeps room for the name, which its certificate adds.
	entryCost := func(e acmebudget.Entry) int {
		if _, known := l.Known[e.Name]; e.Reserved && !known {
			return entryBytes(e) + knownBytes(e.Name)
		}
		return entryBytes(e)
	}
	// What stays where it is first, so that the room left is known.
	var newEntries []acmebudget.Entry
	nameHome := map[string]int{} // where a name's last entry is
	for _, e := range l.Entries {
		i, kept := entryHome[keyOf(e)]
		if !kept {
			newEntries = append(newEntries, e)
			continue
		}
		next[i].Entries = append(next[i].Entries, e)
		sizes[i] += entryCost(e)
		nameHome[e.Name] = i
	}
	var newKnown []string
	for _, name := range slices.Sorted(maps.Keys(l.Known)) {
		i, kept := knownHome[name]
		if !kept {
			newKnown = append(newKnown, name)
			continue
		}
		setKnown(next[i], name, l.Known[name])
		sizes[i] += knownBytes(name)
	}
	withRoom := func(cost int) int {
		for _, i := range indexes {
			if sizes[i]+cost <= bound {
				sizes[i] += cost
				return i
			}
		}
		i := 0
		if len(indexes) > 0 {
			i = indexes[len(indexes)-1] + 1
		}
		indexes = append(indexes, i)
		next[i] = &acmebudget.Ledger{}
		sizes[i] = cost
		return i
	}
	for _, e := range newEntries {
		i := withRoom(entryCost(e))
		next[i].Entries = append(next[i].Entries, e)
		nameHome[e.Name] = i
	}
	// A newly known name goes with its entry when it fits: a certificate seen then rewrites
	// one segment.
	for _, name := range newKnown {
		i, ok := nameHome[name]
		if cost := knownBytes(name); ok && sizes[i]+cost <= bound {
			sizes[i] += cost
		} else {
			i = withRoom(cost)
		}
		setKnown(next[i], name, l.Known[name])
	}
	changed := map[int]*acmebudget.Ledger{}
	for i, part := range next {
		var was *acmebudget.Ledger
		if k := slices.IndexFunc(parts, func(p segmentPart) bool { return p.index == i }); k >= 0 {
			was = parts[k].ledger
		}
		if !sameLedger(was, part) {
			changed[i] = part
		}
	}
	return changed
}

func setKnown(l *acmebudget.Ledger, name string, at time.Time) {
	if l.Known == nil {
		l.Known = map[string]time.Time{}
	}
	l.Known[name] = at
}

func sameLedger(a, b *acmebudget.Ledger) bool {
	if a == nil || b == nil {
		return (a == nil || a.Empty()) && (b == nil || b.Empty())
	}
	return slices.EqualFunc(a.Entries, b.Entries, func(x, y acmebudget.Entry) bool {
		return x.Name == y.Name && x.At.Equal(y.At) && x.Serial == y.Serial && x.Renewal == y.Renewal && x.Reserved == y.Reserved
	}) && maps.EqualFunc(a.Known, b.Known, time.Time.Equal)
}

// domainLedger is a domain's ledger as read from the segments.
type domainLedger struct {
	versions string // of the segments, in order
	ledger   *acmebudget.Ledger
	parts    []segmentPart
}

// readDomain returns domain's ledger in segs, shared: callers clone it to change it.
func (g *CertGuard) readDomain(ctx context.Context, segs []ledgerSegment, domain string) *domainLedger {
	var versions strings.Builder
	for _, s := range segs {
		fmt.Fprintf(&versions, "%s/%s/%s,", s.CM.Name, s.CM.UID, s.CM.ResourceVersion)
	}
	g.domainsMu.Lock()
	d, ok := g.domains[domain]
	g.domainsMu.Unlock()
	if ok && d.versions == versions.String() {
		return d
	}
	d = &domainLedger{versions: versions.String()}
	var ledgers []*acmebudget.Ledger
	for _, s := range segs {
		part := g.parts.part(ctx, s, domain)
		d.parts = append(d.parts, segmentPart{index: s.index, bytes: len(s.CM.Data[LedgerKey(domain)]), ledger: part})
		ledgers = append(ledgers, part)
	}
	d.ledger = acmebudget.Union(ledgers...)
	g.domainsMu.Lock()
	defer g.domainsMu.Unlock()
	if g.domains == nil {
		g.domains = map[string]*domainLedger{}
	}
	g.domains[domain] = d
	return d
}

// segments lists the ledger's segments from reader, each the freshest of what reader has and
// what this operator last wrote (when fresh).
func (g *CertGuard) segments(ctx context.Context, reader client.Reader, fresh bool) ([]ledgerSegment, error) {
	segs, err := ListLedgerSegments(ctx, reader, g.Namespace)
	if err != nil {
		return nil, err
	}
	if fresh {
		for i := range segs {
			if last, ok := g.last.Get(segs[i].CM.Name); ok {
				segs[i].CM = kit.Freshest(segs[i].CM, last)
			}
		}
	}
	return segs, nil
}

// writeLedger applies a batch of changes to the ledger's segments, writing those whose parts
// changed. A conflict reads them again from the API server and applies the batch again:
// Reserve and Observe are idempotent, so a batch half written before is not counted twice.
func (g *CertGuard) writeLedger(ctx context.Context, batch []ledgerChange) error {
	var reader client.Reader = g.Client
	for attempt := 1; ; attempt++ {
		segs, err := g.segments(ctx, reader, attempt == 1)
		if err != nil {
			return err
		}
		err = g.writeSegments(ctx, segs, batch)
		if (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)) && attempt < kit.MaxFlushAttempts {
			if g.API != nil {
				reader = g.API
			}
			continue
		}
		return err
	}
}

func (g *CertGuard) writeSegments(ctx context.Context, segs []ledgerSegment, batch []ledgerChange) error {
	ledgers := map[string]*acmebudget.Ledger{}
	var domains []string
	for _, c := range batch {
		l := ledgers[c.domain]
		if l == nil {
			l = g.readDomain(ctx, segs, c.domain).ledger.Clone()
			ledgers[c.domain] = l
			domains = append(domains, c.domain)
		}
		c.change(l)
	}
	sizes := map[int]int{}
	byIndex := map[int]ledgerSegment{}
	for _, s := range segs {
		sizes[s.index] = s.Size()
		byIndex[s.index] = s
	}
	// The new parts, by segment and domain.
	changed := map[int]map[string]*acmebudget.Ledger{}
	for _, domain := range domains {
		l := ledgers[domain]
		l.Prune(g.Now(), g.Limits)
		for i, part := range placeLedger(g.readDomain(ctx, segs, domain).parts, sizes, l, g.segmentBytes()) {
			if changed[i] == nil {
				changed[i] = map[string]*acmebudget.Ledger{}
			}
			changed[i][domain] = part
		}
	}
	for _, i := range slices.Sorted(maps.Keys(changed)) {
		if err := g.writeSegment(ctx, i, byIndex[i].CM, changed[i]); err != nil {
			return err
		}
	}
	return nil
}

// writeSegment writes segment i (cur as read, nil when there is none) with the given parts; a
// segment left empty is removed, but the first, which older operators read.
func (g *CertGuard) writeSegment(ctx context.Context, i int, cur *corev1.ConfigMap, parts map[string]*acmebudget.Ledger) error {
	name := LedgerSegmentName(i)
	data := map[string]string{}
	if cur != nil {
		data = maps.Clone(cur.Data)
	}
	for domain, l := range parts {
		if l.Empty() {
			delete(data, LedgerKey(domain))
			continue
		}
		b, err := json.Marshal(l)
		if err != nil {
			return fmt.Errorf("encoding the certificate ledger of %s: %w", domain, err)
		}
		data[LedgerKey(domain)] = string(b)
	}
	var err error
	switch {
	case cur == nil && len(data) == 0:
		return nil
	case cur == nil:
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.Namespace,
			Labels: map[string]string{kit.LabelManaged: "true"}}, Data: data}
		if err = kit.Create(ctx, g.Client, cm); err == nil {
			g.wrote(cm, parts)
		}
	case len(data) == 0 && i > 0:
		rv, uid := cur.ResourceVersion, cur.UID
		if err = kit.Remove(ctx, g.Client, cur.DeepCopy(), client.Preconditions{ResourceVersion: &rv, UID: &uid}); err != nil {
			err = fmt.Errorf("deleting the empty certificate ledger segment %s/%s: %w", g.Namespace, name, err)
		}
		g.last.Forget(name)
		g.parts.forget(name)
	default:
		cm := cur.DeepCopy()
		cm.Data = data
		if err = kit.WriteShared(ctx, g.Client, cur, cm); err == nil {
			g.wrote(cm, parts)
		} else {
			err = fmt.Errorf("writing the certificate ledger segment %s/%s: %w", g.Namespace, name, err)
		}
	}
	if err != nil {
		g.last.Forget(name)
	}
	return err
}

// wrote keeps a segment just written, and its parts (an empty one as none).
func (g *CertGuard) wrote(cm *corev1.ConfigMap, parts map[string]*acmebudget.Ledger) {
	g.last.Set(cm.Name, cm)
	byDomain := map[string]*acmebudget.Ledger{}
	for domain, l := range parts {
		if !l.Empty() {
			byDomain[domain] = l
		} else {
			byDomain[domain] = nil
		}
	}
	g.parts.written(cm, byDomain)
}

func (g *CertGuard) segmentBytes() int {
	if g.SegmentSize > 0 {
		return g.SegmentSize
	}
	return ledgerSegmentBytes
}
