package kit

import (
	"fmt"
	"slices"
	"strings"
)

// Finding is a problem (or notice) met while deciding what to serve, reported as an Event. A
// blocking finding stops the object from being served as it stands (what serves it already is
// left alone); another leaves out only what it is about (a route, a custom host).
type Finding struct {
	Warning  bool
	Blocking bool
	Reason   string
	Message  string
}

func Warnf(reason, format string, a ...any) Finding {
	return Finding{Warning: true, Reason: reason, Message: fmt.Sprintf(format, a...)}
}

func Blockf(reason, format string, a ...any) Finding {
	f := Warnf(reason, format, a...)
	f.Blocking = true
	return f
}

// HasBlocking reports whether a finding stops an object from being served.
func HasBlocking(fs []Finding) bool {
	return slices.ContainsFunc(fs, func(f Finding) bool { return f.Blocking })
}

// FirstBlocking is the first finding that stops an object from being served.
func FirstBlocking(fs []Finding) Finding {
	i := slices.IndexFunc(fs, func(f Finding) bool { return f.Blocking })
	return fs[i]
}

func TruncateLabel(s string) string {
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-")
}
