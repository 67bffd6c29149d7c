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

// UnsupportedAnnotations is a Warning naming, sorted, the tailscale.com/ annotations of an
// object of kind that are not among those honoured on it, or nil when there are none.
func UnsupportedAnnotations(kind string, annotations map[string]string, honoured ...string) *Finding {
	var unknown []string
	for k := range annotations {
		if strings.HasPrefix(k, "tailscale.com/") && !slices.Contains(honoured, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	f := Warnf(ReasonUnsupportedAnnotation, "annotations %s are not honoured on a %s by this operator and have no effect; it honours %s",
		strings.Join(unknown, ", "), kind, strings.Join(honoured, ", "))
	return &f
}

func TruncateLabel(s string) string {
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-")
}
