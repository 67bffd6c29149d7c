package proxies

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

// Where says where a proxy's objects live: its Secrets, Role and mint records in State, its
// Pods in one of Pods (the operator's namespace, or the privileged one for the kernel path).
type Where struct {
	State string
	Pods  []string
}

// WhereFor is where the objects of proxies live under s.
func WhereFor(s kit.Settings) Where { return Where{State: s.Namespace, Pods: s.PodNamespaces()} }

// others are the namespaces besides ns that the proxy's Pods may have run in.
func (w Where) others(ns string) []string {
	var out []string
	for _, n := range w.Pods {
		if n != ns {
			out = append(out, n)
		}
	}
	return out
}

// Place applies sts, a proxy's StatefulSet, in its namespace. Where the proxy's StatefulSet
// runs in another of w's namespaces (the privileged namespace was set since, or a group's
// kernel path changed), it moves the Pods one replica at a time, with StatefulSet start
// ordinals: the old StatefulSet gives up its highest replica only once every replica of the new
// one is ready, and the new one starts that replica only once the old Pod is gone, since both
// would be the same tailnet device (one state Secret). A group keeps serving through the move;
// moving reports that it goes on, and the StatefulSet and Pod watches call again.
func Place(ctx context.Context, c client.Client, w Where, sts *appsv1.StatefulSet) (moving bool, err error) {
	for _, from := range w.others(sts.Namespace) {
		old := &appsv1.StatefulSet{}
		switch err := c.Get(ctx, client.ObjectKey{Namespace: from, Name: sts.Name}, old); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return false, fmt.Errorf("looking for the proxy StatefulSet %s/%s: %w", from, sts.Name, err)
		}
		return true, move(ctx, c, old, sts)
	}
	return false, kit.Apply(ctx, c, sts)
}

// move takes one step of moving the Pods of old to sts (see Place).
func move(ctx context.Context, c client.Client, old, sts *appsv1.StatefulSet) error {
	log := logf.FromContext(ctx)
	n := ptr.Deref(sts.Spec.Replicas, 1)
	k := min(ptr.Deref(old.Spec.Replicas, 1), n) // the old one keeps replicas 0..k-1
	// A Pod of the old one still going away keeps its ordinal from the new one.
	start := k
	for j := n - 1; j >= k; j-- {
		gone, err := podGone(ctx, c, old.Namespace, fmt.Sprintf("%s-%d", old.Name, j))
		if err != nil {
			return err
		}
		if !gone {
			start = j + 1
			break
		}
	}
	next := sts.DeepCopy()
	next.Spec.Replicas = ptr.To(n - start)
	if start > 0 {
		next.Spec.Ordinals = &appsv1.StatefulSetOrdinals{Start: start}
	}
	if err := kit.Apply(ctx, c, next); err != nil {
		return err
	}
	switch {
	case ptr.Deref(old.Spec.Replicas, 1) > n, start == k && k > 0 && ready(ctx, c, next):
		keep := min(ptr.Deref(old.Spec.Replicas, 1)-1, n)
		log.Info("moving a proxy replica", "from", old.Namespace, "to", sts.Namespace, "statefulSet", sts.Name, "replica", keep)
		if err := kit.ScaleStatefulSet(ctx, c, old, keep); err != nil {
			return fmt.Errorf("scaling the proxy StatefulSet %s/%s down to %d to move it to %s: %w", old.Namespace, old.Name, keep, sts.Namespace, err)
		}
	case k == 0 && start == 0:
		log.Info("moved a proxy", "from", old.Namespace, "to", sts.Namespace, "statefulSet", sts.Name)
		if err := kit.Remove(ctx, c, old); err != nil {
			return fmt.Errorf("deleting the proxy StatefulSet %s/%s, moved to %s: %w", old.Namespace, old.Name, sts.Namespace, err)
		}
	}
	return nil
}

// ready reports whether every replica sts asks for is ready, as the cache last saw it.
func ready(ctx context.Context, c client.Client, sts *appsv1.StatefulSet) bool {
	cur := &appsv1.StatefulSet{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(sts), cur); err != nil {
		return false
	}
	want := ptr.Deref(sts.Spec.Replicas, 1)
	return cur.Status.ObservedGeneration >= cur.Generation && ptr.Deref(cur.Spec.Replicas, 1) == want &&
		firstOrdinal(cur) == firstOrdinal(sts) && cur.Status.ReadyReplicas == want && cur.Status.Replicas == want
}

func podGone(ctx context.Context, c client.Client, ns, name string) (bool, error) {
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Pod{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking for the proxy Pod %s/%s: %w", ns, name, err)
	}
	return false, nil
}

func firstOrdinal(sts *appsv1.StatefulSet) int32 {
	if sts.Spec.Ordinals == nil {
		return 0
	}
	return sts.Spec.Ordinals.Start
}
