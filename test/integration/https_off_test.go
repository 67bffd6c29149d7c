package integration

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/poll"
)

// On a tailnet without HTTPS the operator says so on the Ingress (and still creates the proxy,
// which serves as soon as HTTPS is turned on).
func TestIngressOnTailnetWithoutHTTPS(t *testing.T) {
	w := startWorldWith(t, localtailnet.Options{}, contract.FirewallAuto)
	ns := "nohttps"
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := w.k8s.Create(w.ctx, loopbackService(ns, "web", 8080)); err != nil {
		t.Fatal(err)
	}
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
		Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("tailscale"), DefaultBackend: &networkingv1.IngressBackend{
			Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Name: "http"}}}},
	}
	if err := w.k8s.Create(w.ctx, ing); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, "HTTPSNotEnabled Event", func() error {
		list := &eventsv1.EventList{}
		if err := w.k8s.List(w.ctx, list); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.Name == "plain" && e.Reason == kit.ReasonHTTPSNotEnabled && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("%d events, none HTTPSNotEnabled for the Ingress", len(list.Items))
	})
}
