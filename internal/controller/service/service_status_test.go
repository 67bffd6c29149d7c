package service

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func TestServiceStatus(t *testing.T) {
	svc := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.0.0.5", ClusterIPs: []string{"10.0.0.5"}}}
	ready := proxytest.AppliedState("db.tailnet.test", []string{"100.64.0.1"}, "")
	broken := proxytest.AppliedState("db.tailnet.test", nil, "no nftables")
	partial := proxytest.AppliedState("db.tailnet.test", []string{"100.64.0.1"}, "")
	partial.Firewall.Mappings[contract.StandaloneMapping] = contract.AppliedDNAT{TailnetIPs: []string{"100.64.0.1"}, FamilyErrors: map[string]string{contract.FamilyIPv6: "disabled"}}
	forwardingOff := proxytest.AppliedState("db.tailnet.test", []string{"100.64.0.1"}, "")
	forwardingOff.Firewall.Families = map[string]contract.FamilyProblem{contract.FamilyIPv4: {Reason: contract.FamilyForwardingOff, Message: "ip_forward=0"}}
	refusedPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ts-db-0"}, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "SysctlForbidden", Message: "net.ipv4.ip_forward"}}
	served := proxyOutcome(svc, &ready, nil).status(corev1.ServiceStatus{}, 1, true)

	for name, c := range map[string]struct {
		state   *contract.ProxyState
		pod     *corev1.Pod
		reason  string
		lb      int
		warning string
	}{
		"not joined":      {nil, nil, kit.ReasonProxyPending, 0, ""},
		"ready":           {&ready, nil, kit.ReasonProxyReady, 2, ""},
		"rules failed":    {&broken, nil, kit.ReasonProxyFailed, 0, kit.ReasonProxyFailed},
		"one family left": {&partial, nil, kit.ReasonProxyReady, 2, kit.ReasonIPFamilyNotForwarded},
		"forwarding off":  {&forwardingOff, nil, kit.ReasonIPForwardingDisabled, 0, kit.ReasonIPForwardingDisabled},
		"pod refused":     {&ready, refusedPod, kit.ReasonProxyFailed, 0, kit.ReasonProxyFailed},
	} {
		t.Run(name, func(t *testing.T) {
			o := proxyOutcome(svc, c.state, c.pod)
			st := o.status(served, 2, true)
			cond := meta.FindStatusCondition(st.Conditions, kit.ConditionProxyReady)
			if cond == nil || cond.Reason != c.reason || (cond.Status == metav1.ConditionTrue) != (c.reason == kit.ReasonProxyReady) || cond.ObservedGeneration != 2 {
				t.Errorf("condition %+v, want reason %s", cond, c.reason)
			}
			if len(st.LoadBalancer.Ingress) != c.lb {
				t.Errorf("load balancer %v, want %d entries", st.LoadBalancer.Ingress, c.lb)
			}
			if got := ""; o.warning != nil {
				got = o.warning.Reason
				if got != c.warning {
					t.Errorf("warning %s, want %s", got, c.warning)
				}
			} else if c.warning != "" {
				t.Errorf("no warning, want %s", c.warning)
			}
		})
	}
	if st := (serviceOutcome{}).status(served, 2, true); meta.FindStatusCondition(st.Conditions, kit.ConditionProxyReady).Reason != kit.ReasonProxyReady || len(st.LoadBalancer.Ingress) != 2 {
		t.Errorf("an undecided pass changed the status: %+v", st)
	}
	if st := proxyOutcome(svc, &ready, nil).status(corev1.ServiceStatus{}, 1, false); len(st.LoadBalancer.Ingress) != 0 {
		t.Errorf("a ClusterIP Service got load-balancer addresses %v", st.LoadBalancer.Ingress)
	}
}
