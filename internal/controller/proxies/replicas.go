package proxies

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
)

// AuthKeyExpiry bounds how long a minted key that was never used stays valid.
const AuthKeyExpiry = 24 * time.Hour

// replicaSet names the per-replica children of a proxy StatefulSet, standalone (one replica)
// or a ProxyGroup's. Replica i runs in Pod <name>-i and keeps its state in a Secret of its
// Pod's name, as the proxy stores it under its own Pod's name. A standalone proxy reads its
// config from that Secret too; a group's replicas each have a config Secret of their own.
type replicaSet struct {
	name           string
	separateConfig bool
}

func (s replicaSet) pod(i int) string         { return fmt.Sprintf("%s-%d", s.name, i) }
func (s replicaSet) StateSecret(i int) string { return s.pod(i) }

func (s replicaSet) ConfigSecret(i int) string {
	if s.separateConfig {
		return s.pod(i) + "-config"
	}
	return s.pod(i)
}

// Replica is what a pass read of one replica.
type Replica struct {
	pod *corev1.Pod // nil while there is none; the cache's: do not change it
	// State is what the running Pod reports, nil while it has not: state left by an earlier Pod
	// does not describe the running proxy. It is shared (Reports): do not change it.
	State *contract.ProxyState
	// unreadable says why the state Secret cannot be read (edited by hand); it is ignored until
	// the proxy writes it again.
	unreadable error
}

// Read reads replica i of the set, where w says, its report parsed through reports.
func (s replicaSet) Read(ctx context.Context, c client.Reader, reports *Reports, w Where, i int) (Replica, error) {
	var r Replica
	pod, err := s.findPod(ctx, c, w, i)
	if pod == nil || err != nil {
		return r, err
	}
	r.pod = pod
	ns := w.State
	secret := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.StateSecret(i)}, secret, client.UnsafeDisableDeepCopy); err != nil {
		if err := client.IgnoreNotFound(err); err != nil {
			return r, fmt.Errorf("reading the proxy state Secret %s/%s: %w", ns, s.StateSecret(i), err)
		}
		return r, nil
	}
	st, err := reports.parse(ctx, c, secret)
	if err != nil {
		r.unreadable = err
		return r, nil //nolint:nilerr // an unreadable report is a finding of the replica, not a failed read
	}
	if st.CurrentFor(string(pod.UID)) {
		r.State = st
	}
	return r, nil
}

// findPod finds replica i's Pod in one of the namespaces it may run in (one at a time: Place),
// nil while there is none. The cache's own objects, not copies: every reconcile of an object on
// a group reads all its replicas, and copying their state Secrets grew with the group.
func (s replicaSet) findPod(ctx context.Context, c client.Reader, w Where, i int) (*corev1.Pod, error) {
	for _, ns := range w.Pods {
		pod := &corev1.Pod{}
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.pod(i)}, pod, client.UnsafeDisableDeepCopy)
		if err == nil {
			return pod, nil
		}
		if err := client.IgnoreNotFound(err); err != nil {
			return nil, fmt.Errorf("reading the proxy Pod %s/%s: %w", ns, s.pod(i), err)
		}
	}
	return nil, nil
}
