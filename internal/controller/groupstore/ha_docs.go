// Package groupstore is the store of a ProxyGroup's documents: the sharded ConfigMaps that tell
// its replicas what to serve, where each object's entries are placed, the Tailscale Services the
// objects are advertised as, what the replicas report back, and the mapping of the documents'
// and reports' changes to the objects they concern. Reconcilers hold its one interface, Store,
// which owns every cache it lays over the informer cache; beside it the package keeps only the
// pure helpers the HA reconcilers share (finalizers, indexes, claims of a hostname). It must not
// decide what an object serves: that is each reconciler's.
package groupstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// groupContent is what a group ConfigMap says, decoded: the Serve config, the DNAT mappings and
// the owner index.
type groupContent struct {
	serve  *contract.ServeConfig
	dnat   *contract.DNATConfig
	owners map[string]string
	// Documents this build could not read, counted as empty.
	serveUnreadable, dnatUnreadable bool

	byOwner *ownerIndex // of owners; shared by copies that keep them
}

// ownerIndex is the owner index inverted, built on first use.
type ownerIndex struct {
	once    sync.Once
	entries map[string][]string
}

// owned lists the entries written for owner. The inverted index is built once: a content is
// not changed once it is shared, and scanning every entry of every group per pass made the
// work grow with the square of the group's size.
func (g *groupContent) owned(owner string) []string {
	g.byOwner.once.Do(func() {
		g.byOwner.entries = make(map[string][]string, len(g.owners))
		for name, o := range g.owners {
			g.byOwner.entries[o] = append(g.byOwner.entries[o], name)
		}
	})
	return g.byOwner.entries[owner]
}

// decodeGroup reads a group ConfigMap's documents. A document this build cannot read counts as
// empty: the writer then replaces it with one it can.
func decodeGroup(cm *corev1.ConfigMap) *groupContent {
	data := contract.ConfigMapBytes(cm.Data)
	g := &groupContent{owners: owners(cm), byOwner: &ownerIndex{}}
	if doc, _, err := contract.ServeConfigs.Decode(data); err == nil {
		g.serve = doc
	} else {
		g.serve, g.serveUnreadable = &contract.ServeConfig{}, contract.ServeConfigs.Present(data)
	}
	if doc, _, err := contract.DNATConfigs.Decode(data); err == nil {
		g.dnat = doc
	} else {
		g.dnat, g.dnatUnreadable = &contract.DNATConfig{}, contract.DNATConfigs.Present(data)
	}
	if g.serve.Services == nil {
		g.serve.Services = map[string]contract.WebService{}
	}
	if g.dnat.Services == nil {
		g.dnat.Services = map[string]contract.DNATService{}
	}
	return g
}

// clone copies the content for a change: entries are replaced whole, never changed in place, so
// the maps are copied and the entries shared.
func (g *groupContent) clone() *groupContent {
	serve, dnat := *g.serve, *g.dnat
	serve.Services, dnat.Services = maps.Clone(g.serve.Services), maps.Clone(g.dnat.Services)
	return &groupContent{serve: &serve, dnat: &dnat, owners: maps.Clone(g.owners), byOwner: &ownerIndex{}}
}

// has reports whether the group serves svcName, in either document.
func (g *groupContent) has(svcName string) bool {
	return hasService(g.serve.Services, svcName) || hasService(g.dnat.Services, svcName)
}

// setServe sets (ws nil: removes) a service's Serve entry; the owner index follows.
func (g *groupContent) setServe(svcName string, ws *contract.WebService, owner string) {
	if ws == nil {
		delete(g.serve.Services, svcName)
	} else {
		g.serve.Services[svcName] = *ws
	}
	g.setOwner(svcName, ws != nil, owner)
}

// setDNAT sets (m nil: removes) a service's DNAT entry; the owner index follows.
func (g *groupContent) setDNAT(svcName string, m *contract.DNATService, owner string) {
	if m == nil {
		delete(g.dnat.Services, svcName)
	} else {
		g.dnat.Services[svcName] = *m
	}
	g.setOwner(svcName, m != nil, owner)
}

