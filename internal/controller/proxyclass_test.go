package controller

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

var _ = Describe("ProxyClass reconciler", func() {
	readyCondition := func(name string) func(g Gomega) *metav1.Condition {
		return func(g Gomega) *metav1.Condition {
			pc := &tsv1alpha1.ProxyClass{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, pc)).To(Succeed())
			c := meta.FindStatusCondition(pc.Status.Conditions, tsv1alpha1.ProxyClassReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.ObservedGeneration).To(Equal(pc.Generation))
			return c
		}
	}

	It("marks a valid ProxyClass ready, and an invalid one not ready with an Event", func() {
		pc := &tsv1alpha1.ProxyClass{
			ObjectMeta: metav1.ObjectMeta{Name: "pc-valid"},
			Spec: tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{
				Labels: map[string]string{"team": "platform"},
			}},
		}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		Eventually(readyCondition("pc-valid")).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonProxyClassValid)))

		// An edit that breaks it is seen at the new generation.
		before := pc.DeepCopy()
		pc.Spec.StatefulSet.Labels = map[string]string{"bad key!": "x"}
		Expect(k8s.Patch(ctx, pc, client.MergeFrom(before))).To(Succeed())
		Eventually(readyCondition("pc-valid")).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", kit.ReasonProxyClassInvalid),
			HaveField("Message", ContainSubstring(`statefulSet.labels: key "bad key!"`))))
		Eventually(func(g Gomega) {
			g.Expect(eventReasons(g, "ProxyClass", "pc-valid")).To(ContainElement(kit.ReasonProxyClassInvalid))
		}).Should(Succeed())
	})

	It("warns of staticEndpoints, which it accepts and does not serve", func() {
		pc := &tsv1alpha1.ProxyClass{
			ObjectMeta: metav1.ObjectMeta{Name: "pc-static"},
			Spec: tsv1alpha1.ProxyClassSpec{StaticEndpoints: &tsv1alpha1.StaticEndpointsConfig{NodePort: &tsv1alpha1.NodePortConfig{
				Ports: []tsv1alpha1.PortRange{{Port: 30100, EndPort: 30110}}, Selector: map[string]string{"pool": "edge"}}}},
		}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		Eventually(readyCondition("pc-static")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(func(g Gomega) []string { return eventReasons(g, "ProxyClass", "pc-static") }).Should(ContainElement(kit.ReasonProxyClassFieldIgnored))
	})

	It("refuses a ServiceMonitor while the ServiceMonitor CRD is missing", func() {
		pc := &tsv1alpha1.ProxyClass{
			ObjectMeta: metav1.ObjectMeta{Name: "pc-sm"},
			Spec: tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{
				Enable: true, ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true},
			}},
		}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		Eventually(readyCondition("pc-sm")).Should(And(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Message", ContainSubstring("ServiceMonitor CRD"))))
	})

	It("warns about TS_ env overrides but stays valid", func() {
		pc := &tsv1alpha1.ProxyClass{
			ObjectMeta: metav1.ObjectMeta{Name: "pc-env"},
			Spec: tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{
				TailscaleContainer: &tsv1alpha1.Container{Env: []tsv1alpha1.Env{{Name: "TS_DEBUG", Value: "1"}}},
			}}},
		}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		Eventually(readyCondition("pc-env")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(func(g Gomega) {
			g.Expect(eventReasons(g, "ProxyClass", "pc-env")).To(ContainElement(kit.ReasonCustomTSEnvVar))
		}).Should(Succeed())
	})
})

// events lists the events.k8s.io Events about an object.
func events(g Gomega, kind, name string) []eventsv1.Event {
	list := &eventsv1.EventList{}
	g.Expect(k8s.List(ctx, list)).To(Succeed())
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

func eventReasons(g Gomega, kind, name string) []string {
	var reasons []string
	for _, e := range events(g, kind, name) {
		reasons = append(reasons, e.Reason)
	}
	return reasons
}

func eventMessages(g Gomega, kind, name string) []string {
	var msgs []string
	for _, e := range events(g, kind, name) {
		msgs = append(msgs, e.Reason+": "+e.Note)
	}
	return msgs
}
