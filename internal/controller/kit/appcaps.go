package kit

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tsingress/tsingress/internal/contract"
)

// ParseAcceptAppCaps parses the app capabilities annotation (an Ingress's or a Gateway's): the
// valid names, sorted, and a finding naming those left out.
func ParseAcceptAppCaps(v string) ([]string, *Finding) {
	var caps, invalid []string
	for c := range strings.SplitSeq(v, ",") {
		switch c = strings.TrimSpace(c); {
		case c == "":
		case contract.ValidAppCapability(c):
			caps = append(caps, c)
		default:
			invalid = append(invalid, strconv.Quote(c))
		}
	}
	slices.Sort(caps)
	caps = slices.Compact(caps)
	if len(invalid) > 0 {
		f := Warnf(ReasonInvalidAnnotation, "annotation %s: %s: not app capability names (a domain and a path, "+
			"e.g. example.com/cap/admin, not under tailscale.com/); not passed to backends", AnnotationAcceptAppCaps, strings.Join(invalid, ", "))
		return caps, &f
	}
	return caps, nil
}
