package controller

import (
	"context"
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

// stateCache keeps the last parse of each replica's report: it grows with the objects on its
// group, and every reconcile of one of them reads it.
type stateCache struct {
	mu     sync.Mutex
	parsed map[types.UID]parsedState
}

type parsedState struct {
	versions string // of the report's Secrets, in order
	state    *contract.ProxyState
}

var parsedStates = &stateCache{parsed: map[types.UID]parsedState{}}

// shardCache keeps the parse of each report Secret at its last version: a replica rewrites one
// shard of its report at a time, and the event handlers (old and new version) and the
// reconcilers read the same versions.
type shardCache struct {
	mu     sync.Mutex
	parsed map[types.UID]parsedShard
}

type parsedShard struct {
	version string
	state   *contract.ProxyState
	err     error
}

var parsedShards = &shardCache{parsed: map[types.UID]parsedShard{}}

// parse is contract.ParseState of s's data, shared: callers must not change it.
func (c *shardCache) parse(s *corev1.Secret) (*contract.ProxyState, error) {
	if s.UID == "" || s.ResourceVersion == "" { // not from the API server: nothing to key it by
		return contract.ParseState(s.Data)
	}
	c.mu.Lock()
	p, ok := c.parsed[s.UID]
	c.mu.Unlock()
	if ok && p.version == s.ResourceVersion {
		return p.state, p.err
	}
	st, err := contract.ParseState(s.Data)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.parsed) > 4096 { // Secrets of deleted groups: start over rather than track deletions
		clear(c.parsed)
	}
	c.parsed[s.UID] = parsedShard{version: s.ResourceVersion, state: st, err: err}
	return st, err
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

// parse returns the report whose state Secret is s, read with the Secrets of its other shards.
// The result is shared: callers must not change it.
func (c *stateCache) parse(ctx context.Context, cl client.Reader, s *corev1.Secret) (*contract.ProxyState, error) {
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
	key := strings.Join(versions, ",")
	c.mu.Lock()
	p, ok := c.parsed[s.UID]
	c.mu.Unlock()
	if ok && p.versions == key && s.ResourceVersion != "" {
		return p.state, nil
	}
	st, err := contract.ReadReport(shards, func(k int) (*contract.ProxyState, error) { return parsedShards.parse(secrets[k]) })
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.parsed) > 1024 { // Secrets of deleted groups: start over rather than track deletions
		clear(c.parsed)
	}
	c.parsed[s.UID] = parsedState{versions: key, state: st}
	return st, nil
}
