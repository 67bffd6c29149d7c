package controller

import (
	"fmt"
	"slices"
	"strings"
)

// finding is a problem (or notice) met while deciding what to serve, reported as an Event. A
// blocking finding stops the object from being served as it stands (what serves it already is
// left alone); another leaves out only what it is about (a route, a custom host).
type finding struct {
	warning  bool
	blocking bool
	reason   string
	message  string
}

func warnf(reason, format string, a ...any) finding {
	return finding{warning: true, reason: reason, message: fmt.Sprintf(format, a...)}
}

func blockf(reason, format string, a ...any) finding {
	f := warnf(reason, format, a...)
	f.blocking = true
	return f
}

// hasBlocking reports whether a finding stops an object from being served.
func hasBlocking(fs []finding) bool {
	return slices.ContainsFunc(fs, func(f finding) bool { return f.blocking })
}

// firstBlocking is the first finding that stops an object from being served.
func firstBlocking(fs []finding) finding {
	i := slices.IndexFunc(fs, func(f finding) bool { return f.blocking })
	return fs[i]
}

func truncateLabel(s string) string {
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-")
}
