package proxygroup

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tsingress/tsingress/internal/controller/groupstore"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// Each replica may write the Secrets of its report's shards, one fewer than the documents',
// which the reconciler makes; those of replicas scaled away go.
func TestReportSecretsOfReplicas(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().WithIndex(&corev1.Secret{}, groupstore.IndexSecretGroupType, groupstore.SecretGroupType).Build()
	r := &ProxyGroupReconciler{Client: c, Settings: kit.Settings{Namespace: "ns"}}
	g := proxies.Group{Name: "pg"}
	role := r.buildRole(g, 2, 3, groupCertSecrets{})
	var writable []string
	for _, rule := range role.Rules {
		if slices.Contains(rule.Resources, "secrets") && slices.Contains(rule.Verbs, "patch") {
			writable = append(writable, rule.ResourceNames...)
		}
	}
	for _, name := range []string{"pg-0", "pg-0-report1", "pg-0-report2", "pg-1", "pg-1-report1", "pg-1-report2"} {
		if !slices.Contains(writable, name) {
			t.Errorf("the replicas may not write %s: %v", name, writable)
		}
	}
	if slices.Contains(writable, "pg-0-report3") {
		t.Errorf("a report shard beyond the count is writable: %v", writable)
	}
	for i := range 3 {
		for _, obj := range r.reportSecrets(g, i, 3) {
			if err := c.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := r.removeReportSecrets(ctx, g, 2); err != nil {
		t.Fatal(err)
	}
	list := &corev1.SecretList{}
	if err := c.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, s := range list.Items {
		left = append(left, s.Name)
	}
	slices.Sort(left)
	if want := []string{"pg-0-report1", "pg-0-report2", "pg-1-report1", "pg-1-report2"}; !slices.Equal(left, want) {
		t.Errorf("after scaling to 2 replicas: %v; want %v", left, want)
	}
}
