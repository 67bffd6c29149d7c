package proxies

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
)

// SecretTypeReport labels the Secrets a replica's report is spread over besides its state
// Secret (contract.ReportShardName): one fewer than the group's document shards.
const SecretTypeReport = "report"

// ReportSecretNames names replica i's report Secrets for a group of the given document shards.
func ReportSecretNames(g Group, i, shards int) []string {
	var names []string
	for k := 1; k < shards; k++ {
		names = append(names, contract.ReportShardName(g.Replicas().StateSecret(i), k))
	}
	return names
}

// Reports reads what proxies report in their state Secrets, and keeps the parses: a group's
// report grows with the objects on it, every reconcile of one of them reads every replica's, and
// a large group's reports are spread over dozens of Secrets. Its zero value is ready to use;
// whoever holds one owns its caches, which live as long as it does.
type Reports struct {
	// states keeps each replica's report, parsed: keyed by the state Secret, at the versions
	// of all the report's Secrets.
	states versioned[*contract.ProxyState]
	// shards keeps the parse of each report Secret: a replica rewrites one shard of its report
	// at a time, and the event handlers (old and new version) and the reconcilers read the
	// same versions.
	shards versioned[*contract.ProxyState]
	// assembled keeps the last report assembled from each state Secret.
	assembled assembled
	// writes counts the events of report shards the event handlers saw.
	writes shardWrites
}

// versioned keeps one value per object (by UID), computed from a version of it: the last
// version asked for. Callers asking for a version being computed wait for it rather than
// compute it too: when a report changes, every in-flight reconcile of its group asks at once.
type versioned[V any] struct {
	mu      sync.Mutex
	entries map[types.UID]*versionedEntry[V]
}

type versionedEntry[V any] struct {
	version string
	done    chan struct{} // closed once value and err are set
	value   V
	err     error
}

// get returns the value for uid at version, computing it when it has another; without a uid
// or a version (not from the API server) nothing keys it and it is computed each time.
func (c *versioned[V]) get(uid types.UID, version string, compute func() (V, error)) (V, error) {
	if uid == "" || version == "" {
		return compute()
	}
	c.mu.Lock()
	e, ok := c.entries[uid]
	if !ok || e.version != version {
		if c.entries == nil || len(c.entries) > 4096 { // objects since deleted: start over rather than track deletions
			c.entries = map[types.UID]*versionedEntry[V]{}
		}
		e = &versionedEntry[V]{version: version, done: make(chan struct{}), err: errors.New("computing it panicked")}
		c.entries[uid] = e
		c.mu.Unlock()
		defer close(e.done)
		e.value, e.err = compute()
		return e.value, e.err
	}
	c.mu.Unlock()
	<-e.done
	return e.value, e.err
}

// ParseShard is contract.ParseState of s's data, shared: callers must not change it.
func (r *Reports) ParseShard(s *corev1.Secret) (*contract.ProxyState, error) {
	return r.parsePart(reportPart{s.UID, s.ResourceVersion, s.Data})
}

// reportPart is one Secret of a replica's report, as the cache holds it: data shared with the
// cache, never changed.
type reportPart struct {
	uid     types.UID
	version string
	data    map[string][]byte
}

func (r *Reports) parsePart(p reportPart) (*contract.ProxyState, error) {
	return r.shards.get(p.uid, p.version, func() (*contract.ProxyState, error) { return contract.ParseState(p.data) })
}

