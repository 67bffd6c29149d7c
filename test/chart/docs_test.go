package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// valuePaths lists the chart's values as the schema names them: a node with properties is a group
// of values, any other node one value (free-form maps such as resources included).
func valuePaths(prefix string, node map[string]any) []string {
	props, ok := node["properties"].(map[string]any)
	if !ok {
		return []string{prefix}
	}
	var out []string
	for name, child := range props {
		p := name
		if prefix != "" {
			p = prefix + "." + name
		}
		c, _ := child.(map[string]any)
		out = append(out, valuePaths(p, c)...)
	}
	return out
}

// documented reads the first cells of docs/helm.md's table: "`a.b.c`, `.d`" names a.b.c and a.b.d.
func documented(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "helm.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	cell := regexp.MustCompile("^\\| (`[^|]+) \\|")
	for _, line := range strings.Split(string(b), "\n") {
		m := cell.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		parent := ""
		for _, item := range strings.Split(m[1], ", ") {
			item = strings.Trim(item, "`")
			if strings.HasPrefix(item, ".") {
				item = parent + item
			}
			names[item] = true
			parent = item[:max(strings.LastIndex(item, "."), 0)]
		}
	}
	return names
}

// TestValuesDocumented: every value of the schema has a row in docs/helm.md, values.yaml sets
// each (so that helm show values shows them all), and the table names no value that is gone.
func TestValuesDocumented(t *testing.T) {
	var schema map[string]any
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	b, err = os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	paths := valuePaths("", schema)
	sort.Strings(paths)
	docs := documented(t)
	for _, p := range paths {
		if !docs[p] {
			t.Errorf("value %s has no row in docs/helm.md", p)
		}
		var v any = values
		for _, part := range strings.Split(p, ".") {
			m, _ := v.(map[string]any)
			if v = m[part]; v == nil {
				t.Errorf("value %s is not in values.yaml", p)
				break
			}
		}
		delete(docs, p)
	}
	for name := range docs {
		t.Errorf("docs/helm.md has a row for %s, which the schema does not have", name)
	}
	if len(paths) < 30 {
		t.Errorf("%d values found in the schema: is it read right?", len(paths))
	}
}
