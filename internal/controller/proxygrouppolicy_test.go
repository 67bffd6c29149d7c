package controller

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

var _ = Describe("ProxyGroupPolicy", func() {
	It("keeps a namespace's Ingresses and Services to the ProxyGroups its policies list, and follows a change of them", func() {
		pg := newProxyGroup("pgp-group", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "pgp-web", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "pgp-group"}
		})
		svc := newService(ns, "db", func(s *corev1.Service) { s.Annotations = map[string]string{kit.AnnotationProxyGroup: "pgp-group"} })
		served := func(name string) func(g Gomega) bool {
			return func(g Gomega) bool {
				serve, dnat := groupDocuments(g, "pgp-group")
				_, web := serve.Services[name]
				_, l3 := dnat.Services[name]
				return web || l3
			}
		}
		By("serving both while the namespace has no policy")
		Eventually(served("svc:pgp-web")).Should(BeTrue())
		Eventually(served("svc:" + ns + "-db")).Should(BeTrue())

		By("refusing a new object on the group once a policy lists only another, and leaving what it served as it was")
		policy := &tsv1alpha1.ProxyGroupPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "edge-only"},
			Spec: tsv1alpha1.ProxyGroupPolicySpec{Ingress: []string{"edge"}}}
		Expect(k8s.Create(ctx, policy)).To(Succeed())
		late := newIngress(ns, "pgp-late", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "pgp-group"}
		})
		for _, i := range []*networkingv1.Ingress{ing, late} {
			Eventually(func(g Gomega) []string { return ingressEvents(g, i) }).Should(ContainElement(kit.ReasonProxyGroupNotPermitted), i.Name)
		}
		Eventually(serviceCondition(svc, kit.ConditionIngressSvcValid)).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyGroupNotPermitted),
			HaveField("Message", ContainSubstring(`ProxyGroup "pgp-group" is not among those the ProxyGroupPolicies of namespace `+ns+` let its Ingresses and Services use: edge`))))
		Consistently(func(g Gomega) {
			g.Expect(served("svc:pgp-late")(g)).To(BeFalse(), "the new Ingress is not put on the group")
			g.Expect(served("svc:pgp-web")(g)).To(BeTrue(), "what was served is left as it was")
		}, 2*time.Second).Should(Succeed())

		By("serving them again once a policy lists their group")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
		policy.Spec.Ingress = append(policy.Spec.Ingress, "pgp-group")
		Expect(k8s.Update(ctx, policy)).To(Succeed())
		Eventually(served("svc:pgp-late")).Should(BeTrue())
		Eventually(serviceCondition(svc, kit.ConditionIngressSvcValid)).Should(HaveField("Status", metav1.ConditionTrue))
	})
})
