package controller

import (
	"context"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/gateway"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// The suite's operator starts without the Gateway API CRDs (BeforeSuite installs config/crd
// only); the first spec installs them while it runs, and the others use them.
var _ = Describe("Gateway API", Ordered, func() {
	var gw client.Client // knows the Gateway API and CRD kinds, which the suite's client does not

	BeforeAll(func() {
		s := runtime.NewScheme()
		Expect(clientgoscheme.AddToScheme(s)).To(Succeed())
		Expect(tsv1alpha1.AddToScheme(s)).To(Succeed())
		Expect(gatewayv1.Install(s)).To(Succeed())
		Expect(apiextensionsv1.AddToScheme(s)).To(Succeed())
		var err error
		gw, err = client.New(cfg, client.Options{Scheme: s})
		Expect(err).NotTo(HaveOccurred())
	})

	class := func(name string, controller gatewayv1.GatewayController, ref *gatewayv1.ParametersReference) *gatewayv1.GatewayClass {
		gc := &gatewayv1.GatewayClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       gatewayv1.GatewayClassSpec{ControllerName: controller, ParametersRef: ref},
		}
		Expect(gw.Create(ctx, gc)).To(Succeed())
		DeferCleanup(gw.Delete, ctx, gc)
		return gc
	}
	condition := func(name, typ string) func(g Gomega) *metav1.Condition {
		return func(g Gomega) *metav1.Condition {
			gc := &gatewayv1.GatewayClass{}
			g.Expect(gw.Get(ctx, client.ObjectKey{Name: name}, gc)).To(Succeed())
			c := meta.FindStatusCondition(gc.Status.Conditions, typ)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.ObservedGeneration).To(Equal(gc.Generation))
			return c
		}
	}
	proxyClassRef := func(name string) *gatewayv1.ParametersReference {
		return &gatewayv1.ParametersReference{Group: "tailscale.com", Kind: "ProxyClass", Name: name}
	}

	It("runs without the Gateway API CRDs and serves GatewayClasses once they are installed, without a restart", func() {
		err := gw.Get(ctx, client.ObjectKey{Name: gateway.GatewayClassCRD}, &apiextensionsv1.CustomResourceDefinition{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the operator must have started without the CRD; got %v", err)

		Expect(cp.InstallCRDs(filepath.Join("..", "..", "config", "gateway-api"))).To(Succeed())
		// The sample class, as users apply it.
		b, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "gateway-api", "gatewayclass.yaml"))
		Expect(err).NotTo(HaveOccurred())
		gc := &gatewayv1.GatewayClass{}
		Expect(yaml.Unmarshal(b, gc)).To(Succeed())
		Expect(gc.Spec.ControllerName).To(Equal(gateway.ControllerName))
		Expect(gw.Create(ctx, gc)).To(Succeed())
		DeferCleanup(gw.Delete, ctx, gc)
		Eventually(condition(gc.Name, "Accepted")).WithTimeout(30 * time.Second).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonGatewayClassAccepted)))
		Expect(condition(gc.Name, "SupportedVersion")(Default)).To(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonSupportedVersion),
			HaveField("Message", ContainSubstring("v1.6.3"))))
		got := &gatewayv1.GatewayClass{}
		Expect(gw.Get(ctx, client.ObjectKeyFromObject(gc), got)).To(Succeed())
		Expect(got.Status.SupportedFeatures).To(BeEmpty(), "no Gateway is served yet")
		Expect(got.Status.Conditions).To(HaveLen(2))
	})

	It("serves GatewayClasses in an operator started with the CRDs installed", func() {
		// A second operator, of the Gateway API controllers alone, counting its own passes.
		s := runtime.NewScheme()
		Expect(clientgoscheme.AddToScheme(s)).To(Succeed())
		Expect(tsv1alpha1.AddToScheme(s)).To(Succeed())
		mgr, err := ctrl.NewManager(cfg, ctrl.Options{
			Scheme:         s,
			Metrics:        metricsserver.Options{BindAddress: "0"},
			MapperProvider: kit.MapperProvider,
			// Its controllers have the names of the suite's operator's.
			Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		})
		Expect(err).NotTo(HaveOccurred())
		m := &kit.OperatorMetrics{
			Outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outcomes"}, []string{"controller", "reason"}),
			Memories: map[string]*kit.EventMemory{},
		}
		Expect(gateway.Setup(mgr, m.Reporter(mgr.GetEventRecorder("second-operator"), "gatewayclass"))).To(Succeed())
		mctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- mgr.Start(mctx) }()
		DeferCleanup(func() {
			stop()
			Eventually(done).Should(Receive(BeNil()))
		})
		class("gw-second", gateway.ControllerName, nil)
		Eventually(func() float64 {
			return testutil.ToFloat64(m.Outcomes.WithLabelValues("gatewayclass", kit.OutcomeReconciled))
		}).Should(BeNumerically(">=", 1))
	})

	It("rejects a missing ProxyClass with InvalidParameters and a Warning, and accepts the class once it exists", func() {
		gc := class("gw-missing-pc", gateway.ControllerName, proxyClassRef("gw-pc"))
		Eventually(condition(gc.Name, "Accepted")).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonInvalidParameters),
			HaveField("Message", ContainSubstring(`ProxyClass "gw-pc" does not exist`))))
		Eventually(func(g Gomega) []string { return eventMessages(g, "GatewayClass", gc.Name) }).Should(
			ContainElement(ContainSubstring(kit.ReasonInvalidParameters + `: ProxyClass "gw-pc" does not exist`)))
		Expect(eventTypes(Default, "GatewayClass", gc.Name)).To(HaveEach(corev1.EventTypeWarning))

		pc := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "gw-pc"}}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		Eventually(condition(gc.Name, "Accepted")).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonGatewayClassAccepted)))

		// The class follows its ProxyClass: one that becomes invalid is not ready.
		before := pc.DeepCopy()
		pc.Spec.StatefulSet = &tsv1alpha1.StatefulSet{Labels: map[string]string{"bad key!": "x"}}
		Expect(k8s.Patch(ctx, pc, client.MergeFrom(before))).To(Succeed())
		Eventually(condition(gc.Name, "Accepted")).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonInvalidParameters),
			HaveField("Message", ContainSubstring(`ProxyClass "gw-pc" is not ready`))))
	})

	DescribeTable("rejects a parametersRef that is not a ProxyClass",
		func(name string, ref *gatewayv1.ParametersReference, msg string) {
			gc := class(name, gateway.ControllerName, ref)
			Eventually(condition(gc.Name, "Accepted")).Should(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonInvalidParameters),
				HaveField("Message", ContainSubstring(msg))))
			Eventually(func(g Gomega) []string { return eventReasons(g, "GatewayClass", gc.Name) }).Should(
				ContainElement(kit.ReasonInvalidParameters))
			// No hot loop: the class, rejected, is not reconciled again until something changes.
			passes := reconciles("gatewayclass")
			Consistently(func() float64 { return reconciles("gatewayclass") }, "2s").Should(Equal(passes))
			// The Warning stands once: passes over a new generation that find the same problem
			// emit nothing more.
			n := len(events(Default, "GatewayClass", gc.Name))
			for _, d := range []string{"one", "two", "three"} {
				before := gc.DeepCopy()
				gc.Spec.Description = ptr.To(d)
				Expect(gw.Patch(ctx, gc, client.MergeFrom(before))).To(Succeed())
				Eventually(condition(gc.Name, "Accepted")).Should(HaveField("ObservedGeneration", gc.Generation))
			}
			Consistently(func(g Gomega) []eventsv1.Event { return events(g, "GatewayClass", gc.Name) }, "2s").Should(HaveLen(n))
		},
		Entry("another kind", "gw-configmap", &gatewayv1.ParametersReference{Group: "", Kind: "ConfigMap", Name: "params", Namespace: ptr.To[gatewayv1.Namespace]("default")},
			"parametersRef names a ConfigMap"),
		Entry("a ProxyClass with a namespace", "gw-namespaced", &gatewayv1.ParametersReference{Group: "tailscale.com", Kind: "ProxyClass", Name: "x", Namespace: ptr.To[gatewayv1.Namespace]("default")},
			"a ProxyClass is cluster-scoped"),
	)

	It("never touches another controller's class", func() {
		other := class("gw-other", "example.com/gateway-controller", proxyClassRef("does-not-exist"))
		ours := class("gw-ours", gateway.ControllerName, nil)
		// Once a class of ours created after it is accepted, the other one has been seen.
		Eventually(condition(ours.Name, "Accepted")).Should(HaveField("Status", metav1.ConditionTrue))
		Consistently(func(g Gomega) {
			gc := &gatewayv1.GatewayClass{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(other), gc)).To(Succeed())
			// As the API server defaulted it: Accepted Unknown, Pending.
			g.Expect(gc.Status.Conditions).To(HaveExactElements(And(
				HaveField("Type", "Accepted"), HaveField("Status", metav1.ConditionUnknown), HaveField("Reason", "Pending"))))
			g.Expect(gc.Finalizers).To(BeEmpty())
			g.Expect(events(g, "GatewayClass", other.Name)).To(BeEmpty())
		}).WithTimeout(3 * time.Second).Should(Succeed())
	})

	It("is allowed by its ClusterRole to watch the GatewayClass CRD and no other", func() {
		b, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		role := &rbacv1.ClusterRole{}
		Expect(yaml.Unmarshal(b, role)).To(Succeed())
		role.Name = "gw-rbac-operator"
		Expect(k8s.Create(ctx, role)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, role)
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "gw-rbac-operator"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "gw-rbac-operator"}},
		}
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, binding)
		userCfg, err := cp.AddUser("gw-rbac-operator")
		Expect(err).NotTo(HaveOccurred())
		as, err := client.NewWithWatch(userCfg, client.Options{Scheme: gw.Scheme()})
		Expect(err).NotTo(HaveOccurred())

		byName := client.MatchingFields{"metadata.name": gateway.GatewayClassCRD}
		Eventually(func(g Gomega) {
			crds := &apiextensionsv1.CustomResourceDefinitionList{}
			g.Expect(as.List(ctx, crds, byName)).To(Succeed())
			g.Expect(crds.Items).To(HaveLen(1))
		}).Should(Succeed(), "RBAC bindings take effect after a moment")
		w, err := as.Watch(ctx, &apiextensionsv1.CustomResourceDefinitionList{}, byName)
		Expect(err).NotTo(HaveOccurred())
		w.Stop()

		err = as.List(ctx, &apiextensionsv1.CustomResourceDefinitionList{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "listing every CRD: want Forbidden, got %v", err)
		err = as.List(ctx, &apiextensionsv1.CustomResourceDefinitionList{}, client.MatchingFields{"metadata.name": "gateways.gateway.networking.k8s.io"})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "listing another CRD: want Forbidden, got %v", err)

		// What the GatewayClass reconciler does with classes.
		Expect(as.List(ctx, &gatewayv1.GatewayClassList{})).To(Succeed())
		gc := class("gw-rbac", "example.com/gateway-controller", nil)
		before := gc.DeepCopy()
		gc.Status.Conditions = []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse, Reason: "Pending", Message: "rbac check", LastTransitionTime: metav1.Now()}}
		Expect(as.Status().Patch(ctx, gc, client.MergeFrom(before))).To(Succeed())
		err = as.Update(ctx, gc)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "updating a class: want Forbidden, got %v", err)
	})
})

func eventTypes(g Gomega, kind, name string) []string {
	var types []string
	for _, e := range events(g, kind, name) {
		types = append(types, e.Type)
	}
	return types
}