// setOwner records owner for an entry just set; an entry just removed keeps its owner while its
// other document still has it.
func (g *groupContent) setOwner(svcName string, set bool, owner string) {
	switch {
	case set:
		g.owners[svcName] = owner
	case !g.has(svcName):
		delete(g.owners, svcName)
	}
}

// encode renders the documents and the owner index as ConfigMap data. keys are every key the
// documents may be stored under: those not in data are to be removed.
func (g *groupContent) encode() (data map[string]string, keys []string, err error) {
	serve, err := contract.ServeConfigs.Encode(g.serve)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the serve config: %w", err)
	}
	dnat, err := contract.DNATConfigs.Encode(g.dnat)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the DNAT config: %w", err)
	}
	data = map[string]string{}
	for k, v := range serve {
		data[k] = string(v)
	}
	for k, v := range dnat {
		data[k] = string(v)
	}
	o, err := json.Marshal(g.owners)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the owner index: %w", err)
	}
	data[ownersKey] = string(o)
	keys = append(contract.ServeConfigs.Keys(), contract.DNATConfigs.Keys()...)
	return data, append(keys, ownersKey), nil
}

// emptyContent is the content of a shard not created yet.
func emptyContent() *groupContent {
	return &groupContent{serve: &contract.ServeConfig{Services: map[string]contract.WebService{}},
		dnat: &contract.DNATConfig{Services: map[string]contract.DNATService{}}, owners: map[string]string{}, byOwner: &ownerIndex{}}
}

// groupShards is a group's documents over its shards (contract.MergeShards), as a flush
// changes them. Each service's entries stay in the shard that holds them; a new service goes
// to the first shard with room for it, and to a new shard when none has. A flush that adds
// objects then writes the shard or two they went to, not every shard: placing services by
// their hash spread every batch over every shard. A change copies a shard before it first
// touches it, since the decoded contents are shared with readers.
type groupShards struct {
	shards  []*groupContent
	touched []bool
	// sizes are the shards' bytes as read, with estimates of the entries placed since.
	sizes []int
	bound int
	// added are the services this flush placed, by shard: moving them costs no reader anything.
	added map[string]int
}

// newGroupShards starts a flush from the shards' contents and their sizes in bytes, each to
// hold at most bound.
func newGroupShards(contents []*groupContent, sizes []int, bound int) *groupShards {
	return &groupShards{shards: slices.Clone(contents), touched: make([]bool, len(contents)), sizes: slices.Clone(sizes),
		bound: bound, added: map[string]int{}}
}

func (s *groupShards) touch(i int) *groupContent {
	if !s.touched[i] {
		s.shards[i], s.touched[i] = s.shards[i].clone(), true
	}
	return s.shards[i]
}

// holding is the shard that holds svcName, -1 for none.
func (s *groupShards) holding(svcName string) int {
	for i, sh := range s.shards {
		if sh.has(svcName) {
			return i
		}
	}
	return -1
}

// place picks the shard of a new service whose entries take about size bytes: the first with
// room, else a new one (the last when there can be no more: fit then fails the change).
func (s *groupShards) place(svcName string, size int) int {
	i := slices.IndexFunc(s.sizes, func(n int) bool { return n+size <= s.bound })
	if i < 0 && len(s.shards) < contract.MaxShards {
		i = s.addShard()
	} else if i < 0 {
		i = len(s.shards) - 1
	}
	s.sizes[i] += size
	s.added[svcName] = i
	return i
}

// addShard adds an empty shard, which the flush writes before shard 0 counts it.
func (s *groupShards) addShard() int {
	s.shards, s.touched, s.sizes = append(s.shards, emptyContent()), append(s.touched, true), append(s.sizes, 0)
	s.touch(0) // the count
	return len(s.shards) - 1
}

// encodedSize is the bytes of data's values.
func encodedSize(data map[string][]byte) int {
	n := 0
	for _, v := range data {
		n += len(v)
	}
	return n
}

