package ingress

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
)

func TestFunnelKeptToAllowedNamespaces(t *testing.T) {
	services := map[string]*corev1.Service{"web": kubeobj.Service("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80})}
	for _, tc := range []struct {
		name       string
		annotation string
		denied     bool
		wantFunnel bool
		reasons    []string
	}{
		{name: "asked, namespace allowed", annotation: "true", wantFunnel: true},
		{name: "asked, namespace denied", annotation: "true", denied: true, reasons: []string{kit.ReasonFunnelNamespaceNotPermitted}},
		{name: "off, namespace denied", annotation: "false", denied: true},
		{name: "not a boolean, namespace denied", annotation: "yes please", denied: true, reasons: []string{kit.ReasonInvalidAnnotation}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ing := &networkingv1.Ingress{
				ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "team-a", Annotations: map[string]string{kit.AnnotationFunnel: tc.annotation}},
				Spec:       networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", "http"))},
			}
			ws, findings := BuildWebService(ing, RouteInputs{Services: services, FunnelDenied: tc.denied})
			var reasons []string
			for _, f := range findings {
				reasons = append(reasons, f.Reason)
			}
			if ws.Funnel != tc.wantFunnel || !slices.Equal(reasons, tc.reasons) {
				t.Errorf("funnel %v, findings %v; want %v, %v", ws.Funnel, reasons, tc.wantFunnel, tc.reasons)
			}
		})
	}
}

func TestFunnelAllowed(t *testing.T) {
	every, none, listed := kit.Settings{}, kit.Settings{FunnelNamespaces: []string{}}, kit.Settings{FunnelNamespaces: []string{"public"}}
	for _, tc := range []struct {
		s    kit.Settings
		ns   string
		want bool
	}{
		{every, "any", true}, {none, "public", false}, {listed, "public", true}, {listed, "team-a", false},
	} {
		if got := tc.s.FunnelAllowed(tc.ns); got != tc.want {
			t.Errorf("%v.FunnelAllowed(%q) = %v, want %v", tc.s.FunnelNamespaces, tc.ns, got, tc.want)
		}
	}
}
