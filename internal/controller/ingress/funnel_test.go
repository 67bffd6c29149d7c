package ingress

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
)

func TestFunnelAnnotation(t *testing.T) {
	services := map[string]*corev1.Service{"web": kubeobj.Service("web", "10.96.0.10", corev1.ServicePort{Name: "http", Port: 80})}
	for value, want := range map[string]struct {
		funnel  bool
		finding string
	}{
		"true": {funnel: true}, "false": {}, "": {finding: kit.ReasonInvalidAnnotation}, "yes": {finding: kit.ReasonInvalidAnnotation},
	} {
		ing := &networkingv1.Ingress{
			ObjectMeta: metav1.ObjectMeta{Name: "i", Namespace: "default", Annotations: map[string]string{kit.AnnotationFunnel: value}},
			Spec:       networkingv1.IngressSpec{DefaultBackend: ptr.To(kubeobj.Backend("web", "http"))},
		}
		ws, findings := BuildWebService(ing, RouteInputs{Services: services})
		var got string
		for _, f := range findings {
			got = f.Reason
		}
		if ws.Funnel != want.funnel || got != want.finding {
			t.Errorf("%s=%q: funnel %v, finding %q; want %v, %q", kit.AnnotationFunnel, value, ws.Funnel, got, want.funnel, want.finding)
		}
	}
}

func TestFunnelOutcome(t *testing.T) {
	const name = "web.tailnet.test"
	denied := &contract.ProxyState{Funnel: map[string]contract.FunnelStatus{name: {Reason: contract.FunnelNotPermitted, Message: "no attr"}}}
	public := &contract.ProxyState{Funnel: map[string]contract.FunnelStatus{name: {Public: true}}}
	other := &contract.ProxyState{Funnel: map[string]contract.FunnelStatus{"api.tailnet.test": {Public: true}}}
	for _, tc := range []struct {
		name       string
		states     []*contract.ProxyState
		wantPublic bool
		wantReason string
	}{
		{"nothing reported yet (an older proxy, or no Pod)", []*contract.ProxyState{nil, {}}, false, ""},
		{"denied", []*contract.ProxyState{denied, nil}, false, contract.FunnelNotPermitted},
		{"one replica serves it: public", []*contract.ProxyState{denied, public}, true, ""},
		{"another name's status does not count", []*contract.ProxyState{other}, false, ""},
	} {
		public, problem := funnelOutcome(name, tc.states)
		if public != tc.wantPublic || problem.Reason != tc.wantReason {
			t.Errorf("%s: public %v, problem %+v; want %v, %q", tc.name, public, problem, tc.wantPublic, tc.wantReason)
		}
	}
}

func TestSetPortError(t *testing.T) {
	cert := "CertificateIssuanceFailed"
	lb := []networkingv1.IngressLoadBalancerIngress{
		{Hostname: "web.tailnet.test", Ports: httpsPorts(true)},
		{Hostname: "app.example.com", Ports: httpsPorts(false)},
		{Hostname: "held.tailnet.test", Ports: []networkingv1.IngressPortStatus{{Port: 443, Error: &cert}}},
	}
	setPortError(lb, "web.tailnet.test", kit.ReasonFunnelNotPermitted)
	setPortError(lb, "held.tailnet.test", kit.ReasonFunnelNotPermitted)
	if e := lb[0].Ports[0].Error; e == nil || *e != kit.ReasonFunnelNotPermitted || lb[0].Ports[1].Error != nil {
		t.Errorf("web: %+v", lb[0].Ports)
	}
	if lb[1].Ports[0].Error != nil {
		t.Errorf("another host got the error: %+v", lb[1].Ports)
	}
	if *lb[2].Ports[0].Error != cert {
		t.Errorf("a certificate error was replaced: %q", *lb[2].Ports[0].Error)
	}
}
