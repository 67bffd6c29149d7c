package main

import (
	"strings"
	"testing"
	"time"
)

func TestGoals(t *testing.T) {
	smp := func(reqs int, p99 time.Duration) sample {
		return sample{reqs: reqs, dur: time.Second, p99: p99, bytes: int64(reqs) << 20}
	}
	r := &report{
		dataPath: []dataPathResult{
			{sc: scenarios[0], medians: map[string]sample{"ours": smp(1300, 2*time.Millisecond), "original (Serve)": smp(1000, 3*time.Millisecond)}},
			{sc: scenarios[1], medians: map[string]sample{"ours": smp(1300, 9*time.Millisecond), "original (Serve)": smp(1000, 3*time.Millisecond)}},
			{sc: scenarios[2], medians: map[string]sample{"ours": smp(50, 0), "original (Serve)": smp(40, 0)}},
		},
		first200: []firstResult{{first200: 300 * time.Millisecond, attempts: []string{"+0.0s 200 (0.0s)"}}},
		scale: map[string][]scaleResult{"this build": {
			{n: 100, status: 2 * time.Second, afterReport: time.Second, cpu: 200 * 10 * time.Millisecond, largestObject: 100 << 10, largestName: "a"},
			{n: 1000, status: 30 * time.Second, afterReport: 8 * time.Second, cpu: 2000 * 30 * time.Millisecond, largestObject: 300 << 10, largestName: "b"},
		}},
		memory: []memoryResult{{name: "this build", withTLS: 70 << 20}},
	}
	got := map[string]string{}
	for _, g := range r.goals() {
		got[g.name] = g.met
	}
	want := map[string]string{
		"L7 small GET, keep-alive, 1 client: ≥ 1.2× the Serve path, p99 no worse":   "yes",
		"L7 small GET, keep-alive, 16 clients: ≥ 1.2× the Serve path, p99 no worse": "no", // p99 worse
		"L7 1 MiB GET: ≥ 1.0× the Serve path":                                       "yes",
		"new proxy → first HTTPS 200 ≤ 2 s, no request that hangs":                  "yes",
		"1000 Ingresses and 1000 Services converge ≤ 10.0 s after the last apply":   "no",
		"5000 Ingresses and 5000 Services converge ≤ 60.0 s after the last apply":   "not measured",
		"status within 10 s of the replicas' report":                                "yes",
		"operator CPU per object flat in N":                                         "no", // 10 ms → 30 ms
		"no object over 256 KiB":                                                    "no",
		"operator RSS ≤ 80 MiB with the unrelated objects":                          "yes",
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %q, want %q", name, got[name], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d goals, want %d: %v", len(got), len(want), got)
	}
	if md := string(r.markdown()); !strings.Contains(md, "## Against the goals") {
		t.Error("the report has no goals section")
	}
}
