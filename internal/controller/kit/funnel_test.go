package kit

import (
	"strings"
	"testing"
)

func TestParseFunnel(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		allowed     bool
		on          bool
		reason      string
	}{
		{"no annotation", nil, true, false, ""},
		{"on", map[string]string{AnnotationFunnel: "true"}, true, true, ""},
		{"off", map[string]string{AnnotationFunnel: "false"}, true, false, ""},
		{"off in a namespace kept off Funnel", map[string]string{AnnotationFunnel: "false"}, false, false, ""},
		{"on in a namespace kept off Funnel", map[string]string{AnnotationFunnel: "1"}, false, false, ReasonFunnelNamespaceNotPermitted},
		{"not a boolean", map[string]string{AnnotationFunnel: "yes please"}, true, false, ReasonInvalidAnnotation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			on, f := ParseFunnel(tt.annotations, "Gateway", "shop", tt.allowed)
			if on != tt.on {
				t.Errorf("on = %v, want %v", on, tt.on)
			}
			switch {
			case tt.reason == "" && f != nil:
				t.Errorf("finding %+v, want none", *f)
			case tt.reason != "" && (f == nil || f.Reason != tt.reason || !f.Warning):
				t.Errorf("finding %+v, want a Warning %s", f, tt.reason)
			case f != nil && !strings.Contains(f.Message, AnnotationFunnel):
				t.Errorf("message %q does not name the annotation", f.Message)
			}
		})
	}
}
