package controller

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestHAServiceStatus(t *testing.T) {
	valid := func() haServiceOutcome { o := haServiceOutcome{}; o.valid(); return o }
	configured := valid()
	configured.configured(1, 2, "db.tailnet.test", []string{"100.100.0.1"}, nil)
	waiting := valid()
	waiting.configured(0, 2, "db.tailnet.test", []string{"100.100.0.1"}, []string{"db-1: IPv6 disabled"})
	outage := haServiceOutcome{}
	outage.failed(ReasonIngressSvcCreateFailed, "503")
	invalid := haServiceOutcome{}
	invalid.invalid(ReasonDuplicateHostname, "taken")
	full := valid()
	full.failed(ReasonConfigMapFull, "full")

	// A Service that was served: both conditions True and addresses in its status.
	served := configured.status(corev1.ServiceStatus{}, 1, true)
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
		outcome haServiceOutcome
		from    corev1.ServiceStatus
		want    want
	}{
		"configured":              {configured, corev1.ServiceStatus{}, want{"True/" + ReasonIngressSvcValid, "True/" + ReasonIngressSvcConfigured, 2}},
		"no replica advertises":   {waiting, served, want{"True/" + ReasonIngressSvcValid, "False/" + ReasonIngressSvcNoBackends, 0}},
		"invalid":                 {invalid, served, want{"False/" + ReasonDuplicateHostname, "False/" + ReasonDuplicateHostname, 0}},
		"group full":              {full, corev1.ServiceStatus{}, want{"True/" + ReasonIngressSvcValid, "False/" + ReasonConfigMapFull, 0}},
		"outage leaves validity":  {outage, served, want{"True/" + ReasonIngressSvcValid, "False/" + ReasonIngressSvcCreateFailed, 0}},
		"outage on a new Service": {outage, corev1.ServiceStatus{}, want{"", "False/" + ReasonIngressSvcCreateFailed, 0}},
		"nothing decided":         {haServiceOutcome{}, served, want{"True/" + ReasonIngressSvcValid, "True/" + ReasonIngressSvcConfigured, 2}},
	} {
		t.Run(name, func(t *testing.T) {
			st := c.outcome.status(c.from, 2, true)
			got := want{show(meta.FindStatusCondition(st.Conditions, ConditionIngressSvcValid)),
				show(meta.FindStatusCondition(st.Conditions, ConditionIngressSvcConfigured)), len(st.LoadBalancer.Ingress)}
			if got != c.want {
				t.Errorf("status %+v, want %+v", got, c.want)
			}
		})
	}
	if st := configured.status(corev1.ServiceStatus{}, 1, false); len(st.LoadBalancer.Ingress) != 0 {
		t.Errorf("a ClusterIP Service got load-balancer addresses %v", st.LoadBalancer.Ingress)
	}
	if st := served; st.LoadBalancer.Ingress[0].Hostname != "db.tailnet.test" || st.LoadBalancer.Ingress[1].IP != "100.100.0.1" {
		t.Errorf("load balancer %v", st.LoadBalancer.Ingress)
	}
}

func TestDecideHAService(t *testing.T) {
	service := func(mutate func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", Annotations: map[string]string{AnnotationProxyGroup: "pg"}},
			Spec: corev1.ServiceSpec{ClusterIP: "10.0.0.5", ClusterIPs: []string{"10.0.0.5"}}}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	missing := blockf(ReasonProxyGroupNotFound, "ProxyGroup %q does not exist", "pg")
	for name, c := range map[string]struct {
		scope   haServiceScope
		reasons []string
	}{
		"served":         {haServiceScope{svc: service(nil), hostname: "ns-db"}, nil},
		"group missing":  {haServiceScope{svc: service(nil), hostname: "ns-db", groupFinding: &missing}, []string{ReasonProxyGroupNotFound}},
		"hostname taken": {haServiceScope{svc: service(nil), hostname: "ns-db", takenBy: "other/db"}, []string{ReasonDuplicateHostname}},
		"headless":       {haServiceScope{svc: service(func(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }), hostname: "ns-db"}, []string{ReasonInvalidService}},
		"bad tag and missing": {haServiceScope{svc: service(func(s *corev1.Service) { s.Annotations[AnnotationTags] = "k8s" }), hostname: "ns-db", groupFinding: &missing},
			[]string{ReasonInvalidAnnotation, ReasonProxyGroupNotFound}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, findings := decideHAService(c.scope, Settings{DefaultTags: []string{"tag:k8s"}})
			var reasons []string
			for _, f := range findings {
				reasons = append(reasons, f.reason)
				if !f.blocking {
					t.Errorf("%s does not block", f.reason)
				}
			}
			if !slices.Equal(reasons, c.reasons) {
				t.Errorf("findings %v, want %v", reasons, c.reasons)
			}
			if len(c.reasons) == 0 && (cfg == nil || cfg.Forward == nil || !slices.Equal(cfg.Forward.IPs, []string{"10.0.0.5"})) {
				t.Errorf("config %+v, want forwarding to the ClusterIP", cfg)
			}
		})
	}
}

// Replicas that cannot install the Service's rules are named in the Configured message.
func TestHAServiceStatusNamesReplicasWithoutRules(t *testing.T) {
	o := haServiceOutcome{}
	o.valid()
	o.configured(1, 2, "db.tailnet.test", []string{"100.100.0.1"}, []string{"db-1: IPv6 disabled"})
	c := meta.FindStatusCondition(o.status(corev1.ServiceStatus{}, 1, true).Conditions, ConditionIngressSvcConfigured)
	if c == nil || c.Message != "1/2 proxy replicas ready and advertising; DNAT rules not in place on db-1: IPv6 disabled" {
		t.Fatalf("Configured %+v", c)
	}
}
