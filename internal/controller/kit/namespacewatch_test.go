package kit

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
)

// A namespace whose watch is refused is forgotten (and no longer listed again and again); one
// whose watch fails otherwise is kept, for the reflector to retry.
func TestNamespaceNameWatchForgetsARefusedNamespace(t *testing.T) {
	ctx := context.Background()
	stopped := map[string]bool{}
	w := &NamespaceNameWatch{ctx: ctx, kind: schema.GroupVersionKind{Kind: "Secret"}, watches: map[string]context.CancelFunc{}}
	for _, ns := range []string{"refused", "flaky"} {
		w.watches[ns] = func() { stopped[ns] = true }
	}
	r := toolscache.NewReflectorWithOptions(&toolscache.ListWatch{}, nil, toolscache.NewStore(toolscache.MetaNamespaceKeyFunc), toolscache.ReflectorOptions{})
	w.watchErrors("flaky")(ctx, r, errors.New("connection refused"))
	w.watchErrors("refused")(ctx, r, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("no RoleBinding")))
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		_, refused := w.watches["refused"]
		_, flaky := w.watches["flaky"]
		w.mu.Unlock()
		if !refused {
			if !flaky || stopped["flaky"] {
				t.Fatalf("the namespace whose watch failed otherwise was forgotten")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the refused namespace is still watched")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
