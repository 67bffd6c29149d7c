package kit

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// Every write of the reconcilers goes through apply.go, so that how each kind of object is
// written (applied, created, patched under its resourceVersion, status by owner) is decided once.
func TestWritesOnlyInApplyGo(t *testing.T) {
	writes := map[string]bool{"Create": true, "Update": true, "Patch": true, "Delete": true, "DeleteAllOf": true, "Apply": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		// quiet.go is the client itself: each of its methods hands the write on unchanged.
		if name == "apply.go" || name == "quiet.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && writes[sel.Sel.Name] {
					t.Errorf("%s: %s outside apply.go", fset.Position(call.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}

// A Secret or ConfigMap child that the cache holds as apply would make it is not applied
// again; any difference in what apply sets is.
func TestApplySkipsWhatIsAlreadyApplied(t *testing.T) {
	owner := []metav1.OwnerReference{{APIVersion: "tailscale.com/v1alpha1", Kind: "ProxyGroup", Name: "pg", UID: "pg-uid",
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	secret := func(data map[string][]byte, mutate ...func(*corev1.Secret)) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "child", Labels: map[string]string{"a": "b"},
			OwnerReferences: owner}, Data: data}
		for _, m := range mutate {
			m(s)
		}
		return s
	}
	configMap := func(data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "child", Labels: map[string]string{"a": "b"},
			OwnerReferences: owner}, Data: data}
	}
	config := map[string][]byte{"proxy-config.v1.json": []byte(`{"version":1}`)}
	for name, c := range map[string]struct {
		existing, want client.Object
		applied        bool
	}{
		"the same config":                           {secret(config), secret(config), false},
		"a replica's state, data left alone":        {secret(map[string][]byte{"state": []byte("x")}), secret(nil), false},
		"config changed":                            {secret(config), secret(map[string][]byte{"proxy-config.v1.json": []byte(`{}`)}), true},
		"a config key the cache has more":           {secret(map[string][]byte{"old": nil, "proxy-config.v1.json": config["proxy-config.v1.json"]}), secret(config), true},
		"a label changed by hand":                   {secret(nil, func(s *corev1.Secret) { s.Labels["a"] = "c" }), secret(nil), true},
		"an annotation added by hand":               {secret(nil, func(s *corev1.Secret) { s.Annotations = map[string]string{"x": "y"} }), secret(nil), true},
		"another owner":                             {secret(nil, func(s *corev1.Secret) { s.OwnerReferences = nil }), secret(nil), true},
		"another type":                              {secret(nil), secret(nil, func(s *corev1.Secret) { s.Type = corev1.SecretTypeTLS }), true},
		"none yet":                                  {nil, secret(nil), true},
		"a ConfigMap the same, its data left alone": {configMap(map[string]string{"doc": "x"}), configMap(nil), false},
		"a ConfigMap's data changed":                {configMap(map[string]string{"doc": "x"}), configMap(map[string]string{"doc": "y"}), true},
		"another kind":                              {&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "child"}}, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "child"}}, true},
	} {
		t.Run(name, func(t *testing.T) {
			b := fake.NewClientBuilder()
			if c.existing != nil {
				b = b.WithObjects(c.existing)
			}
			applies := 0
			cl := b.WithInterceptorFuncs(interceptor.Funcs{Apply: func(ctx context.Context, cl client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
				applies++
				return nil
			}}).Build()
			if err := Apply(context.Background(), cl, c.want); err != nil {
				t.Fatal(err)
			}
			if got := applies > 0; got != c.applied {
				t.Errorf("applied %v, want %v", got, c.applied)
			}
		})
	}
}
