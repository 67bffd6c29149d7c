package v1alpha1_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// Every field path of the Tailscale operator's ProxyClass, ProxyGroup, ProxyGroupPolicy and Tailnet, at the tailscale.com
// version this module pins, is in ours: its users' manifests apply unchanged. (Each is honoured
// or refused with a condition: docs/proxyclass.md says which.) Its CRDs are read from the
// module's source, which the Go build already fetched; none of its code is used.
func TestOriginalCRDPathsAreOurs(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "tailscale.com").Output()
	if err != nil {
		t.Fatalf("finding the tailscale.com module: %v", err)
	}
	theirs := filepath.Join(strings.TrimSpace(string(out)), "cmd", "k8s-operator", "deploy", "crds")
	for _, plural := range []string{"proxyclasses", "proxygroups", "proxygrouppolicies", "tailnets"} {
		t.Run(plural, func(t *testing.T) {
			file := "tailscale.com_" + plural + ".yaml"
			want, got := schemaPaths(t, filepath.Join(theirs, file)), schemaPaths(t, filepath.Join("..", "..", "config", "crd", "bases", file))
			if len(want) < 5 {
				t.Fatalf("the Tailscale operator's %s has %d paths: the walk must see them", plural, len(want))
			}
			for _, p := range want {
				if !slices.Contains(got, p) {
					t.Errorf("%s: the Tailscale operator's %s is not in ours", plural, p)
				}
			}
		})
	}
}

// schemaPaths lists the field paths of a CRD's v1alpha1 schema ("spec.tailnet",
// "status.devices[].hostname").
func schemaPaths(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(b, crd); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []string
	var walk func(prefix string, s *apiextensionsv1.JSONSchemaProps)
	walk = func(prefix string, s *apiextensionsv1.JSONSchemaProps) {
		for name, p := range s.Properties {
			path := strings.TrimPrefix(prefix+"."+name, ".")
			out = append(out, path)
			walk(path, &p)
		}
		if s.Items != nil && s.Items.Schema != nil {
			walk(prefix+"[]", s.Items.Schema)
		}
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1alpha1" && v.Schema != nil {
			walk("", v.Schema.OpenAPIV3Schema)
		}
	}
	slices.Sort(out)
	return out
}
