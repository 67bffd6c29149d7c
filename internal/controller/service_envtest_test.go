package controller

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/service"
)

var _ = Describe("Service status ownership", func() {
	It("lets the standalone and HA Service reconcilers each write only their own conditions, from stale reads too", func() {
		// Served by neither reconciler, so only this spec writes its status.
		svc := newService(newNamespace(), "shared", func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil; s.Spec.Type = corev1.ServiceTypeClusterIP })
		staleHA, staleStandalone := svc.DeepCopy(), svc.DeepCopy()
		cond := func(typ string, ok bool, reason string) corev1.ServiceStatus {
			st := corev1.ServiceStatus{}
			kit.SetCondition(&st.Conditions, typ, ok, reason, "m", 1)
			return st
		}
		types := func() []string {
			got := &corev1.Service{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
			var out []string
			for _, c := range got.Status.Conditions {
				out = append(out, c.Type+"="+c.Reason)
			}
			return out
		}

		Expect(kit.PatchServiceStatus(ctx, k8s, staleHA, service.HAServiceOwned, cond(kit.ConditionIngressSvcValid, true, kit.ReasonIngressSvcValid))).To(Succeed())
		// The standalone reconciler's copy predates that write, and its wanted status carries a
		// condition it does not own: neither touches the HA reconciler's.
		want := cond(kit.ConditionProxyReady, false, kit.ReasonProxyPending)
		kit.SetCondition(&want.Conditions, kit.ConditionIngressSvcConfigured, false, kit.ReasonConfigMapFull, "not mine", 1)
		Expect(kit.PatchServiceStatus(ctx, k8s, staleStandalone, service.ServiceOwned, want)).To(Succeed())
		Expect(types()).To(ConsistOf(kit.ConditionIngressSvcValid+"="+kit.ReasonIngressSvcValid, kit.ConditionProxyReady+"="+kit.ReasonProxyPending))

		// The HA reconciler, from its own stale copy, replaces its condition and adds another.
		st := cond(kit.ConditionIngressSvcValid, false, kit.ReasonDuplicateHostname)
		kit.SetCondition(&st.Conditions, kit.ConditionIngressSvcConfigured, false, kit.ReasonDuplicateHostname, "m", 1)
		Expect(kit.PatchServiceStatus(ctx, k8s, staleHA, service.HAServiceOwned, st)).To(Succeed())
		Expect(types()).To(ConsistOf(kit.ConditionIngressSvcValid+"="+kit.ReasonDuplicateHostname, kit.ConditionIngressSvcConfigured+"="+kit.ReasonDuplicateHostname,
			kit.ConditionProxyReady+"="+kit.ReasonProxyPending))

		// Clearing the standalone reconciler's status leaves the HA reconciler's.
		Expect(kit.ClearServiceStatus(ctx, k8s, staleStandalone, service.ServiceOwned)).To(Succeed())
		Expect(types()).To(ConsistOf(kit.ConditionIngressSvcValid+"="+kit.ReasonDuplicateHostname, kit.ConditionIngressSvcConfigured+"="+kit.ReasonDuplicateHostname))
	})
})
