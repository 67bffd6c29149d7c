package service

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

func TestHAServiceStatus(t *testing.T) {
	valid := func() HAServiceOutcome { o := HAServiceOutcome{}; o.Valid(); return o }
	configured := valid()
	configured.Configured(1, 2, "db.tailnet.test", []string{"100.100.0.1"}, nil)
	waiting := valid()
	waiting.Configured(0, 2, "db.tailnet.test", []string{"100.100.0.1"}, []string{"db-1: IPv6 disabled"})
	outage := HAServiceOutcome{}
	outage.Failed(kit.ReasonIngressSvcCreateFailed, "503")
	invalid := HAServiceOutcome{}
	invalid.Invalid(kit.ReasonDuplicateHostname, "taken")
	full := valid()
	full.Failed(kit.ReasonConfigMapFull, "full")

	// A Service that was served: both conditions True and addresses in its status.
	served := configured.Status(corev1.ServiceStatus{}, 1, true)
	type want struct {
		valid, configured string // "True/Reason", "False/Reason", or "" for absent
		lb                int
	}
	show := func(c *metav1.Condition) string {
		if c == nil {
			return ""
		}
		return string(c.Status) + "/" + c.Reason
	}
	for name, c := range map[string]struct {
		outcome HAServiceOutcome
		from    corev1.ServiceStatus
		want    want
	}{
		"configured":              {configured, corev1.ServiceStatus{}, want{"True/" + kit.ReasonIngressSvcValid, "True/" + kit.ReasonIngressSvcConfigured, 1}},
		"no replica advertises":   {waiting, served, want{"True/" + kit.ReasonIngressSvcValid, "False/" + kit.ReasonIngressSvcNoBackends, 0}},
		"invalid":                 {invalid, served, want{"False/" + kit.ReasonDuplicateHostname, "False/" + kit.ReasonDuplicateHostname, 0}},
		"group full":              {full, corev1.ServiceStatus{}, want{"True/" + kit.ReasonIngressSvcValid, "False/" + kit.ReasonConfigMapFull, 0}},
		"outage leaves validity":  {outage, served, want{"True/" + kit.ReasonIngressSvcValid, "False/" + kit.ReasonIngressSvcCreateFailed, 0}},
		"outage on a new Service": {outage, corev1.ServiceStatus{}, want{"", "False/" + kit.ReasonIngressSvcCreateFailed, 0}},
		"nothing decided":         {HAServiceOutcome{}, served, want{"True/" + kit.ReasonIngressSvcValid, "True/" + kit.ReasonIngressSvcConfigured, 1}},
	} {
		t.Run(name, func(t *testing.T) {
			st := c.outcome.Status(c.from, 2, true)
			got := want{show(meta.FindStatusCondition(st.Conditions, kit.ConditionIngressSvcValid)),
				show(meta.FindStatusCondition(st.Conditions, kit.ConditionIngressSvcConfigured)), len(st.LoadBalancer.Ingress)}
			if got != c.want {
				t.Errorf("status %+v, want %+v", got, c.want)
			}
		})
	}
	if st := configured.Status(corev1.ServiceStatus{}, 1, false); len(st.LoadBalancer.Ingress) != 0 {
		t.Errorf("a ClusterIP Service got load-balancer addresses %v", st.LoadBalancer.Ingress)
	}
	vip := ptr.To(corev1.LoadBalancerIPModeVIP)
	if got, want := served.LoadBalancer.Ingress, []corev1.LoadBalancerIngress{{Hostname: "db.tailnet.test", IP: "100.100.0.1", IPMode: vip}}; !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("load balancer %v, want the name and the address in one entry, as the original writes it", got)
	}
	// Dual-stack: IPv4 in the first entry whatever order the addresses came in, IPv6 after it.
	dual := valid()
	dual.Configured(1, 2, "db.tailnet.test", []string{"fd7a:115c:a1e0::1", "100.100.0.1"}, nil)
	wantDual := []corev1.LoadBalancerIngress{{Hostname: "db.tailnet.test", IP: "100.100.0.1", IPMode: vip}, {IP: "fd7a:115c:a1e0::1", IPMode: vip}}
	if got := dual.Status(corev1.ServiceStatus{}, 1, true).LoadBalancer.Ingress; !equality.Semantic.DeepEqual(got, wantDual) {
		t.Errorf("dual-stack load balancer %v, want %v", got, wantDual)
	}
}

