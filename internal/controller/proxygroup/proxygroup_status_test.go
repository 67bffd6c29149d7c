package proxygroup

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
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
			cond{metav1.ConditionFalse, kit.ReasonProxyGroupCreating}, cond{metav1.ConditionFalse, kit.ReasonProxyGroupNoReplicas}},
		"one of two up": {groupScope{replicas: 2, devices: up(1)},
			cond{metav1.ConditionFalse, kit.ReasonProxyGroupCreating}, cond{metav1.ConditionTrue, kit.ReasonProxyGroupAvailable}},
		"all up": {groupScope{replicas: 2, devices: up(2)},
			cond{metav1.ConditionTrue, kit.ReasonProxyGroupReady}, cond{metav1.ConditionTrue, kit.ReasonProxyGroupAvailable}},
		"ProxyClass re-validated while the replicas serve": {
			groupScope{replicas: 2, devices: up(2), failReason: kit.ReasonProxyGroupPending, failMessage: "waiting"},
			cond{metav1.ConditionFalse, kit.ReasonProxyGroupPending}, cond{metav1.ConditionTrue, kit.ReasonProxyGroupAvailable}},
		"children failing with no replica up": {groupScope{replicas: 1, failReason: kit.ReasonProxyGroupFailed, failMessage: "applying"},
			cond{metav1.ConditionFalse, kit.ReasonProxyGroupFailed}, cond{metav1.ConditionFalse, kit.ReasonProxyGroupNoReplicas}},
		"scaled to zero": {groupScope{replicas: 0},
			cond{metav1.ConditionTrue, kit.ReasonProxyGroupReady}, cond{metav1.ConditionFalse, kit.ReasonProxyGroupNoReplicas}},
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

// A write of a group's documents reconciles the group only when something it writes follows
// from it: while a replica may read a config that lists the services, or when the shard count
// or the ConfigMap's metadata changed.
func TestDocumentWrites(t *testing.T) {
	cm := func(count int, serve string, mutate ...func(*corev1.ConfigMap)) *corev1.ConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pg-ingress-config", Labels: proxies.Group{Name: "pg"}.Labels()},
			Data: map[string]string{"serve-config.v1.json": serve}}
		if count > 1 {
			idx, err := contract.GroupShardIndexes.Encode(&contract.GroupShards{Count: count})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range idx {
				c.Data[k] = string(v)
			}
		}
		for _, m := range mutate {
			m(c)
		}
		return c
	}
	relabelled := func(c *corev1.ConfigMap) { c.Labels = map[string]string{kit.LabelManaged: "true"} }
	for name, c := range map[string]struct {
		documentsRead  any // the group's entry, nil for none
		old, cur       *corev1.ConfigMap
		wantReconciled bool
	}{
		"replicas read the documents, services changed": {true, cm(1, "a"), cm(1, "b"), false},
		"a replica may read a list":                     {false, cm(1, "a"), cm(1, "b"), true},
		"group not seen yet":                            {nil, cm(1, "a"), cm(1, "b"), true},
		"shard count grew":                              {true, cm(2, "a"), cm(3, "a"), true},
		"shard index added":                             {true, cm(1, "a"), cm(2, "a"), true},
		"labels changed by hand":                        {true, cm(1, "a"), cm(1, "a", relabelled), true},
		"shard count unchanged in a sharded group":      {true, cm(4, "a"), cm(4, "b"), false},
	} {
		t.Run(name, func(t *testing.T) {
			r := &ProxyGroupReconciler{}
			if c.documentsRead != nil {
				r.documentsRead.Store("pg", c.documentsRead)
			}
			got := r.documentWrites().Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.cur})
			if got != c.wantReconciled {
				t.Errorf("reconciled = %v, want %v", got, c.wantReconciled)
			}
		})
	}
}

func TestContentWrites(t *testing.T) {
	secret := func(typ, data string, mutate ...func(*corev1.Secret)) *corev1.Secret {
		labels := proxies.Group{Name: "pg"}.Labels()
		labels[kit.LabelSecretType] = typ
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Labels: labels}, Data: map[string][]byte{"k": []byte(data)}}
		for _, m := range mutate {
			m(s)
		}
		return s
	}
	relabelled := func(s *corev1.Secret) { s.Labels = map[string]string{kit.LabelManaged: "true"} }
	withData := func(k, v string) func(*corev1.Secret) { return func(s *corev1.Secret) { s.Data[k] = []byte(v) } }
	disowned := func(s *corev1.Secret) { s.OwnerReferences = []metav1.OwnerReference{{Name: "other"}} }
	deleting := func(s *corev1.Secret) { now := metav1.Now(); s.DeletionTimestamp = &now }
	for name, c := range map[string]struct {
		old, cur       *corev1.Secret
		wantReconciled bool
	}{
		"a report shard written":     {secret(proxies.SecretTypeReport, "a"), secret(proxies.SecretTypeReport, "b"), false},
		"a certificate issued":       {secret(certs.SecretTypeGroupCert, ""), secret(certs.SecretTypeGroupCert, "cert"), false},
		"a certificate copy updated": {secret(certs.SecretTypeCertCopy, "a"), secret(certs.SecretTypeCertCopy, "b"), false},
		"a state Secret written":     {secret(proxies.SecretTypeState, "a"), secret(proxies.SecretTypeState, "b"), true},
		"a state Secret's report entries written": {secret(proxies.SecretTypeState, "a", withData(contract.StateAdvertised, "x")),
			secret(proxies.SecretTypeState, "a", withData(contract.StateAdvertised, "y")), false},
		"a state Secret's entries and login written": {secret(proxies.SecretTypeState, "a", withData(contract.StateAdvertised, "x")),
			secret(proxies.SecretTypeState, "b", withData(contract.StateAdvertised, "y")), true},
		"a state Secret's key removed":   {secret(proxies.SecretTypeState, "a", withData("profile", "p")), secret(proxies.SecretTypeState, "a"), true},
		"a config Secret changed":        {secret(secretTypeConfig, "a"), secret(secretTypeConfig, "b"), true},
		"a report shard's labels edited": {secret(proxies.SecretTypeReport, "a"), secret(proxies.SecretTypeReport, "a", relabelled), true},
		"a certificate's owner changed":  {secret(certs.SecretTypeGroupCert, "a"), secret(certs.SecretTypeGroupCert, "a", disowned), true},
		"a report shard being deleted":   {secret(proxies.SecretTypeReport, "a"), secret(proxies.SecretTypeReport, "a", deleting), true},
	} {
		t.Run(name, func(t *testing.T) {
			got := contentWrites().Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.cur})
			if got != c.wantReconciled {
				t.Errorf("reconciled = %v, want %v", got, c.wantReconciled)
			}
		})
	}
}
