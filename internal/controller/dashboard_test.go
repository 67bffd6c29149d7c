package controller

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// metricNames are the names the code registers: every Name of a metric's options, and the
// names of the operator's collector's descriptions.
func metricNames(t *testing.T) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(tsingress_[a-z_]+)"`)
	names := map[string]bool{}
	for _, f := range []string{"metrics.go", "../proxy/metrics.go", "../proxy/web/metrics.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
	}
	if len(names) < 15 {
		t.Fatalf("found only %d metric names in the code: %v", len(names), names)
	}
	return names
}

// used lists the tsingress_ metric names a text mentions, a histogram's series as the histogram.
func used(text string) map[string]bool {
	out := map[string]bool{}
	for _, n := range regexp.MustCompile(`tsingress_[a-z_]+`).FindAllString(text, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			n = strings.TrimSuffix(n, suffix)
		}
		out[n] = true
	}
	return out
}

// The dashboard queries and the metrics documentation name only metrics the code registers,
// and the documentation names every one.
func TestDashboardUsesKnownMetrics(t *testing.T) {
	names := metricNames(t)
	b, err := os.ReadFile("../../config/grafana/tsingress.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	var exprs strings.Builder
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs.WriteString(tg.Expr + "\n")
		}
	}
	for n := range used(exprs.String()) {
		if !names[n] {
			t.Errorf("the dashboard queries %s, which no code registers", n)
		}
	}
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := used(string(doc))
	for n := range documented {
		if !names[n] {
			t.Errorf("docs/metrics.md names %s, which no code registers", n)
		}
	}
	for n := range names {
		if !documented[n] {
			t.Errorf("docs/metrics.md does not document %s", n)
		}
	}
}
