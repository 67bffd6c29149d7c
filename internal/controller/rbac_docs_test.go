package controller

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/tsingress/tsingress/internal/testing/docstest"
)

// Every rule config/rbac gives the operator is in docs/security.md's table, with the same verbs,
// and the table lists nothing else.
func TestPermissionsDocumented(t *testing.T) {
	granted := map[string]string{}
	// The restricted overlay's Role in the privileged namespace, where kernel-path proxies run.
	const privileged = "overlays/restricted/privileged.yaml"
	for _, f := range []string{"rbac/role.yaml", "rbac/leader_election_role.yaml", "rbac/metrics_auth_role.yaml", "rbac/tls_secret_reader_role.yaml", privileged} {
		b, err := os.ReadFile(filepath.Join("..", "..", "config", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var rules []rbacv1.PolicyRule
			binding := meta.Kind
			switch meta.Kind {
			case "ClusterRole":
				role := &rbacv1.ClusterRole{}
				if err := yaml.Unmarshal([]byte(doc), role); err != nil {
					t.Fatal(err)
				}
				rules = role.Rules
				if f == "rbac/tls_secret_reader_role.yaml" {
					binding = "reader"
				}
			case "Role":
				role := &rbacv1.Role{}
				if err := yaml.Unmarshal([]byte(doc), role); err != nil {
					t.Fatal(err)
				}
				rules = role.Rules
				if f == privileged {
					binding = "privileged"
				}
			case "Namespace", "RoleBinding":
				if f != privileged {
					t.Fatalf("%s: a %q", f, meta.Kind)
				}
			default:
				t.Fatalf("%s: a %q", f, meta.Kind)
			}
			for _, r := range rules {
				for _, g := range r.APIGroups {
					if g == "" {
						g = "core"
					}
					for _, res := range r.Resources {
						if len(r.ResourceNames) > 0 {
							res += " (" + strings.Join(r.ResourceNames, ", ") + ")"
						}
						verbs := slices.Sorted(slices.Values(r.Verbs))
						granted[binding+" | "+g+" | "+res] = strings.Join(verbs, ", ")
					}
				}
			}
		}
	}

	b, err := docstest.Read("security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Every permission of the operator\n")
	if !ok {
		t.Fatal("docs/security.md has no section \"Every permission of the operator\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	documented := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) != 5 || !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| binding") {
			continue
		}
		binding := strings.TrimPrefix(cells[0], "| ")
		for _, res := range splitResources(cells[2]) {
			documented[binding+" | "+cells[1]+" | "+res] = cells[3]
		}
	}
	for _, k := range slices.Sorted(maps.Keys(granted)) {
		if documented[k] != granted[k] {
			t.Errorf("%s: granted %q, documented %q", k, granted[k], documented[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(documented)) {
		if _, ok := granted[k]; !ok {
			t.Errorf("%s: documented, not granted", k)
		}
	}
}

// splitResources splits a table cell's resources at commas outside parentheses.
func splitResources(cell string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range cell {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(cell[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(cell[start:]))
}
