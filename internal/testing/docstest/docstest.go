// Package docstest reads the user docs in tests that keep the code and docs/ in step, from any
// package's folder.
package docstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
)

// Read returns docs/<name> of the repository this package is in.
func Read(name string) ([]byte, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return nil, errors.New("docstest: no caller information")
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "docs", name))
	if err != nil {
		return nil, fmt.Errorf("reading docs/%s: %w", name, err)
	}
	return b, nil
}

var reasonRow = regexp.MustCompile("(?m)^\\| `([A-Za-z]+)` \\|")

// Reasons returns the reasons tabled in docs/reasons.md: rows that start with a reason in
// backquotes.
func Reasons() ([]string, error) {
	b, err := Read("reasons.md")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range reasonRow.FindAllStringSubmatch(string(b), -1) {
		out = append(out, m[1])
	}
	return out, nil
}
