package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
)

func TestGroupStatus(t *testing.T) {
	up := func(n int) []tsv1alpha1.TailnetDevice {
		var d []tsv1alpha1.TailnetDevice
		for range n {
			d = append(d, tsv1alpha1.TailnetDevice{Hostname: "r.tailnet.test"})
		}
		return d
	}
	type cond struct {
		status metav1.ConditionStatus
		reason string
	}
	for name, c := range map[string]struct {
		scope            groupScope
		ready, available cond
	}{
		"starting": {groupScope{replicas: 2},
			cond{metav1.ConditionFalse, ReasonProxyGroupCreating}, cond{metav1.ConditionFalse, ReasonProxyGroupNoReplicas}},
		"one of two up": {groupScope{replicas: 2, devices: up(1)},
			cond{metav1.ConditionFalse, ReasonProxyGroupCreating}, cond{metav1.ConditionTrue, ReasonProxyGroupAvailable}},
		"all up": {groupScope{replicas: 2, devices: up(2)},
			cond{metav1.ConditionTrue, ReasonProxyGroupReady}, cond{metav1.ConditionTrue, ReasonProxyGroupAvailable}},
		"ProxyClass re-validated while the replicas serve": {
			groupScope{replicas: 2, devices: up(2), failReason: ReasonProxyGroupPending, failMessage: "waiting"},
			cond{metav1.ConditionFalse, ReasonProxyGroupPending}, cond{metav1.ConditionTrue, ReasonProxyGroupAvailable}},
		"children failing with no replica up": {groupScope{replicas: 1, failReason: ReasonProxyGroupFailed, failMessage: "applying"},
			cond{metav1.ConditionFalse, ReasonProxyGroupFailed}, cond{metav1.ConditionFalse, ReasonProxyGroupNoReplicas}},
		"scaled to zero": {groupScope{replicas: 0},
			cond{metav1.ConditionTrue, ReasonProxyGroupReady}, cond{metav1.ConditionFalse, ReasonProxyGroupNoReplicas}},
	} {
		t.Run(name, func(t *testing.T) {
			prev := tsv1alpha1.ProxyGroupStatus{}
			st := groupStatus(prev, c.scope, 3)
			if len(prev.Conditions) != 0 {
				t.Fatal("groupStatus changed its input")
			}
			for typ, want := range map[string]cond{tsv1alpha1.ProxyGroupReady: c.ready, tsv1alpha1.ProxyGroupAvailable: c.available} {
				got := meta.FindStatusCondition(st.Conditions, typ)
				if got == nil || got.Status != want.status || got.Reason != want.reason || got.ObservedGeneration != 3 {
					t.Errorf("%s = %+v, want %s %s at generation 3", typ, got, want.status, want.reason)
				}
			}
			if len(st.Devices) != len(c.scope.devices) {
				t.Errorf("devices %v, want %v", st.Devices, c.scope.devices)
			}
		})
	}
}
