package proxies

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
)

// A proxy's Pods move to another namespace one replica at a time: the old StatefulSet gives up
// its highest replica only when every replica of the new one is ready, and the new one starts
// that replica only once the old Pod is gone (both would be the same tailnet device).
func TestPlaceMovesOneReplicaAtATime(t *testing.T) {
	ctx := context.Background()
	w := Where{State: "ops", Pods: []string{"ops", "priv"}}
	pod := func(ns string, i int) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("g-%d", i)}}
	}
	old := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "g"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)}}
	c := fake.NewClientBuilder().WithObjects(old, pod("ops", 0), pod("ops", 1)).WithStatusSubresource(&appsv1.StatefulSet{}).Build()
	want := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "priv", Name: "g"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)}}

	type placement struct{ oldReplicas, newStart, newReplicas int32 }
	step := func(what string, moving bool, p placement) {
		t.Helper()
		got, err := Place(ctx, c, w, want.DeepCopy())
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got != moving {
			t.Fatalf("%s: moving %v, want %v", what, got, moving)
		}
		o, n := &appsv1.StatefulSet{}, &appsv1.StatefulSet{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ops", Name: "g"}, o); apierrors.IsNotFound(err) {
			o.Spec.Replicas = ptr.To[int32](-1) // gone
		} else if err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "priv", Name: "g"}, n); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if gotP := (placement{*o.Spec.Replicas, firstOrdinal(n), *n.Spec.Replicas}); gotP != p {
			t.Fatalf("%s: old replicas, new start and replicas %+v, want %+v", what, gotP, p)
		}
	}
	setReady := func(ready int32) {
		t.Helper()
		n := &appsv1.StatefulSet{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "priv", Name: "g"}, n); err != nil {
			t.Fatal(err)
		}
		n.Status = appsv1.StatefulSetStatus{ObservedGeneration: n.Generation, Replicas: ready, ReadyReplicas: ready}
		if err := c.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(p *corev1.Pod) {
		t.Helper()
		if err := c.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	}

	step("a new StatefulSet of no replica yet, the old one's highest given up", true, placement{1, 2, 0})
	step("the old Pod still going away keeps its ordinal", true, placement{1, 2, 0})
	gone(pod("ops", 1))
	step("its replica starts in the new namespace", true, placement{1, 1, 1})
	step("the old one waits for it to be ready", true, placement{1, 1, 1})
	setReady(1)
	step("then gives up the next", true, placement{0, 1, 1})
	gone(pod("ops", 0))
	step("whose replica starts anew, and the old StatefulSet goes", true, placement{-1, 0, 2})
	step("then it is applied where it runs", false, placement{-1, 0, 2})
}

// Without another namespace a proxy's StatefulSet is applied as it is.
func TestPlaceWithoutAMove(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: "g"}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](3)}}
	moving, err := Place(ctx, c, Where{State: "ops", Pods: []string{"ops", "priv"}}, sts)
	if err != nil || moving {
		t.Fatalf("Place: moving %v, %v", moving, err)
	}
	got := &appsv1.StatefulSet{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(sts), got); err != nil {
		t.Fatal(err)
	}
	if *got.Spec.Replicas != 3 || got.Spec.Ordinals != nil {
		t.Fatalf("applied %d replicas from %v, want 3 from 0", *got.Spec.Replicas, got.Spec.Ordinals)
	}
}

// A proxy's metrics Service follows its Pods: applied where they run, removed where they ran.
func TestPlaceMetricsObjectsFollowsThePods(t *testing.T) {
	ctx := context.Background()
	w := Where{State: "ops", Pods: []string{"ops", "priv"}}
	class := &tsv1alpha1.ProxyClass{Spec: tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{Enable: true}}}
	labels := map[string]string{"app": "p"}
	c := fake.NewClientBuilder().Build()
	for _, podNS := range []string{"ops", "priv", "ops"} {
		if err := PlaceMetricsObjects(ctx, c, nil, w, "p", podNS, labels, labels, class); err != nil {
			t.Fatalf("Pods in %s: %v", podNS, err)
		}
		for _, ns := range w.Pods {
			err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: metricsName("p")}, &corev1.Service{})
			if found := err == nil; found != (ns == podNS) {
				t.Fatalf("Pods in %s: metrics Service in %s found %v (%v)", podNS, ns, found, err)
			}
		}
	}
}
