package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSpliceRun(t *testing.T) {
	page := "# Performance\n\nBy hand, before.\n\n## The latest run\n\n" +
		runBegin + "A -->\n\n- Run: A.\n\n### Against the goals\n\nold\n\n" + runEnd + "\n\n## Notes\n\nBy hand, after.\n"
	out, old, oldLabel, err := spliceRun([]byte(page), "B", []byte("- Run: B.\n\n### Against the goals\n\nnew\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "# Performance\n\nBy hand, before.\n\n## The latest run\n\n" +
		runBegin + "B -->\n\n- Run: B.\n\n### Against the goals\n\nnew\n\n" + runEnd + "\n\n## Notes\n\nBy hand, after.\n"
	if string(out) != want {
		t.Errorf("page:\n%s\nwant:\n%s", out, want)
	}
	if oldLabel != "A" || string(old) != "- Run: A.\n\n### Against the goals\n\nold\n" {
		t.Errorf("replaced %q: %q", oldLabel, old)
	}

	// A page without the section gets it at its end; nothing is replaced.
	out, old, _, err = spliceRun([]byte("# Performance\n\nBy hand.\n"), "B", []byte("- Run: B.\n"))
	if err != nil || old != nil {
		t.Fatalf("old %q, err %v", old, err)
	}
	if want := "# Performance\n\nBy hand.\n\n## The latest run\n\n" + runBegin + "B -->\n\n- Run: B.\n\n" + runEnd + "\n"; string(out) != want {
		t.Errorf("page:\n%s\nwant:\n%s", out, want)
	}

	// A section that does not end is refused rather than eating the rest of the page.
	if _, _, _, err := spliceRun([]byte(runBegin+"A -->\nby hand\n"), "B", nil); err == nil {
		t.Error("an unterminated section was accepted")
	}
}

func TestAddToHistory(t *testing.T) {
	h := "# Earlier runs\n\nOne line.\n\n" + historyMark + "\n\n## The run of A\n\nold\n\n## Notes by hand\n"
	got := string(addToHistory([]byte(h), "B", []byte("- Run: B.\n")))
	want := "# Earlier runs\n\nOne line.\n\n" + historyMark + "\n\n## The run of B\n\n- Run: B.\n\n## The run of A\n\nold\n\n## Notes by hand\n"
	if got != want {
		t.Errorf("history:\n%s\nwant:\n%s", got, want)
	}
	if got := string(addToHistory(nil, "B", []byte("- Run: B.\n"))); !strings.HasSuffix(got, historyMark+"\n\n## The run of B\n\n- Run: B.\n") {
		t.Errorf("new history:\n%s", got)
	}
}

func TestWriteRun(t *testing.T) {
	dir := t.TempDir()
	page, history := filepath.Join(dir, "performance.md"), filepath.Join(dir, "reports", "history.md")
	r := &report{scale: map[string][]scaleResult{}}
	for range 2 {
		if err := r.writeRun(page, history); err != nil {
			t.Fatal(err)
		}
	}
	p, _ := os.ReadFile(page)
	if strings.Count(string(p), runBegin) != 1 || strings.Count(string(p), "### Against the goals") != 1 {
		t.Errorf("page after two runs:\n%s", p)
	}
	h, err := os.ReadFile(history)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(h), "## The run of ") != 1 || !strings.Contains(string(h), "### Against the goals") {
		t.Errorf("history after two runs:\n%s", h)
	}
}
