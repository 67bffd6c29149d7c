package groupstore

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

// An object's own status and finalizer writes bring no pass; anything else does.
func TestOwnWrites(t *testing.T) {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web", ResourceVersion: "1",
		Annotations: map[string]string{kit.AnnotationProxyGroup: "pg"}, Finalizers: []string{"other"}},
		Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("tailscale")}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "db", ResourceVersion: "1",
		Annotations: map[string]string{kit.AnnotationProxyGroup: "pg"}}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP}}
	for _, tc := range []struct {
		name      string
		old       client.Object
		change    func(client.Object)
		finalizer string
		want      bool
	}{
		{"Ingress status", ing, func(o client.Object) {
			o.(*networkingv1.Ingress).Status.LoadBalancer.Ingress = []networkingv1.IngressLoadBalancerIngress{{Hostname: "web.ts.net"}}
		}, FinalizerIngressPG, false},
		{"Ingress finalizer added", ing, func(o client.Object) { o.SetFinalizers(append(o.GetFinalizers(), FinalizerIngressPG)) }, FinalizerIngressPG, false},
		{"Ingress other finalizer added", ing, func(o client.Object) { o.SetFinalizers(append(o.GetFinalizers(), "x")) }, FinalizerIngressPG, true},
		{"Ingress finalizer removed", ing, func(o client.Object) { o.SetFinalizers(nil) }, FinalizerIngressPG, true},
		{"Ingress spec", ing, func(o client.Object) { o.(*networkingv1.Ingress).Spec.IngressClassName = ptr.To("other") }, FinalizerIngressPG, true},
		{"Ingress annotation", ing, func(o client.Object) { o.SetAnnotations(map[string]string{kit.AnnotationProxyGroup: "pg2"}) }, FinalizerIngressPG, true},
		{"Ingress deleted", ing, func(o client.Object) { o.SetDeletionTimestamp(&metav1.Time{}) }, FinalizerIngressPG, true},
		{"Service status", svc, func(o client.Object) {
			o.(*corev1.Service).Status.Conditions = []metav1.Condition{{Type: kit.ConditionIngressSvcConfigured, Status: metav1.ConditionTrue}}
		}, FinalizerServicePG, false},
		{"Service finalizer added", svc, func(o client.Object) { o.SetFinalizers([]string{FinalizerServicePG}) }, FinalizerServicePG, false},
		{"Service spec", svc, func(o client.Object) { o.(*corev1.Service).Spec.Type = corev1.ServiceTypeLoadBalancer }, FinalizerServicePG, true},
		{"Service label", svc, func(o client.Object) { o.SetLabels(map[string]string{"a": "b"}) }, FinalizerServicePG, true},
	} {
		cur := tc.old.DeepCopyObject().(client.Object)
		tc.change(cur)
		cur.SetResourceVersion("2")
		if got := OwnWrites(tc.finalizer).Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: reconciled %v, want %v", tc.name, got, tc.want)
		}
	}
}