func TestDecideHAService(t *testing.T) {
	service := func(mutate func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", Annotations: map[string]string{kit.AnnotationProxyGroup: "pg"}},
			Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.5", ClusterIPs: []string{"10.0.0.5"}}}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	missing := kit.Blockf(kit.ReasonProxyGroupNotFound, "ProxyGroup %q does not exist", "pg")
	for name, c := range map[string]struct {
		scope   HAServiceScope
		reasons []string
	}{
		"served":         {HAServiceScope{Svc: service(nil), Hostname: "ns-db"}, nil},
		"group missing":  {HAServiceScope{Svc: service(nil), Hostname: "ns-db", GroupFinding: &missing}, []string{kit.ReasonProxyGroupNotFound}},
		"hostname taken": {HAServiceScope{Svc: service(nil), Hostname: "ns-db", TakenBy: "other/db"}, []string{kit.ReasonDuplicateHostname}},
		"headless":       {HAServiceScope{Svc: service(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }), Hostname: "ns-db"}, []string{kit.ReasonInvalidService}},
		"bad tag and missing": {HAServiceScope{Svc: service(func(s *corev1.Service) { s.Annotations[kit.AnnotationTags] = "k8s" }), Hostname: "ns-db", GroupFinding: &missing},
			[]string{kit.ReasonInvalidAnnotation, kit.ReasonProxyGroupNotFound}},
		"PROXY protocol over TCP": {HAServiceScope{Svc: service(func(s *corev1.Service) {
			s.Annotations[kit.AnnotationProxyProtocol] = "v2"
			s.Spec.Ports = []corev1.ServicePort{{Port: 5432, Protocol: corev1.ProtocolTCP}}
		}), Hostname: "ns-db"}, nil},
		"PROXY protocol over UDP": {HAServiceScope{Svc: service(func(s *corev1.Service) {
			s.Annotations[kit.AnnotationProxyProtocol] = "v2"
			s.Spec.Ports = []corev1.ServicePort{{Port: 53, Protocol: corev1.ProtocolTCP}, {Port: 53, Protocol: corev1.ProtocolUDP}}
		}), Hostname: "ns-db"}, []string{kit.ReasonInvalidAnnotation}},
		// Named, and served all the same.
		"an annotation not honoured": {HAServiceScope{Svc: service(func(s *corev1.Service) { s.Annotations["tailscale.com/tailnet-fqdn"] = "db.example.ts.net" }), Hostname: "ns-db"},
			[]string{kit.ReasonUnsupportedAnnotation}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, findings := DecideHAService(c.scope, kit.Settings{DefaultTags: []string{"tag:k8s"}})
			var reasons []string
			for _, f := range findings {
				reasons = append(reasons, f.Reason)
				if f.Blocking == (f.Reason == kit.ReasonUnsupportedAnnotation) {
					t.Errorf("%s: blocking %v", f.Reason, f.Blocking)
				}
			}
			if !slices.Equal(reasons, c.reasons) {
				t.Errorf("findings %v, want %v", reasons, c.reasons)
			}
			if !kit.HasBlocking(findings) && (cfg == nil || cfg.Forward == nil || !slices.Equal(cfg.Forward.IPs, []string{"10.0.0.5"})) {
				t.Errorf("config %+v, want forwarding to the ClusterIP", cfg)
			}
		})
	}
}

// Replicas that cannot install the Service's rules are named in the Configured message.
func TestHAServiceStatusNamesReplicasWithoutRules(t *testing.T) {
	o := HAServiceOutcome{}
	o.Valid()
	o.Configured(1, 2, "db.tailnet.test", []string{"100.100.0.1"}, []string{"db-1: IPv6 disabled"})
	c := meta.FindStatusCondition(o.Status(corev1.ServiceStatus{}, 1, true).Conditions, kit.ConditionIngressSvcConfigured)
	if c == nil || c.Message != "1/2 proxy replicas ready and advertising; DNAT rules not in place on db-1: IPv6 disabled" {
		t.Fatalf("Configured %+v", c)
	}
}