// shardFor is the shard, ready to change, that holds svcName, or, when size (what its entry
// takes in a shard) is given, that a new one goes to; nil when none holds it and nothing is set.
func (s *groupShards) shardFor(svcName string, size func() int) *groupContent {
	i := s.holding(svcName)
	if i < 0 {
		if size == nil {
			return nil
		}
		i = s.place(svcName, size())
	}
	return s.touch(i)
}

// newEntrySize sizes a new entry: what a document of it alone (encode) takes, in every
// version written, and its line in the owner index; nil when nothing is set.
func newEntrySize(set bool, svcName, owner string, encode func() (map[string][]byte, error)) func() int {
	if !set {
		return nil
	}
	return func() int {
		data, _ := encode()
		return encodedSize(data) + len(svcName) + len(owner) + 8
	}
}

func (s *groupShards) setServe(svcName string, ws *contract.WebService, owner string) {
	size := newEntrySize(ws != nil, svcName, owner, func() (map[string][]byte, error) {
		return contract.ServeConfigs.Encode(&contract.ServeConfig{Services: map[string]contract.WebService{svcName: *ws}})
	})
	if sh := s.shardFor(svcName, size); sh != nil {
		sh.setServe(svcName, ws, owner)
	}
}

func (s *groupShards) setDNAT(svcName string, m *contract.DNATService, owner string) {
	size := newEntrySize(m != nil, svcName, owner, func() (map[string][]byte, error) {
		return contract.DNATConfigs.Encode(&contract.DNATConfig{Services: map[string]contract.DNATService{svcName: *m}})
	})
	if sh := s.shardFor(svcName, size); sh != nil {
		sh.setDNAT(svcName, m, owner)
	}
}

// settle keeps each service's entries in one shard, the first that holds them: a flush that
// stopped while moving entries to a new shard leaves them in both.
func (s *groupShards) settle() {
	seen := map[string]bool{}
	for i, sh := range s.shards {
		for _, name := range sh.names() {
			if !seen[name] {
				seen[name] = true
				continue
			}
			from := s.touch(i)
			from.setServe(name, nil, "")
			from.setDNAT(name, nil, "")
		}
	}
}

// names lists the services with an entry in the content.
func (g *groupContent) names() []string {
	names := slices.Collect(maps.Keys(g.serve.Services))
	for n := range g.dnat.Services {
		if !hasService(g.serve.Services, n) {
			names = append(names, n)
		}
	}
	return names
}

// relieve moves entries out of shard i, which holds more than the bound, to a new shard: those
// this flush placed there, else half of what it held. It reports false when that cannot help:
// no more shards, or a single entry over the bound.
func (s *groupShards) relieve(i int) bool {
	var moving []string
	for name, at := range s.added {
		if at == i {
			moving = append(moving, name)
		}
	}
	if len(moving) == 0 {
		moving = s.shards[i].names()
	}
	slices.Sort(moving)
	moving = moving[len(moving)/2:]
	if len(s.shards) == contract.MaxShards || len(moving) == 0 || (len(moving) == 1 && len(s.shards[i].names()) == 1) {
		return false
	}
	to := s.addShard()
	from := s.touch(i)
	for _, name := range moving {
		if ws, ok := from.serve.Services[name]; ok {
			s.shards[to].setServe(name, &ws, from.owners[name])
		}
		if m, ok := from.dnat.Services[name]; ok {
			s.shards[to].setDNAT(name, &m, from.owners[name])
		}
		from.setServe(name, nil, "")
		from.setDNAT(name, nil, "")
		if _, ok := s.added[name]; ok {
			s.added[name] = to
		}
	}
	return true
}

// encodeChanged renders the changed shards' data, by shard, with the shard index in shard 0,
// and lists every key the documents may be stored under.
func (s *groupShards) encodeChanged() (map[int]map[string]string, []string, error) {
	out := map[int]map[string]string{}
	var keys []string
	for i, sh := range s.shards {
		if !s.touched[i] {
			continue
		}
		data, k, err := sh.encode()
		if err != nil {
			return nil, nil, err
		}
		keys, out[i] = k, data
	}
	if data, ok := out[0]; ok && len(s.shards) > 1 {
		idx, err := contract.GroupShardIndexes.Encode(&contract.GroupShards{Count: len(s.shards)})
		if err != nil {
			return nil, nil, fmt.Errorf("encoding the shard index: %w", err)
		}
		for k, v := range idx {
			data[k] = string(v)
		}
	}
	return out, append(keys, contract.GroupShardIndexes.Keys()...), nil
}

