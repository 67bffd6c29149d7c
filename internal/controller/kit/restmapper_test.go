package kit

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// countingMapper counts the mappings asked of it.
type countingMapper struct {
	meta.RESTMapper
	calls int
}

func (c *countingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	c.calls++
	return c.RESTMapper.RESTMapping(gk, versions...)
}

func TestRememberingMapper(t *testing.T) {
	secrets := schema.GroupVersion{Version: "v1"}
	groups := schema.GroupVersion{Group: "tailscale.com", Version: "v1alpha1"}
	base := meta.NewDefaultRESTMapper([]schema.GroupVersion{secrets, groups})
	base.Add(secrets.WithKind("Secret"), meta.RESTScopeNamespace)
	inner := &countingMapper{RESTMapper: base}
	m := &rememberingMapper{RESTMapper: inner}
	secret := schema.GroupKind{Kind: "Secret"}

	for range 3 {
		mapping, err := m.RESTMapping(secret, "v1")
		if err != nil || mapping.Scope.Name() != meta.RESTScopeNameNamespace || mapping.Resource.Resource != "secrets" {
			t.Fatalf("Secret v1: %+v, %v", mapping, err)
		}
		mapping.Resource.Resource = "changed by a caller"
	}
	if inner.calls != 1 {
		t.Errorf("a mapping at an explicit version asked %d times; want once", inner.calls)
	}
	_, _ = m.RESTMapping(secret)
	_, _ = m.RESTMapping(secret)
	if inner.calls != 3 {
		t.Errorf("%d calls; a mapping without a version is asked each time", inner.calls)
	}

	// Not found is not remembered: the CRD may be installed later.
	group := schema.GroupKind{Group: "tailscale.com", Kind: "ProxyGroup"}
	if _, err := m.RESTMapping(group, "v1alpha1"); !meta.IsNoMatchError(err) {
		t.Fatalf("ProxyGroup before its CRD: %v; want no match", err)
	}
	base.Add(groups.WithKind("ProxyGroup"), meta.RESTScopeRoot)
	if mapping, err := m.RESTMapping(group, "v1alpha1"); err != nil || mapping.Scope.Name() != meta.RESTScopeNameRoot {
		t.Errorf("ProxyGroup once its CRD is installed: %+v, %v", mapping, err)
	}
}
