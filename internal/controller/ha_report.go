package controller

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
)

// secretTypeReport labels the Secrets a replica's report is spread over besides its state
// Secret (contract.ReportShardName): one fewer than the group's document shards.
const secretTypeReport = "report"

// reportSecretNames names replica i's report Secrets for a group of the given document shards.
func reportSecretNames(g group, i, shards int) []string {
	var names []string
	for k := 1; k < shards; k++ {
		names = append(names, contract.ReportShardName(g.replicas().stateSecret(i), k))
	}
	return names
}

// reportSecrets are replica i's report Secrets, empty: the replica writes them.
func (r *ProxyGroupReconciler) reportSecrets(g group, i, shards int) []client.Object {
	var objs []client.Object
	for _, name := range reportSecretNames(g, i, shards) {
		objs = append(objs, r.secret(g, name, secretTypeReport, i, nil))
	}
	return objs
}

// removeReportSecrets removes the report Secrets of replicas at or above n.
func (r *ProxyGroupReconciler) removeReportSecrets(ctx context.Context, g group, n int) error {
	list := &corev1.SecretList{}
	labels := g.labels()
	labels[LabelSecretType] = secretTypeReport
	if err := r.List(ctx, list, client.InNamespace(r.Settings.Namespace), client.MatchingLabels(labels)); err != nil {
		return err
	}
	for i := range list.Items {
		if ord, err := strconv.Atoi(list.Items[i].Labels[labelReplica]); err == nil && ord >= n {
			if err := remove(ctx, r.Client, &list.Items[i]); err != nil {
				return err
			}
		}
	}
	return nil
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

// parsedStates keeps each replica's report, parsed: it grows with the objects on its group,
// and every reconcile of one of them reads it. Keyed by the state Secret, at the versions of
// all the report's Secrets.
var parsedStates versioned[*contract.ProxyState]

// parsedShards keeps the parse of each report Secret: a replica rewrites one shard of its
// report at a time, and the event handlers (old and new version) and the reconcilers read the
// same versions.
var parsedShards versioned[*contract.ProxyState]

// parseShard is contract.ParseState of s's data, shared: callers must not change it.
func parseShard(s *corev1.Secret) (*contract.ProxyState, error) {
	return parsedShards.get(s.UID, s.ResourceVersion, func() (*contract.ProxyState, error) { return contract.ParseState(s.Data) })
}

// reportShards returns the Secrets of the other shards of the report whose state Secret is s,
// by name. Every HA reconcile reads its group's reports: from the
// cache's index, without the copy a Get makes of each (a large group's reports are spread
// over dozens of Secrets, and copying them per reconcile made the work grow with the square
// of the group's size). They are the cache's own objects: read, never changed.
func reportShards(ctx context.Context, cl client.Reader, s *corev1.Secret, count int) (map[string]*corev1.Secret, error) {
	out := map[string]*corev1.Secret{}
	if count <= 1 {
		return out, nil
	}
	list := &corev1.SecretList{}
	if err := cl.List(ctx, list, client.InNamespace(s.Namespace), client.MatchingFields{indexReportOf: s.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

// parseReport returns the report whose state Secret is s, read with the Secrets of its other
// shards. The result is shared: callers must not change it.
func parseReport(ctx context.Context, cl client.Reader, s *corev1.Secret) (*contract.ProxyState, error) {
	count, err := contract.ReportShardCount(s.Data)
	if err != nil {
		return nil, err
	}
	secrets := []*corev1.Secret{s}
	shards := []map[string][]byte{s.Data}
	versions := []string{s.ResourceVersion}
	others, err := reportShards(ctx, cl, s, count)
	if err != nil {
		return nil, err
	}
	for k := 1; k < count; k++ {
		shard := others[contract.ReportShardName(s.Name, k)] // a missing one reads as empty
		var data map[string][]byte
		var version string
		if shard != nil {
			data, version = shard.Data, shard.ResourceVersion
		}
		secrets, shards, versions = append(secrets, shard), append(shards, data), append(versions, version)
	}
	version := strings.Join(versions, ",")
	if s.ResourceVersion == "" {
		version = ""
	}
	return parsedStates.get(s.UID, version, func() (*contract.ProxyState, error) {
		return contract.ReadReport(shards, func(k int) (*contract.ProxyState, error) { return parseShard(secrets[k]) })
	})
}
