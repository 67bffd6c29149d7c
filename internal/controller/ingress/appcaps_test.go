package ingress

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
)

func TestAcceptAppCapsAnnotation(t *testing.T) {
	services := map[string]*corev1.Service{"web": kubeobj.Service("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80})}
	for _, tc := range []struct {
		value       string
		want        []string
		wantInvalid []string // named in the finding
	}{
		{value: "example.com/cap/admin", want: []string{"example.com/cap/admin"}},
		{value: " example.com/cap/mon, example.com/cap/admin ,example.com/cap/mon,", want: []string{"example.com/cap/admin", "example.com/cap/mon"}},
		{value: ""},
		{value: "admin,example.com/cap/admin,tailscale.com/cap/kubernetes,example.com/", want: []string{"example.com/cap/admin"},
			wantInvalid: []string{`"admin"`, `"tailscale.com/cap/kubernetes"`, `"example.com/"`}},
	} {
		ing := &networkingv1.Ingress{
			ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "default", Annotations: map[string]string{kit.AnnotationAcceptAppCaps: tc.value}},
			Spec:       networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", "http"))},
		}
		ws, findings := BuildWebService(ing, RouteInputs{Services: services})
		if !slices.Equal(ws.AcceptAppCaps, tc.want) {
			t.Errorf("%q: capabilities %q, want %q", tc.value, ws.AcceptAppCaps, tc.want)
		}
		if len(tc.wantInvalid) == 0 {
			if len(findings) != 0 {
				t.Errorf("%q: findings %+v, want none", tc.value, findings)
			}
			continue
		}
		if len(findings) != 1 || findings[0].Reason != kit.ReasonInvalidAnnotation || !findings[0].Warning {
			t.Fatalf("%q: findings %+v, want one Warning %s", tc.value, findings, kit.ReasonInvalidAnnotation)
		}
		for _, name := range tc.wantInvalid {
			if !strings.Contains(findings[0].Message, name) {
				t.Errorf("%q: finding %q does not name %s", tc.value, findings[0].Message, name)
			}
		}
		if ws.Routes == nil {
			t.Errorf("%q: an invalid capability stopped the routes", tc.value)
		}
	}
}