// groupWriter writes ProxyGroup documents through a batcher: the changes of concurrent
// reconcilers to one group are applied in one read-modify-write of the shards they touch. With
// many objects on a group, each write sends one shard of bounded size instead of every entry.
//
// It also keeps the decoded content of each group ConfigMap by resourceVersion, so that readers
// (which group serves a name, what an object owns) do not decode the documents per reconcile.
type groupWriter struct {
	client    client.Client
	api       client.Reader // after a conflict: the cache may not have our last write yet
	namespace string
	batch     kit.Batcher[func(*groupShards)]
	last      kit.LastWritten[*corev1.ConfigMap] // by ConfigMap name
	// placed is, by owner, where each object's entries were last left alone (placement).
	placed sync.Map
	// shardBytes bounds the data of one shard: the count doubles when a shard would exceed it.
	shardBytes int

	mu      sync.Mutex
	decoded map[string]decodedContent // by ConfigMap name
}

type decodedContent struct {
	// recent are the contents of the last versions decoded or written, newest first. Readers
	// at one version (the cache, an event's old and new objects) and at another (the writer's
	// last write, newer than the cache) then do not decode again and again in turn.
	recent []versionContent
	// lastReadable is the last content whose documents could all be read; nil for none.
	lastReadable *groupContent
}

type versionContent struct {
	resourceVersion string
	content         *groupContent
}

// keptVersions is how many versions of a ConfigMap's content are kept.
const keptVersions = 4

func newGroupWriter(c client.Client, api client.Reader, namespace string, shardBytes int) *groupWriter {
	w := &groupWriter{client: c, api: api, namespace: namespace, decoded: map[string]decodedContent{}, shardBytes: cmp.Or(shardBytes, maxShardBytes)}
	w.batch.Flush = w.flush
	return w
}

// change applies f to group pg's documents, batched with the changes of other reconcilers, and
// returns once it is stored (or failed: errConfigFull, a missing ConfigMap, an API error).
func (w *groupWriter) change(ctx context.Context, pg string, f func(*groupShards)) error {
	return w.batch.Do(ctx, pg, f)
}

