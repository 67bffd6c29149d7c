package kit

import (
	"strings"
	"testing"
)

func TestUnsupportedAnnotations(t *testing.T) {
	honoured := []string{AnnotationFunnel, AnnotationTags}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        []string // named in the finding; none: no finding
	}{
		{"none", nil, nil},
		{"honoured and foreign ones", map[string]string{AnnotationFunnel: "true", "example.com/x": "y", "kubectl.kubernetes.io/last-applied-configuration": "{}"}, nil},
		{"the original's, not ours", map[string]string{"tailscale.com/experimental-forward-cluster-traffic-via-ingress": "true", AnnotationTags: "tag:a"},
			[]string{"tailscale.com/experimental-forward-cluster-traffic-via-ingress"}},
		{"typos, sorted", map[string]string{"tailscale.com/tag": "tag:a", "tailscale.com/funel": "true"}, []string{"tailscale.com/funel, tailscale.com/tag"}},
	} {
		f := UnsupportedAnnotations("Ingress", tc.annotations, honoured...)
		if len(tc.want) == 0 {
			if f != nil {
				t.Errorf("%s: %+v, want no finding", tc.name, *f)
			}
			continue
		}
		if f == nil || f.Reason != ReasonUnsupportedAnnotation || !f.Warning || f.Blocking {
			t.Fatalf("%s: %+v, want a non-blocking Warning %s", tc.name, f, ReasonUnsupportedAnnotation)
		}
		for _, w := range append(tc.want, AnnotationFunnel, "Ingress") {
			if !strings.Contains(f.Message, w) {
				t.Errorf("%s: %q does not name %s", tc.name, f.Message, w)
			}
		}
	}
}
