package kit

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Requests about Secrets lose the reconcile's logger, through which client-go would log their
// bodies; others keep it.
func TestQuietDropsTheLoggerOfSecrets(t *testing.T) {
	var logged []string
	ctx := logr.NewContext(context.Background(), funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{}))
	secretApply := &unstructured.Unstructured{Object: map[string]any{"kind": "Secret"}}
	for _, tc := range []struct {
		obj   any
		quiet bool
	}{
		{&corev1.Secret{}, true},
		{&corev1.SecretList{}, true},
		{client.ApplyConfigurationFromUnstructured(secretApply), true},
		{&corev1.ConfigMap{}, false},
		{&corev1.PodList{}, false},
		{client.ApplyConfigurationFromUnstructured(&unstructured.Unstructured{Object: map[string]any{"kind": "Pod"}}), false},
	} {
		logged = nil
		logr.FromContextOrDiscard(quiet(ctx, tc.obj)).Info("body")
		if got := len(logged) == 0; got != tc.quiet {
			t.Errorf("%T: quiet = %t, want %t", tc.obj, got, tc.quiet)
		}
	}
}