// flush applies a batch to group pg's shards and returns each change's error.
func (w *groupWriter) flush(pg string, batch []func(*groupShards)) []error {
	ctx, cancel := context.WithTimeout(context.Background(), kit.FlushTimeout)
	defer cancel()
	errs := make([]error, len(batch))
	fail := func(err error) []error {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	main := proxies.Group{Name: pg}.ConfigMap()
	start := time.Now()
	var reader client.Reader = w.client
	for attempt := 1; ; attempt++ {
		cms, err := w.read(ctx, reader, main)
		if err != nil {
			return fail(err)
		}
		written, err := w.write(ctx, cms, batch, errs)
		if (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) && attempt < kit.MaxFlushAttempts {
			reader = w.api
			clear(errs)
			continue
		}
		if err != nil {
			for _, cm := range cms {
				if cm != nil {
					w.last.Forget(cm.Name)
				}
			}
			return fail(err)
		}
		if len(written) > 0 {
			failed, bytes := 0, 0
			for _, err := range errs {
				if err != nil {
					failed++
				}
			}
			for _, cm := range written {
				bytes = max(bytes, dataSize(cm.Data, nil, nil))
			}
			log.FromContext(ctx).Info("wrote group documents", "proxyGroup", pg, "shardsWritten", len(written),
				"changes", len(batch), "failed", failed, "attempts", attempt, "took", time.Since(start).Round(time.Millisecond).String(),
				"largestShardBytes", bytes)
		}
		return errs
	}
}

// holds reports whether group pg's documents, as last read or written here, already hold what
// has looks for in the shard that holds svcName. A change that would write it again is then
// left out, as if applied to that version: most passes over an object on a group change
// nothing there, and would otherwise each wait for a turn at the writer. Changes queued
// meanwhile by others are ordered after it, as they would be after a write.
func (w *groupWriter) holds(ctx context.Context, pg, svcName string, has func(*groupContent) bool) bool {
	main := proxies.Group{Name: pg}.ConfigMap()
	first, err := w.readShard(ctx, w.client, main, 0)
	if err != nil {
		return false
	}
	count, err := contract.ShardCountOf(first.Data)
	if err != nil {
		return false
	}
	// One shard alone, the one this writer last saw holding it: reading every shard per pass
	// grew with the group.
	cm := first
	if i := w.lastHolding(main, count, svcName); i < 0 {
		return false
	} else if i > 0 {
		if cm, err = w.readShard(ctx, w.client, main, i); err != nil || cm == nil {
			return false
		}
	}
	c := w.content(cm)
	return !c.serveUnreadable && !c.dnatUnreadable && has(c)
}

// lastHolding is the shard, of count, whose content decoded or written last here holds
// svcName; -1 for none.
func (w *groupWriter) lastHolding(main string, count int, svcName string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range count {
		if d := w.decoded[contract.ShardName(main, i)]; len(d.recent) > 0 && d.recent[0].content.has(svcName) {
			return i
		}
	}
	return -1
}

// read gets a group's shards, by index: nil for a shard not created yet. The first must exist
// (the ProxyGroup reconciler creates it).
func (w *groupWriter) read(ctx context.Context, reader client.Reader, main string) ([]*corev1.ConfigMap, error) {
	first, err := w.readShard(ctx, reader, main, 0)
	if err != nil {
		return nil, err
	}
	count, err := contract.ShardCountOf(first.Data)
	if err != nil {
		return nil, fmt.Errorf("group ConfigMap %s: %w", main, err)
	}
	cms := []*corev1.ConfigMap{first}
	for i := 1; i < count; i++ {
		cm, err := w.readShard(ctx, reader, main, i)
		if err != nil {
			return nil, err
		}
		cms = append(cms, cm)
	}
	return cms, nil
}

// readShard gets shard i of a group's documents: nil for a shard i > 0 not created yet.
func (w *groupWriter) readShard(ctx context.Context, reader client.Reader, main string, i int) (*corev1.ConfigMap, error) {
	name := contract.ShardName(main, i)
	cm := &corev1.ConfigMap{}
	err := reader.Get(ctx, client.ObjectKey{Namespace: w.namespace, Name: name}, cm)
	last, written := w.last.Get(name)
	switch {
	case err == nil && written && reader == w.client:
		return kit.Freshest(cm, last), nil
	case err == nil:
		return cm, nil
	case apierrors.IsNotFound(err) && i > 0 && written && reader == w.client:
		// Created by an earlier flush and not in the cache yet.
		return last.DeepCopy(), nil
	case apierrors.IsNotFound(err) && i > 0:
		return nil, nil
	}
	return nil, fmt.Errorf("reading group ConfigMap %s/%s: %w", w.namespace, name, err)
}

// write applies the changes to the shards and stores those that changed. When a shard would
// exceed the size bound, entries go to a new one; changes that would need more than
// contract.MaxShards fail with errConfigFull, and the rest are stored.
func (w *groupWriter) write(ctx context.Context, cms []*corev1.ConfigMap, batch []func(*groupShards), errs []error) ([]*corev1.ConfigMap, error) {
	contents := make([]*groupContent, len(cms))
	sizes := make([]int, len(cms))
	for i, cm := range cms {
		if cm == nil {
			contents[i] = emptyContent()
		} else {
			contents[i], sizes[i] = w.base(cm), dataSize(cm.Data, nil, nil)
		}
	}
	apply := func(skip func(int) bool) *groupShards {
		s := newGroupShards(contents, sizes, w.shardBytes)
		s.settle()
		for i, c := range batch {
			if !skip(i) {
				c(s)
			}
		}
		return s
	}
	s, data, keys, err := w.fit(apply(func(int) bool { return false }), cms)
	if errors.Is(err, ErrConfigFull) {
		// The slow path of a full group: the changes one at a time, keeping those that fit.
		for i := range batch {
			errs[i] = ErrConfigFull
			if _, _, _, err := w.fit(apply(func(j int) bool { return j > i || (j < i && errs[j] != nil) }), cms); err == nil {
				errs[i] = nil
			}
		}
		s, data, keys, err = w.fit(apply(func(j int) bool { return errs[j] != nil }), cms)
	}
	if err != nil {
		return nil, err
	}
	// Growing: entries go to the new shards first, then shard 0 raises the count, then the
	// old shards drop what moved, so that a replica never reads a count without its entries.
	phases := [][]int{slices.Sorted(maps.Keys(data))}
	if len(s.shards) > len(cms) {
		var added, old []int
		for i := range data {
			if i >= len(cms) {
				added = append(added, i)
			} else if i != 0 {
				old = append(old, i)
			}
		}
		phases = [][]int{added, {0}, old}
	}
	main := cms[0]
	var written []*corev1.ConfigMap
	for _, phase := range phases {
		results := make([]*corev1.ConfigMap, len(phase))
		werrs := make([]error, len(phase))
		var wg sync.WaitGroup
		for j, i := range phase {
			var cm *corev1.ConfigMap
			if i < len(cms) {
				cm = cms[i]
			}
			wg.Go(func() {
				results[j], werrs[j] = w.writeShard(ctx, main, i, cm, i >= len(cms), data[i], keys, s.shards[i])
			})
		}
		wg.Wait()
		for _, cm := range results {
			if cm != nil {
				written = append(written, cm)
			}
		}
		if err := firstError(werrs); err != nil {
			return written, err
		}
	}
	return written, nil
}

// firstError is the first of errs that is not nil, as is, so that callers can tell a conflict.
func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// fit encodes the changed shards, relieving a shard over the bound (an entry grown, or new
// ones larger than estimated) until none is; errConfigFull when that cannot help.
func (w *groupWriter) fit(s *groupShards, cms []*corev1.ConfigMap) (*groupShards, map[int]map[string]string, []string, error) {
	for {
		data, keys, err := s.encodeChanged()
		if err != nil {
			return nil, nil, nil, err
		}
		over := -1
		for _, i := range slices.Sorted(maps.Keys(data)) {
			var current map[string]string
			if i < len(cms) && cms[i] != nil {
				current = cms[i].Data
			}
			if dataSize(current, data[i], keys) > w.shardBytes {
				over = i
				break
			}
		}
		if over < 0 {
			return s, data, keys, nil
		}
		if !s.relieve(over) {
			return nil, nil, nil, ErrConfigFull
		}
	}
}

// writeShard stores shard i's documents, creating its ConfigMap (like the first one: same
// labels and owner) when there is none, and returns what it wrote (nil: nothing changed). A
// shard the count does not include yet (added) may be left by a flush that stopped while
// growing: nobody reads it, and it is overwritten. A counted shard that was not found but
// exists fails with AlreadyExists: the flush reads the shards again from the API, rather than
// overwrite entries it did not see.
func (w *groupWriter) writeShard(ctx context.Context, main *corev1.ConfigMap, i int, cm *corev1.ConfigMap, added bool, data map[string]string, keys []string, content *groupContent) (*corev1.ConfigMap, error) {
	if cm == nil {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: contract.ShardName(main.Name, i), Namespace: w.namespace,
			Labels: maps.Clone(main.Labels), OwnerReferences: slices.Clone(main.OwnerReferences)}, Data: data}
		err := kit.Create(ctx, w.client, cm)
		if apierrors.IsAlreadyExists(err) && added {
			cm = &corev1.ConfigMap{}
			if err = w.api.Get(ctx, client.ObjectKey{Namespace: w.namespace, Name: contract.ShardName(main.Name, i)}, cm); err != nil {
				err = fmt.Errorf("reading group ConfigMap %s/%s: %w", w.namespace, contract.ShardName(main.Name, i), err)
			}
		} else if err == nil {
			w.last.Set(cm.Name, cm)
			w.remember(cm, content)
			return cm, nil
		}
		if err != nil {
			return nil, err
		}
	}
	cm = cm.DeepCopy()
	before := cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	for _, k := range keys {
		if v, ok := data[k]; ok {
			cm.Data[k] = v
		} else {
			delete(cm.Data, k)
		}
	}
	if maps.Equal(before.Data, cm.Data) {
		w.remember(cm, content)
		return nil, nil
	}
	if err := kit.WriteShared(ctx, w.client, before, cm); err != nil {
		return nil, fmt.Errorf("writing group ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	w.last.Set(cm.Name, cm)
	w.remember(cm, content)
	return cm, nil
}

// dataSize is the size of cm's data once the documents' keys hold data.
func dataSize(current, data map[string]string, keys []string) int {
	size := 0
	for _, v := range current {
		size += len(v)
	}
	for _, k := range keys {
		size += len(data[k]) - len(current[k])
	}
	return size
}

// remember keeps the decoded content of a ConfigMap at its resourceVersion.
func (w *groupWriter) remember(cm *corev1.ConfigMap, content *groupContent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	prev, ok := w.decoded[cm.Name]
	d := decodedContent{recent: []versionContent{{cm.ResourceVersion, content}}, lastReadable: content}
	if ok && (content.serveUnreadable || content.dnatUnreadable) {
		d.lastReadable = prev.lastReadable
	}
	for _, v := range prev.recent {
		if len(d.recent) < keptVersions && v.resourceVersion != cm.ResourceVersion {
			d.recent = append(d.recent, v)
		}
	}
	w.decoded[cm.Name] = d
}

// base is what a write starts from: the content of cm, with each document this build cannot
// read (edited by hand, or by a newer operator) taken from the last one read here. Readers see
// the document as empty, so the owners of its entries are brought back; the writer rebuilds it
// from the last readable one, so that the first of them to be written does not make a document
// of its entry alone, from which the replicas would withdraw the others meanwhile.
func (w *groupWriter) base(cm *corev1.ConfigMap) *groupContent {
	c := w.content(cm)
	if !c.serveUnreadable && !c.dnatUnreadable {
		return c
	}
	w.mu.Lock()
	last := w.decoded[cm.Name].lastReadable
	w.mu.Unlock()
	if last == nil {
		return c
	}
	out := *c
	if out.serveUnreadable && !last.serveUnreadable {
		out.serve, out.serveUnreadable = last.serve, false
	}
	if out.dnatUnreadable && !last.dnatUnreadable {
		out.dnat, out.dnatUnreadable = last.dnat, false
	}
	return &out
}

// content returns the decoded documents of cm, decoding them only when cm is at none of the
// resourceVersions kept. The result is shared: callers must not change it.
func (w *groupWriter) content(cm *corev1.ConfigMap) *groupContent {
	w.mu.Lock()
	for _, v := range w.decoded[cm.Name].recent {
		if v.resourceVersion == cm.ResourceVersion {
			w.mu.Unlock()
			return v.content
		}
	}
	w.mu.Unlock()
	c := decodeGroup(cm)
	w.remember(cm, c)
	return c
}

// groupServices lists the Tailscale Services in a group's documents (one data map per
// ConfigMap). When a document cannot be read (edited by hand, or of a future version), the
// owner index stands in for it: the replicas keep advertising what they served until the
// document is written again, rather than withdrawing every service of the group at once.
func groupServices(shards []map[string][]byte) []string {
	var names []string
	for _, data := range shards {
		serve, _, serveErr := contract.ServeConfigs.Decode(data)
		if serveErr == nil {
			names = slices.AppendSeq(names, maps.Keys(serve.Services))
		}
		dnat, _, dnatErr := contract.DNATConfigs.Decode(data)
		if dnatErr == nil {
			names = slices.AppendSeq(names, maps.Keys(dnat.Services))
		}
		if serveErr != nil || dnatErr != nil {
			o := map[string]string{}
			_ = json.Unmarshal(data[ownersKey], &o) // a damaged index only loses old entries
			names = slices.AppendSeq(names, maps.Keys(o))
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}