// parse returns the report whose state Secret is s, read with the Secrets of its other shards.
// The result is shared: callers must not change it. The report assembled last stands while its
// state Secret is at the same version and the event handlers saw no write to its other shards
// (writes); otherwise each is read from the cache by name into one reused object, keeping only
// its version and data.
func (r *Reports) parse(ctx context.Context, cl client.Reader, s *corev1.Secret) (*contract.ProxyState, error) {
	count, err := contract.ReportShardCount(s.Data)
	if err != nil {
		return nil, err
	}
	// Read before the shards: a write the cache holds but the handlers have not yet counted
	// is counted before the objects it concerns are queued again.
	writes, watched := r.writes.count(s.Namespace, s.Name)
	watched = watched && count > 1 && s.UID != "" && s.ResourceVersion != ""
	if watched {
		if st, ok := r.assembled.at(s.UID, s.ResourceVersion, writes); ok {
			return st, nil
		}
	}
	parts := make([]reportPart, count)
	parts[0] = reportPart{s.UID, s.ResourceVersion, s.Data}
	versions := make([]string, count)
	versions[0] = s.ResourceVersion
	shard := &corev1.Secret{}
	for k := 1; k < count; k++ {
		key := client.ObjectKey{Namespace: s.Namespace, Name: contract.ReportShardName(s.Name, k)}
		if err := cl.Get(ctx, key, shard, client.UnsafeDisableDeepCopy); err != nil {
			if apierrors.IsNotFound(err) {
				continue // a missing one reads as empty
			}
			return nil, fmt.Errorf("reading report shard Secret %s/%s: %w", key.Namespace, key.Name, err)
		}
		parts[k], versions[k] = reportPart{shard.UID, shard.ResourceVersion, shard.Data}, shard.ResourceVersion
	}
	version := strings.Join(versions, ",")
	if s.ResourceVersion == "" {
		version = ""
	}
	st, err := r.states.get(s.UID, version, func() (*contract.ProxyState, error) {
		datas := make([]map[string][]byte, count)
		for k, p := range parts {
			datas[k] = p.data
		}
		return contract.ReadReport(datas, func(k int) (*contract.ProxyState, error) { return r.parsePart(parts[k]) })
	})
	if err == nil && watched {
		r.assembled.keep(s.UID, s.ResourceVersion, writes, st)
	}
	return st, err
}

// shardWrites counts, per replica (namespace and state Secret name), the events of its
// report's other shards that the group event handlers saw. Only once a handler watches
// (Watch) do counts say anything: without one every shard is read each time.
type shardWrites struct {
	watched atomic.Bool
	counts  sync.Map // types.NamespacedName → *atomic.Uint64
}

// Watch says that an event handler now passes every Secret event to Saw, so that a report
// assembled earlier stands until one of its shards changes.
func (r *Reports) Watch() { r.writes.watched.Store(true) }

// Saw counts an event of Secret o when it is a report shard (contract.ReportShardName).
func (r *Reports) Saw(o client.Object) {
	if _, secret := o.(*corev1.Secret); !secret {
		return
	}
	state, ok := reportStateOf(o.GetName())
	if !ok {
		return
	}
	v, _ := r.writes.counts.LoadOrStore(types.NamespacedName{Namespace: o.GetNamespace(), Name: state}, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
}

func (w *shardWrites) count(namespace, state string) (n uint64, watched bool) {
	if !w.watched.Load() {
		return 0, false
	}
	if v, ok := w.counts.Load(types.NamespacedName{Namespace: namespace, Name: state}); ok {
		return v.(*atomic.Uint64).Load(), true
	}
	return 0, true
}

// reportStateOf names the state Secret whose report the shard named name is part of.
func reportStateOf(name string) (string, bool) {
	i := strings.LastIndex(name, "-report")
	if i < 0 {
		return "", false
	}
	k, err := strconv.Atoi(name[i+len("-report"):])
	if err != nil || contract.ReportShardName(name[:i], k) != name || k < 1 {
		return "", false
	}
	return name[:i], true
}

// assembled keeps the last report assembled from each state Secret (by UID), with the state
// Secret's version and the shard writes counted when it was read.
type assembled struct {
	mu      sync.Mutex
	entries map[types.UID]assembledReport
}

type assembledReport struct {
	version string
	writes  uint64
	state   *contract.ProxyState
}

func (a *assembled) at(uid types.UID, version string, writes uint64) (*contract.ProxyState, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.entries[uid]
	if !ok || e.version != version || e.writes != writes {
		return nil, false
	}
	return e.state, true
}

func (a *assembled) keep(uid types.UID, version string, writes uint64, st *contract.ProxyState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.entries == nil || len(a.entries) > 4096 { // replicas since deleted: start over
		a.entries = map[types.UID]assembledReport{}
	}
	a.entries[uid] = assembledReport{version, writes, st}
}
