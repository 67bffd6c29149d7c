package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The page (docs/performance.md) is written by hand except for one marked section, the latest
// run, which each run replaces. The run it replaces goes to the top of the history
// (docs/reports/performance-history.md), so that the page states what is true now and the
// previous run stays at hand for comparison. hack/chaos-kind.sh does the same for
// docs/reliability.md.
const (
	defaultPage    = "docs/performance.md"
	defaultHistory = "docs/reports/performance-history.md"
	// runBegin, then the run's label and " -->", opens the section; runEnd closes it.
	runBegin = "<!-- make bench: begin the run of "
	runEnd   = "<!-- make bench: end of the run -->"
	// historyMark is the line of the history below which the replaced runs go, newest first.
	historyMark = "<!-- make bench puts the run it replaces below this line, newest first -->"
)

// label names a run in its section's marker and, once replaced, in the history.
func (r *report) label() string {
	return fmt.Sprintf("%s–%s UTC, %s", r.started.UTC().Format("2006-01-02 15:04"), r.finished.UTC().Format("15:04"), commit())
}

// spliceRun puts section, the run called label, into page in place of the marked section there
// (appended under "## The latest run" when there is none), and returns the new page with the
// section it replaced and that section's label (both empty when there was none).
func spliceRun(page []byte, label string, section []byte) (out, old []byte, oldLabel string, err error) {
	// Blank lines around the section, so that neither marker runs into a table or a list.
	block := runBegin + label + " -->\n\n" + strings.Trim(string(section), "\n") + "\n\n" + runEnd + "\n"
	lines := strings.SplitAfter(string(page), "\n")
	begin, end := -1, -1
	for i, l := range lines {
		t := strings.TrimRight(l, "\n")
		switch {
		case begin < 0 && strings.HasPrefix(t, runBegin):
			begin = i
		case begin >= 0 && t == runEnd:
			end = i
		}
		if end >= 0 {
			break
		}
	}
	switch {
	case begin < 0:
		var b strings.Builder
		b.Write(page)
		if len(page) > 0 {
			if !bytes.HasSuffix(page, []byte("\n")) {
				b.WriteString("\n")
			}
			b.WriteString("\n")
		}
		b.WriteString("## The latest run\n\n" + block)
		return []byte(b.String()), nil, "", nil
	case end < 0:
		return nil, nil, "", fmt.Errorf("the run's section opens (%q) and does not end (%q)", runBegin, runEnd)
	}
	oldLabel = strings.TrimSuffix(strings.TrimPrefix(strings.TrimRight(lines[begin], "\n"), runBegin), " -->")
	old = []byte(strings.Trim(strings.Join(lines[begin+1:end], ""), "\n") + "\n")
	out = []byte(strings.Join(lines[:begin], "") + block + strings.Join(lines[end+1:], ""))
	return out, old, oldLabel, nil
}

// addToHistory puts a replaced run at the top of the history, below its mark; a history without
// the mark gets the run at its end, and one that does not exist is started.
func addToHistory(history []byte, label string, section []byte) []byte {
	entry := "## The run of " + label + "\n\n" + strings.TrimRight(string(section), "\n") + "\n"
	if len(history) == 0 {
		history = []byte("# Performance: earlier runs\n\nThe runs of `make bench` that a later run replaced in docs/performance.md, newest first.\n\n" + historyMark + "\n")
	}
	h := string(history)
	if i := strings.Index(h, historyMark+"\n"); i >= 0 {
		at := i + len(historyMark) + 1
		return []byte(h[:at] + "\n" + entry + h[at:])
	}
	return []byte(strings.TrimRight(h, "\n") + "\n\n" + entry)
}

// writeRun writes the run into the page at path and, when history is not empty, the run it
// replaces into the history.
func (r *report) writeRun(path, history string) error {
	page, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		page, err = []byte("# Performance\n"), nil
	}
	if err != nil {
		return err
	}
	out, old, oldLabel, err := spliceRun(page, r.label(), r.markdown())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if history != "" && len(bytes.TrimSpace(old)) > 0 {
		h, err := os.ReadFile(history)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(history), 0o755); err != nil {
			return err
		}
		// The history first: should the page's write fail, the replaced run is not lost.
		if err := os.WriteFile(history, addToHistory(h, oldLabel, old), 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(path, out, 0o644)
}
