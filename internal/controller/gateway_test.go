package controller

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
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
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/gateway"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
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
		Expect(gateway.Setup(mgr, m.Reporter(mgr.GetEventRecorder("second-operator"), "gatewayclass"), nil)).To(Succeed())
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

		// What the Gateway and HTTPRoute reconcilers do: read Gateways, routes and grants,
		// patch Gateways (the finalizer) and both statuses; nothing more.
		for _, l := range []client.ObjectList{&gatewayv1.GatewayList{}, &gatewayv1.HTTPRouteList{}, &gatewayv1.ReferenceGrantList{}} {
			Expect(as.List(ctx, l)).To(Succeed())
		}
		ns := newNamespace()
		edge := kubeobj.Gateway(ns, "edge", "gw-rbac", kubeobj.Listener("https", gatewayv1.HTTPSProtocolType, 443))
		Expect(gw.Create(ctx, edge)).To(Succeed())
		DeferCleanup(gw.Delete, ctx, edge)
		gwBefore := edge.DeepCopy()
		edge.Annotations = map[string]string{"rbac": "check"}
		Expect(as.Patch(ctx, edge, client.MergeFrom(gwBefore))).To(Succeed())
		gwBefore = edge.DeepCopy()
		edge.Status.Conditions = []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse, Reason: "Pending", Message: "rbac check", LastTransitionTime: metav1.Now()}}
		Expect(as.Status().Patch(ctx, edge, client.MergeFrom(gwBefore))).To(Succeed())
		err = as.Update(ctx, edge)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "updating a Gateway: want Forbidden, got %v", err)
		err = as.Create(ctx, kubeobj.HTTPRoute(ns, "r", "edge"))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "creating an HTTPRoute: want Forbidden, got %v", err)
		route := kubeobj.HTTPRoute(ns, "r", "edge")
		Expect(gw.Create(ctx, route)).To(Succeed())
		routeBefore := route.DeepCopy()
		route.Status.Parents = []gatewayv1.RouteParentStatus{{ParentRef: route.Spec.ParentRefs[0], ControllerName: gateway.ControllerName,
			Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionFalse, Reason: "Pending", Message: "rbac check", LastTransitionTime: metav1.Now()}}}}
		Expect(as.Status().Patch(ctx, route, client.MergeFrom(routeBefore))).To(Succeed())
		err = as.Patch(ctx, route, client.MergeFrom(routeBefore))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "patching an HTTPRoute: want Forbidden, got %v", err)
	})

	// Gateways and HTTPRoutes, on a class of this operator created for each spec.
	gatewayCondition := func(obj *gatewayv1.Gateway, typ string) func(g Gomega) *metav1.Condition {
		return func(g Gomega) *metav1.Condition {
			got := &gatewayv1.Gateway{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
			c := meta.FindStatusCondition(got.Status.Conditions, typ)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.ObservedGeneration).To(Equal(got.Generation))
			return c
		}
	}
	listenerStatus := func(obj *gatewayv1.Gateway, name string) func(g Gomega) gatewayv1.ListenerStatus {
		return func(g Gomega) gatewayv1.ListenerStatus {
			got := &gatewayv1.Gateway{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
			i := slices.IndexFunc(got.Status.Listeners, func(l gatewayv1.ListenerStatus) bool { return string(l.Name) == name })
			g.Expect(i).To(BeNumerically(">=", 0), "listener %s in the status", name)
			return got.Status.Listeners[i]
		}
	}
	listenerCondition := func(obj *gatewayv1.Gateway, name, typ string) func(g Gomega) *metav1.Condition {
		return func(g Gomega) *metav1.Condition {
			c := meta.FindStatusCondition(listenerStatus(obj, name)(g).Conditions, typ)
			g.Expect(c).NotTo(BeNil())
			return c
		}
	}
	// routeCondition is a condition of this controller's entry for the first parentRef of an
	// HTTPRoute or GRPCRoute.
	routeCondition := func(route client.Object, typ string) func(g Gomega) *metav1.Condition {
		return func(g Gomega) *metav1.Condition {
			got := route.DeepCopyObject().(client.Object)
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(route), got)).To(Succeed())
			var spec gatewayv1.CommonRouteSpec
			var status gatewayv1.RouteStatus
			switch r := got.(type) {
			case *gatewayv1.HTTPRoute:
				spec, status = r.Spec.CommonRouteSpec, r.Status.RouteStatus
			case *gatewayv1.GRPCRoute:
				spec, status = r.Spec.CommonRouteSpec, r.Status.RouteStatus
			}
			i := slices.IndexFunc(status.Parents, func(p gatewayv1.RouteParentStatus) bool {
				return p.ControllerName == gateway.ControllerName && reflect.DeepEqual(p.ParentRef, spec.ParentRefs[0])
			})
			g.Expect(i).To(BeNumerically(">=", 0), "an entry of this controller in the route's status")
			c := meta.FindStatusCondition(status.Parents[i].Conditions, typ)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.ObservedGeneration).To(Equal(got.GetGeneration()))
			return c
		}
	}
	create := func(objs ...client.Object) {
		for _, o := range objs {
			Expect(gw.Create(ctx, o)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(gw.Delete(ctx, o))).To(Succeed()) })
		}
	}
	servedRoutes := func(obj client.Object) func(g Gomega) []contract.Route {
		return func(g Gomega) []contract.Route { return proxyConfigOf(g, proxies.ParentTypeGateway, obj).Serve.Routes }
	}
	// quiet checks that nothing is reconciled again while nothing changes: no hot loop. The
	// passes the spec's changes cause (the proxy's children appearing) end first.
	quiet := func() {
		passes := func() []float64 {
			return []float64{reconciles("gateway"), reconciles("httproute"), reconciles("grpcroute")}
		}
		var last []float64
		Eventually(func() bool {
			p := passes()
			settled := slices.Equal(p, last)
			last = p
			return settled
		}).WithPolling(time.Second).Should(BeTrue())
		Consistently(passes, "2s").Should(Equal(last))
	}
	warned := func(kind, name, reason string) {
		Eventually(func(g Gomega) []eventsv1.Event { return events(g, kind, name) }).Should(ContainElement(And(
			HaveField("Reason", reason), HaveField("Type", corev1.EventTypeWarning))), "a Warning %s on %s %s", reason, kind, name)
	}
	// annotate patches a Gateway's annotation (value "" removes it).
	annotate := func(obj *gatewayv1.Gateway, key, value string) {
		got := &gatewayv1.Gateway{}
		Expect(gw.Get(ctx, client.ObjectKeyFromObject(obj), got)).To(Succeed())
		before := got.DeepCopy()
		if value == "" {
			delete(got.Annotations, key)
		} else {
			if got.Annotations == nil {
				got.Annotations = map[string]string{}
			}
			got.Annotations[key] = value
		}
		Expect(gw.Patch(ctx, got, client.MergeFrom(before))).To(Succeed())
	}
	https, http := kubeobj.Listener("https", gatewayv1.HTTPSProtocolType, 443), kubeobj.Listener("http", gatewayv1.HTTPProtocolType, 80)
	prefix, exact := gatewayv1.PathMatchPathPrefix, gatewayv1.PathMatchExact
	noRoutes := []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{Status: 404}}}

	It("serves a Gateway with an HTTPRoute on a standalone proxy, reports its addresses, and removes the proxy with the Gateway", func() {
		class("gw-serve", gateway.ControllerName, nil)
		ns := newNamespace()
		web := newBackendService(ns, "web")
		edge := kubeobj.Gateway(ns, "edge", "gw-serve", https, http)
		route := kubeobj.HTTPRoute(ns, "shop", "edge",
			kubeobj.HTTPRule(exact, "/metrics", "", "web", 8080), kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		create(edge, route)

		By("writing the proxy config with the route's rules, served on HTTPS and HTTP")
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{
			{Path: "/metrics", PathType: contract.PathExact, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":8080"}},
			{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}},
		}))
		cfg := proxyConfigOf(Default, proxies.ParentTypeGateway, edge)
		Expect(cfg.Hostname).To(Equal(ns + "-edge-gateway"))
		Expect(cfg.Serve.HTTP).To(Equal(contract.HTTPServe))
		Expect(cfg.AuthKey).NotTo(BeEmpty())
		Eventually(func() error { return k8s.Get(ctx, proxyKey(proxies.ParentTypeGateway, edge), &appsv1.StatefulSet{}) }).Should(Succeed())

		By("accepting the Gateway, its listeners and the route, and waiting for the proxy")
		Eventually(gatewayCondition(edge, "Accepted")).Should(HaveField("Reason", kit.ReasonGatewayClassAccepted))
		Eventually(gatewayCondition(edge, "Programmed")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonPending)))
		for _, l := range []string{"https", "http"} {
			Eventually(listenerStatus(edge, l)).Should(And(HaveField("AttachedRoutes", int32(1)),
				HaveField("SupportedKinds", ConsistOf(HaveField("Kind", gatewayv1.Kind("HTTPRoute")), HaveField("Kind", gatewayv1.Kind("GRPCRoute"))))))
			Expect(listenerCondition(edge, l, "Accepted")(Default)).To(HaveField("Status", metav1.ConditionTrue))
			Expect(listenerCondition(edge, l, "ResolvedRefs")(Default)).To(HaveField("Status", metav1.ConditionTrue))
			Expect(listenerCondition(edge, l, "Conflicted")(Default)).To(HaveField("Status", metav1.ConditionFalse))
		}
		Eventually(routeCondition(route, "Accepted")).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonGatewayClassAccepted)))
		Eventually(routeCondition(route, "ResolvedRefs")).Should(HaveField("Status", metav1.ConditionTrue))

		By("reporting the proxy's MagicDNS name and tailnet IPs once it serves")
		fqdn := ns + "-edge-gateway.tailnet.example"
		reportState(proxies.ParentTypeGateway, edge, contract.ProxyState{DeviceID: "n-gw", FQDN: fqdn,
			TailnetIPs: []string{"100.64.0.9", "fd7a:115c:a1e0::9"}, HTTPSEndpoint: fqdn})
		Eventually(gatewayCondition(edge, "Programmed")).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonProgrammed)))
		Eventually(func(g Gomega) []gatewayv1.GatewayStatusAddress {
			got := &gatewayv1.Gateway{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(edge), got)).To(Succeed())
			return got.Status.Addresses
		}).Should(Equal([]gatewayv1.GatewayStatusAddress{
			{Type: ptr.To(gatewayv1.HostnameAddressType), Value: fqdn},
			{Type: ptr.To(gatewayv1.IPAddressType), Value: "100.64.0.9"},
			{Type: ptr.To(gatewayv1.IPAddressType), Value: "fd7a:115c:a1e0::9"},
		}))
		Eventually(listenerCondition(edge, "https", "Programmed")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(normalEvents("Gateway", "edge")).Should(ContainElement(kit.ReasonServing))
		quiet()

		By("removing the proxy and this controller's route status with the Gateway")
		Expect(gw.Delete(ctx, edge)).To(Succeed())
		expectGone(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: proxyKey(proxies.ParentTypeGateway, edge).Name}})
		expectGone(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: secretKey(proxies.ParentTypeGateway, edge).Name}})
		Eventually(func() bool {
			return apierrors.IsNotFound(gw.Get(ctx, client.ObjectKeyFromObject(edge), &gatewayv1.Gateway{}))
		}).Should(BeTrue())
		Eventually(func(g Gomega) []gatewayv1.RouteParentStatus {
			got := &gatewayv1.HTTPRoute{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(route), got)).To(Succeed())
			return got.Status.Parents
		}).Should(BeEmpty())
	})

	It("passes the app capabilities a Gateway names to its backends, and names the annotations it does not honour", func() {
		class("gw-caps", gateway.ControllerName, nil)
		ns := newNamespace()
		newBackendService(ns, "web")
		edge := kubeobj.Gateway(ns, "caps", "gw-caps", https)
		edge.Annotations = map[string]string{
			kit.AnnotationAcceptAppCaps:  "example.com/cap/admin, not a cap, example.com/cap/read",
			kit.AnnotationHTTPRedirect:   "true",
			"tailscale.com/tailnet-fqdn": "x.example.ts.net",
		}
		create(edge, kubeobj.HTTPRoute(ns, "shop", "caps", kubeobj.HTTPRule(prefix, "/", "", "web", 80)))
		Eventually(func(g Gomega) []string {
			return proxyConfigOf(g, proxies.ParentTypeGateway, edge).Serve.AcceptAppCaps
		}).Should(Equal([]string{"example.com/cap/admin", "example.com/cap/read"}))
		warned("Gateway", "caps", kit.ReasonInvalidAnnotation)
		warned("Gateway", "caps", kit.ReasonUnsupportedAnnotation)
		Eventually(func(g Gomega) []eventsv1.Event { return events(g, "Gateway", "caps") }).Should(ContainElement(And(
			HaveField("Reason", kit.ReasonUnsupportedAnnotation),
			HaveField("Note", ContainSubstring("annotations tailscale.com/http-redirect, tailscale.com/tailnet-fqdn are not honoured")))))
	})

	It("serves a Gateway to the internet through Funnel when annotated, with a condition saying whether it is", func() {
		class("gw-funnel", gateway.ControllerName, nil)
		ns := newNamespace()
		newBackendService(ns, "web")
		edge := kubeobj.Gateway(ns, "public", "gw-funnel", https)
		edge.Annotations = map[string]string{kit.AnnotationFunnel: "true"}
		create(edge, kubeobj.HTTPRoute(ns, "shop", "public", kubeobj.HTTPRule(prefix, "/", "", "web", 80)))
		funnel := gatewayCondition(edge, "tailscale.com/Funnel")

		By("telling the proxy to serve Funnel, pending until it serves the name")
		Eventually(func(g Gomega) bool { return proxyConfigOf(g, proxies.ParentTypeGateway, edge).Serve.Funnel }).Should(BeTrue())
		Eventually(funnel).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonPending)))

		By("saying what the tailnet's policy lacks while the proxy reports Funnel refused")
		fqdn := ns + "-public-gateway.tailnet.example"
		state := contract.ProxyState{DeviceID: "n-funnel", FQDN: fqdn, HTTPSEndpoint: fqdn,
			Funnel: map[string]contract.FunnelStatus{fqdn: {Reason: contract.FunnelNotPermitted, Message: "Funnel not available"}}}
		reportState(proxies.ParentTypeGateway, edge, state)
		Eventually(funnel).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonFunnelNotPermitted),
			HaveField("Message", ContainSubstring(`{"target": ["tag:k8s"], "attr": ["funnel"]}`))))
		warned("Gateway", "public", kit.ReasonFunnelNotPermitted)

		By("reporting it public once the proxy takes Funnel connections")
		state.Funnel = map[string]contract.FunnelStatus{fqdn: {Public: true}}
		reportState(proxies.ParentTypeGateway, edge, state)
		Eventually(funnel).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonFunnelEnabled)))
		Eventually(normalEvents("Gateway", "public")).Should(ContainElement(kit.ReasonFunnelEnabled))

		By("refusing a value that is not a boolean, served on the tailnet only")
		annotate(edge, kit.AnnotationFunnel, "please")
		Eventually(func(g Gomega) bool { return proxyConfigOf(g, proxies.ParentTypeGateway, edge).Serve.Funnel }).Should(BeFalse())
		Eventually(funnel).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonInvalidAnnotation)))
		warned("Gateway", "public", kit.ReasonInvalidAnnotation)

		By("removing the condition with the annotation")
		annotate(edge, kit.AnnotationFunnel, "")
		Eventually(func(g Gomega) *metav1.Condition {
			got := &gatewayv1.Gateway{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(edge), got)).To(Succeed())
			return meta.FindStatusCondition(got.Status.Conditions, "tailscale.com/Funnel")
		}).Should(BeNil())
		quiet()
	})

	It("serves a rule whose Service is missing with an error, reports BackendNotFound, and routes to it once it exists", func() {
		class("gw-missing", gateway.ControllerName, nil)
		ns := newNamespace()
		web := newBackendService(ns, "web")
		edge := kubeobj.Gateway(ns, "edge", "gw-missing", https)
		route := kubeobj.HTTPRoute(ns, "api", "edge", kubeobj.HTTPRule(prefix, "/api", "", "api", 80), kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		create(edge, route)
		Eventually(routeCondition(route, "ResolvedRefs")).Should(And(HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", kit.ReasonBackendNotFound), HaveField("Message", ContainSubstring("Service "+ns+"/api does not exist"))))
		Expect(routeCondition(route, "Accepted")(Default)).To(HaveField("Status", metav1.ConditionTrue))
		// /api fails rather than fall through to /, another backend.
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{
			{Path: "/api", PathType: contract.PathPrefix, Backend: contract.Backend{Status: 500}},
			{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}},
		}))
		warned("HTTPRoute", "api", kit.ReasonBackendNotFound)
		quiet()

		api := newBackendService(ns, "api")
		Eventually(routeCondition(route, "ResolvedRefs")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(servedRoutes(edge)).Should(ContainElement(HaveField("Backend.URL", "http://"+api.Spec.ClusterIP+":80")))
	})

	It("refuses a backend in another namespace until a ReferenceGrant allows it", func() {
		class("gw-grant", gateway.ControllerName, nil)
		ns, other := newNamespace(), newNamespace()
		db := newBackendService(other, "db")
		edge := kubeobj.Gateway(ns, "edge", "gw-grant", https)
		route := kubeobj.HTTPRoute(ns, "cross", "edge", kubeobj.HTTPRule(prefix, "/", other, "db", 80))
		create(edge, route)
		Eventually(routeCondition(route, "ResolvedRefs")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonRefNotPermitted)))
		warned("HTTPRoute", "cross", kit.ReasonRefNotPermitted)
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{Status: 500}}}))
		quiet()

		create(&gatewayv1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "routes-to-db"}, Spec: gatewayv1.ReferenceGrantSpec{
			From: []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: gatewayv1.Namespace(ns)}},
			To:   []gatewayv1.ReferenceGrantTo{{Group: "", Kind: "Service", Name: ptr.To[gatewayv1.ObjectName]("db")}},
		}})
		Eventually(routeCondition(route, "ResolvedRefs")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{{Path: "/", PathType: contract.PathPrefix,
			Backend: contract.Backend{URL: "http://" + db.Spec.ClusterIP + ":80"}}}))
	})

	It("attaches the routes of the namespaces a listener selects, following their labels", func() {
		class("gw-selector", gateway.ControllerName, nil)
		ns, apps := newNamespace(), newNamespace()
		web := newBackendService(apps, "web")
		selecting := kubeobj.Listener("https", gatewayv1.HTTPSProtocolType, 443)
		selecting.AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr.To(gatewayv1.NamespacesFromSelector),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"gateway-access": "edge"}}}}
		edge := kubeobj.Gateway(ns, "edge", "gw-selector", selecting)
		route := kubeobj.HTTPRoute(apps, "shop", "edge", kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		route.Spec.ParentRefs[0].Namespace = ptr.To(gatewayv1.Namespace(ns))
		create(edge, route)
		Eventually(routeCondition(route, "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonNotAllowedByListeners)))
		Eventually(servedRoutes(edge)).Should(Equal(noRoutes))

		By("attaching it once its namespace has the label")
		labelNamespace := func(value string) {
			n := &corev1.Namespace{}
			Expect(k8s.Get(ctx, client.ObjectKey{Name: apps}, n)).To(Succeed())
			before := n.DeepCopy()
			n.Labels["gateway-access"] = value
			Expect(k8s.Patch(ctx, n, client.MergeFrom(before))).To(Succeed())
		}
		labelNamespace("edge")
		Eventually(routeCondition(route, "Accepted")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{{Path: "/", PathType: contract.PathPrefix,
			Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}}}))
		Eventually(listenerStatus(edge, "https")).Should(HaveField("AttachedRoutes", int32(1)))
		quiet()

		By("detaching it once the label no longer matches")
		labelNamespace("other")
		Eventually(routeCondition(route, "Accepted")).Should(HaveField("Reason", kit.ReasonNotAllowedByListeners))
		Eventually(servedRoutes(edge)).Should(Equal(noRoutes))
	})

	It("does not serve a route with a filter it cannot honour, and says so; serves a mirror", func() {
		class("gw-filter", gateway.ControllerName, nil)
		ns := newNamespace()
		web := newBackendService(ns, "web")
		edge := kubeobj.Gateway(ns, "edge", "gw-filter", https)
		rule := kubeobj.HTTPRule(prefix, "/", "", "web", 80)
		rule.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterExtensionRef,
			ExtensionRef: &gatewayv1.LocalObjectReference{Group: "example.com", Kind: "Filter", Name: "x"}}}
		route := kubeobj.HTTPRoute(ns, "filtered", "edge", rule)
		create(edge, route)
		Eventually(routeCondition(route, "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", kit.ReasonUnsupportedValue), HaveField("Message", ContainSubstring("filters (ExtensionRef)"))))
		warned("HTTPRoute", "filtered", kit.ReasonUnsupportedValue)
		Eventually(servedRoutes(edge)).Should(Equal(noRoutes))
		Eventually(listenerStatus(edge, "https")).Should(HaveField("AttachedRoutes", int32(0)))
		quiet()

		By("serving the route with a RequestMirror in its place, without it while its Service is missing")
		got := &gatewayv1.HTTPRoute{}
		Expect(gw.Get(ctx, client.ObjectKeyFromObject(route), got)).To(Succeed())
		before := got.DeepCopy()
		got.Spec.Rules[0].Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror,
			RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{BackendRef: gatewayv1.BackendObjectReference{Name: "shadow", Port: ptr.To[gatewayv1.PortNumber](80)},
				Percent: ptr.To[int32](10)}}}
		Expect(gw.Patch(ctx, got, client.MergeFrom(before))).To(Succeed())
		served := contract.Route{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}}
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{served}))
		Eventually(routeCondition(route, "ResolvedRefs")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonBackendNotFound)))
		Expect(routeCondition(route, "Accepted")(Default)).To(HaveField("Status", metav1.ConditionTrue))

		By("copying a tenth of its requests to the mirror's Service once it exists")
		shadow := newBackendService(ns, "shadow")
		served.Mirrors = []contract.Mirror{{Backend: contract.Backend{URL: "http://" + shadow.Spec.ClusterIP + ":80"}, Numerator: 10, Denominator: 100}}
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{served}))
		Eventually(routeCondition(route, "ResolvedRefs")).Should(HaveField("Status", metav1.ConditionTrue))
		quiet()
	})

	It("serves method, header and query matches, header modifiers and redirects, and refuses a modifier of an identity header", func() {
		class("gw-matches", gateway.ControllerName, nil)
		ns := newNamespace()
		web := newBackendService(ns, "web")
		edge := kubeobj.Gateway(ns, "edge", "gw-matches", https)
		rule := kubeobj.HTTPRule(prefix, "/api", "", "web", 80)
		rule.Matches[0].Method = ptr.To(gatewayv1.HTTPMethodPost)
		rule.Matches[0].Headers = []gatewayv1.HTTPHeaderMatch{{Name: "X-Env", Value: "canary"}}
		rule.Matches[0].QueryParams = []gatewayv1.HTTPQueryParamMatch{{Name: "v", Value: "2"}}
		rule.Filters = []gatewayv1.HTTPRouteFilter{
			{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
				Set: []gatewayv1.HTTPHeader{{Name: "X-Env", Value: "prod"}}}},
			{Type: gatewayv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{
				Remove: []string{"X-Backend-Version"}}},
		}
		route := kubeobj.HTTPRoute(ns, "narrow", "edge", rule)
		moved := kubeobj.HTTPRoute(ns, "moved", "edge", gatewayv1.HTTPRouteRule{
			Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(prefix), Value: ptr.To("/old")}}},
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
				Scheme: ptr.To("https"), Path: &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/new")}}}},
		})
		create(edge, moved, route) // moved first: the older route's rules come first
		Eventually(routeCondition(route, "Accepted")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(routeCondition(moved, "Accepted")).Should(HaveField("Status", metav1.ConditionTrue))
		movedRoute := contract.Route{Path: "/old", PathType: contract.PathPrefix, Redirect: &contract.Redirect{Scheme: "https", StatusCode: 302,
			Path: &contract.PathChange{Type: contract.PathChangePrefix, Value: "/new"}}}
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{movedRoute, {Path: "/api", PathType: contract.PathPrefix,
			Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}, Method: "POST",
			Headers:         []contract.NameValue{{Name: "X-Env", Value: "canary"}},
			Query:           []contract.NameValue{{Name: "v", Value: "2"}},
			RequestHeaders:  &contract.HeaderEdits{Set: []contract.NameValue{{Name: "X-Env", Value: "prod"}}},
			ResponseHeaders: &contract.HeaderEdits{Remove: []string{"X-Backend-Version"}},
		}}))

		before := route.DeepCopy()
		route.Spec.Rules[0].Filters[0].RequestHeaderModifier.Set = []gatewayv1.HTTPHeader{{Name: "Tailscale-User-Login", Value: "mallory@example.com"}}
		Expect(k8s.Patch(ctx, route, client.MergeFrom(before))).To(Succeed())
		Eventually(routeCondition(route, "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", kit.ReasonUnsupportedValue), HaveField("Message", ContainSubstring("Tailscale-User-Login"))))
		warned("HTTPRoute", "narrow", kit.ReasonUnsupportedValue)
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{movedRoute}))
		quiet()
	})

	It("reports a TLS listener as UnsupportedProtocol and serves the HTTPS one", func() {
		class("gw-tls", gateway.ControllerName, nil)
		ns := newNamespace()
		tls := kubeobj.Listener("passthrough", gatewayv1.TLSProtocolType, 8443)
		tls.TLS = &gatewayv1.ListenerTLSConfig{Mode: ptr.To(gatewayv1.TLSModePassthrough)}
		edge := kubeobj.Gateway(ns, "edge", "gw-tls", https, tls)
		create(edge)
		Eventually(listenerCondition(edge, "passthrough", "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", kit.ReasonUnsupportedProtocol)))
		Expect(listenerCondition(edge, "passthrough", "Programmed")(Default)).To(HaveField("Status", metav1.ConditionFalse))
		Expect(listenerCondition(edge, "https", "Accepted")(Default)).To(HaveField("Status", metav1.ConditionTrue))
		Expect(gatewayCondition(edge, "Accepted")(Default)).To(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonListenersNotValid)))
		warned("Gateway", "edge", kit.ReasonUnsupportedProtocol)
		Eventually(servedRoutes(edge)).Should(Equal(noRoutes))
		quiet()
	})

	It("serves plain HTTP listeners of any port and hostname as ports of their own routes, programmed once the proxy listens", func() {
		class("gw-ports", gateway.ControllerName, nil)
		ns := newNamespace()
		web := newBackendService(ns, "web")
		shop := kubeobj.Listener("shop", gatewayv1.HTTPProtocolType, 80)
		shop.Hostname = ptr.To[gatewayv1.Hostname]("*.example.com")
		edge := kubeobj.Gateway(ns, "edge", "gw-ports", shop, kubeobj.Listener("alt", gatewayv1.HTTPProtocolType, 8080))
		edge.Annotations = map[string]string{kit.AnnotationFunnel: "true"}
		onShop := kubeobj.HTTPRoute(ns, "shop", "edge", kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		onShop.Spec.ParentRefs[0].SectionName = ptr.To[gatewayv1.SectionName]("shop")
		onAlt := kubeobj.HTTPRoute(ns, "alt", "edge", kubeobj.HTTPRule(exact, "/api", "", "web", 8080))
		onAlt.Spec.ParentRefs[0].Port = ptr.To[gatewayv1.PortNumber](8080)
		create(edge, onShop, onAlt)

		By("writing a port per listener port, each with the routes attached to it and the listener's hostname")
		Eventually(func(g Gomega) []contract.WebPort {
			return proxyConfigOf(g, proxies.ParentTypeGateway, edge).Serve.Ports
		}).Should(Equal([]contract.WebPort{
			{Port: 80, Routes: []contract.Route{{Host: "*.example.com", Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}}}},
			{Port: 8080, Routes: []contract.Route{{Path: "/api", PathType: contract.PathExact, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":8080"}}}},
		}))
		cfg := proxyConfigOf(Default, proxies.ParentTypeGateway, edge)
		Expect(cfg.Serve.Routes).To(BeEmpty())
		Expect(cfg.Serve.Funnel).To(BeFalse(), "Funnel serves HTTPS on 443, which no listener is")
		warned("Gateway", "edge", kit.ReasonInvalidAnnotation)
		for _, l := range []string{"shop", "alt"} {
			Eventually(listenerStatus(edge, l)).Should(HaveField("AttachedRoutes", int32(1)))
		}

		By("programming it once the proxy listens on its ports, with no certificate to wait for")
		fqdn := ns + "-edge-gateway.tailnet.example"
		reportState(proxies.ParentTypeGateway, edge, contract.ProxyState{DeviceID: "n-gwp", FQDN: fqdn, TailnetIPs: []string{"100.64.0.10"}})
		Consistently(gatewayCondition(edge, "Programmed"), "1s").Should(HaveField("Status", metav1.ConditionFalse))
		reportState(proxies.ParentTypeGateway, edge, contract.ProxyState{DeviceID: "n-gwp", FQDN: fqdn, TailnetIPs: []string{"100.64.0.10"}, WebPorts: []int{80, 8080}})
		Eventually(gatewayCondition(edge, "Programmed")).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Message", "serving http://"+fqdn)))
		quiet()
	})

	It("serves an HTTPS listener's certificateRefs for its hostname, once the Secret resolves, and one of another namespace once a ReferenceGrant allows it", func() {
		class("gw-certs", gateway.ControllerName, nil)
		ns, other := newNamespace(), newNamespace()
		web := newBackendService(ns, "web")
		shop := kubeobj.Listener("shop", gatewayv1.HTTPSProtocolType, 443)
		shop.Hostname = ptr.To[gatewayv1.Hostname]("shop.example.com")
		shop.TLS = &gatewayv1.ListenerTLSConfig{CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "shop-tls"}}}
		edge := kubeobj.Gateway(ns, "edge", "gw-certs", https, shop)
		route := kubeobj.HTTPRoute(ns, "shop", "edge", kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		allowTLSSecrets(ns)
		create(edge, route)
		served := func(host string) contract.Route {
			return contract.Route{Host: host, Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}}
		}

		By("reporting a missing Secret as InvalidCertificateRef, serving the tailnet name alone")
		Eventually(listenerCondition(edge, "shop", "ResolvedRefs")).Should(And(HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", kit.ReasonInvalidCertificateRef), HaveField("Message", ContainSubstring("does not exist"))))
		Expect(listenerCondition(edge, "shop", "Accepted")(Default)).To(HaveField("Status", metav1.ConditionTrue))
		Expect(listenerCondition(edge, "shop", "Programmed")(Default)).To(HaveField("Status", metav1.ConditionFalse))
		warned("Gateway", "edge", kit.ReasonInvalidCertificateRef)
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{served("")}))
		By("deploying no proxy for a Gateway with nothing to serve until its certificate resolves")
		lone := kubeobj.Gateway(ns, "lone", "gw-certs", shop)
		onLone := kubeobj.HTTPRoute(ns, "lone", "lone", kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		create(lone, onLone)
		Eventually(listenerCondition(lone, "shop", "ResolvedRefs")).Should(HaveField("Reason", kit.ReasonInvalidCertificateRef))
		Eventually(listenerStatus(lone, "shop")).Should(HaveField("AttachedRoutes", int32(1)), "a route attaches to a listener whose certificate does not resolve")
		Consistently(func() error { return k8s.Get(ctx, secretKey(proxies.ParentTypeGateway, lone), &corev1.Secret{}) }, "2s").ShouldNot(Succeed())
		Expect(gatewayCondition(lone, "Programmed")(Default)).To(HaveField("Status", metav1.ConditionFalse))

		By("serving the certificate's copy for the listener's hostname once the Secret exists")
		now := time.Now()
		certPEM, keyPEM := proxytest.SelfSigned(GinkgoT(), []string{"shop.example.com"}, now.Add(-time.Hour), now.Add(30*24*time.Hour))
		create(tlsSecret(ns, "shop-tls", certPEM, keyPEM))
		copyName := certs.CertCopyName(proxies.ParentOf(proxies.ParentTypeGateway, edge).ProxyName(), ns, "shop-tls")
		Eventually(func(g Gomega) {
			cfg := proxyConfigOf(g, proxies.ParentTypeGateway, edge)
			g.Expect(cfg.Serve.TLS.Certificates).To(Equal([]contract.CertificateRef{{SecretName: copyName, Hosts: []string{"shop.example.com"}}}))
			g.Expect(cfg.Serve.Routes).To(Equal([]contract.Route{served(""), served("shop.example.com")}))
			cp := &corev1.Secret{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testSetup.Namespace, Name: copyName}, cp)).To(Succeed())
			g.Expect(cp.Data[corev1.TLSCertKey]).To(Equal(certPEM))
		}).Should(Succeed())
		Eventually(listenerCondition(edge, "shop", "ResolvedRefs")).Should(HaveField("Status", metav1.ConditionTrue))
		quiet()

		By("refusing a Secret of another namespace until a ReferenceGrant lets the Gateway use it")
		allowTLSSecrets(other)
		create(tlsSecret(other, "shared-tls", certPEM, keyPEM))
		got := &gatewayv1.Gateway{}
		Expect(gw.Get(ctx, client.ObjectKeyFromObject(edge), got)).To(Succeed())
		before := got.DeepCopy()
		got.Spec.Listeners[1].TLS.CertificateRefs = []gatewayv1.SecretObjectReference{{Name: "shared-tls", Namespace: ptr.To(gatewayv1.Namespace(other))}}
		Expect(gw.Patch(ctx, got, client.MergeFrom(before))).To(Succeed())
		Eventually(listenerCondition(edge, "shop", "ResolvedRefs")).Should(HaveField("Reason", kit.ReasonRefNotPermitted))
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{served("")}))
		create(&gatewayv1.ReferenceGrant{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "gateways-to-tls"}, Spec: gatewayv1.ReferenceGrantSpec{
			From: []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "Gateway", Namespace: gatewayv1.Namespace(ns)}},
			To:   []gatewayv1.ReferenceGrantTo{{Group: "", Kind: "Secret"}},
		}})
		Eventually(listenerCondition(edge, "shop", "ResolvedRefs")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(func(g Gomega) []contract.CertificateRef {
			return proxyConfigOf(g, proxies.ParentTypeGateway, edge).Serve.TLS.Certificates
		}).Should(Equal([]contract.CertificateRef{{SecretName: certs.CertCopyName(proxies.ParentOf(proxies.ParentTypeGateway, edge).ProxyName(), other, "shared-tls"),
			Hosts: []string{"shop.example.com"}}}))
		expectGone(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: copyName}})
	})

	It("serves a Gateway on a ProxyGroup as a Tailscale Service, refuses a missing group and a taken hostname, and moves it to a standalone proxy", func() {
		class("gw-ha", gateway.ControllerName, nil)
		pg := newProxyGroup("gw-pg", nil)
		DeferCleanup(k8s.Delete, ctx, pg)
		Eventually(func(g Gomega) { replicaConfig(g, "gw-pg", 1) }).Should(Succeed())
		ns := newNamespace()
		web := newBackendService(ns, "web")
		edge := kubeobj.Gateway(ns, "edge", "gw-ha", https, http)
		edge.Annotations = map[string]string{kit.AnnotationProxyGroup: "gw-pg"}
		route := kubeobj.HTTPRoute(ns, "shop", "edge", kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		create(edge, route)
		svcName := "svc:" + ns + "-edge-gateway"

		By("writing its routes into the group's Serve config, served on HTTPS and HTTP")
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "gw-pg")
			return serve.Services
		}).Should(HaveKeyWithValue(svcName, And(HaveField("HTTP", contract.HTTPServe), HaveField("Routes", Equal([]contract.Route{
			{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}}})))))
		ts, err := tailscaleService(svcName)
		Expect(err).NotTo(HaveOccurred())
		Expect(ts.Ports).To(Equal([]string{"tcp:443", "tcp:80"}))
		Expect(ts.Addrs).NotTo(BeEmpty())
		Expect(apierrors.IsNotFound(k8s.Get(ctx, proxyKey(proxies.ParentTypeGateway, edge), &appsv1.StatefulSet{}))).To(BeTrue(), "no standalone proxy")
		Eventually(gatewayCondition(edge, "Accepted")).Should(HaveField("Reason", kit.ReasonGatewayClassAccepted))
		Eventually(gatewayCondition(edge, "Programmed")).Should(HaveField("Reason", kit.ReasonPending))
		Eventually(routeCondition(route, "Accepted")).Should(HaveField("Status", metav1.ConditionTrue))

		By("reporting the Tailscale Service's name and VIPs once a replica advertises it")
		reportReplica("gw-pg", 1, contract.ProxyState{FQDN: "gw-pg-1.tailnet.test", Advertised: []string{svcName}})
		Eventually(gatewayCondition(edge, "Programmed")).Should(And(HaveField("Status", metav1.ConditionTrue),
			HaveField("Message", ContainSubstring("Tailscale Service "+svcName+" on ProxyGroup gw-pg"))))
		want := []gatewayv1.GatewayStatusAddress{{Type: ptr.To(gatewayv1.HostnameAddressType), Value: ns + "-edge-gateway.tailnet.test"}}
		for _, a := range ts.Addrs {
			want = append(want, gatewayv1.GatewayStatusAddress{Type: ptr.To(gatewayv1.IPAddressType), Value: a.String()})
		}
		Eventually(func(g Gomega) []gatewayv1.GatewayStatusAddress {
			got := &gatewayv1.Gateway{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(edge), got)).To(Succeed())
			return got.Status.Addresses
		}).Should(Equal(want))
		Eventually(listenerCondition(edge, "https", "Programmed")).Should(HaveField("Status", metav1.ConditionTrue))

		By("writing Funnel into its group entry once annotated, its condition waiting for the replicas to report it")
		annotate(edge, kit.AnnotationFunnel, "true")
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "gw-pg")
			return serve.Services
		}).Should(HaveKeyWithValue(svcName, HaveField("Funnel", true)))
		Eventually(gatewayCondition(edge, "tailscale.com/Funnel")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonPending)))
		annotate(edge, kit.AnnotationFunnel, "")
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "gw-pg")
			return serve.Services
		}).Should(HaveKeyWithValue(svcName, HaveField("Funnel", false)))

		By("refusing a second Gateway that asks for the same name on a group, and one on a missing group")
		twin := kubeobj.Gateway(ns, "twin", "gw-ha", https)
		twin.Annotations = map[string]string{kit.AnnotationProxyGroup: "gw-pg", kit.AnnotationHostname: ns + "-edge-gateway"}
		lost := kubeobj.Gateway(ns, "lost", "gw-ha", https)
		lost.Annotations = map[string]string{kit.AnnotationProxyGroup: "no-such-group"}
		lostRoute := kubeobj.HTTPRoute(ns, "lost", "lost", kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		create(twin, lost, lostRoute)
		Eventually(gatewayCondition(twin, "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonDuplicateHostname),
			HaveField("Message", ContainSubstring("Gateway "+ns+"/edge"))))
		warned("Gateway", "twin", kit.ReasonDuplicateHostname)
		Eventually(gatewayCondition(lost, "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyGroupNotFound)))
		warned("Gateway", "lost", kit.ReasonProxyGroupNotFound)
		Eventually(routeCondition(lostRoute, "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonNoMatchingParent)))
		Expect(gw.Delete(ctx, twin)).To(Succeed())
		Expect(gw.Delete(ctx, lost)).To(Succeed())
		quiet()
		serve, _ := groupDocuments(Default, "gw-pg")
		Expect(serve.Services).To(HaveKey(svcName), "the first Gateway keeps its entry")

		By("moving it to a standalone proxy when the annotation goes: the group entry and Tailscale Service released")
		annotate(edge, kit.AnnotationProxyGroup, "")
		Eventually(func() error { return k8s.Get(ctx, proxyKey(proxies.ParentTypeGateway, edge), &appsv1.StatefulSet{}) }).Should(Succeed())
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "gw-pg")
			return serve.Services
		}).ShouldNot(HaveKey(svcName))
		_, err = tailscaleService(svcName)
		Expect(tailnet.IsNotFound(err)).To(BeTrue(), "Tailscale Service still there: %v", err)
		Eventually(func(g Gomega) []string {
			got := &gatewayv1.Gateway{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(edge), got)).To(Succeed())
			return got.Finalizers
		}).Should(Equal([]string{kit.FinalizerName}))

		By("and back onto the group: the standalone proxy removed first")
		annotate(edge, kit.AnnotationProxyGroup, "gw-pg")
		expectGone(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: proxyKey(proxies.ParentTypeGateway, edge).Name}})
		Eventually(func(g Gomega) map[string]contract.WebService {
			serve, _ := groupDocuments(g, "gw-pg")
			return serve.Services
		}).Should(HaveKey(svcName))

		By("removing its entry and Tailscale Service with the Gateway")
		Expect(gw.Delete(ctx, edge)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(gw.Get(ctx, client.ObjectKeyFromObject(edge), &gatewayv1.Gateway{}))
		}).Should(BeTrue())
		serve, _ = groupDocuments(Default, "gw-pg")
		Expect(serve.Services).NotTo(HaveKey(svcName))
		_, err = tailscaleService(svcName)
		Expect(tailnet.IsNotFound(err)).To(BeTrue(), "Tailscale Service still there: %v", err)
	})

	It("serves a GRPCRoute's calls over h2c, refuses an HTTPRoute on its Gateway and an expression that is not RE2", func() {
		class("gw-grpc", gateway.ControllerName, nil)
		ns := newNamespace()
		grpcSvc := newBackendService(ns, "grpc")
		edge := kubeobj.Gateway(ns, "edge", "gw-grpc", https)
		route := kubeobj.GRPCRoute(ns, "health", "edge", "grpc.health.v1.Health", "Check", "grpc", 80)
		create(edge, route)

		By("writing the call's path, reached over h2c, into the proxy config")
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{{Path: "/grpc.health.v1.Health/Check", PathType: contract.PathExact,
			Backend: contract.Backend{URL: "http://" + grpcSvc.Spec.ClusterIP + ":80", Protocol: contract.BackendH2C}}}))
		Eventually(routeCondition(route, "Accepted")).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonGatewayClassAccepted)))
		Eventually(routeCondition(route, "ResolvedRefs")).Should(HaveField("Status", metav1.ConditionTrue))
		Eventually(listenerStatus(edge, "https")).Should(And(HaveField("AttachedRoutes", int32(1)),
			HaveField("SupportedKinds", ConsistOf(HaveField("Kind", gatewayv1.Kind("HTTPRoute")), HaveField("Kind", gatewayv1.Kind("GRPCRoute"))))))

		By("refusing an HTTPRoute on the same Gateway: the two kinds are not merged, the oldest route's kind is served")
		web := kubeobj.HTTPRoute(ns, "web", "edge", kubeobj.HTTPRule(prefix, "/", "", "grpc", 80))
		create(web)
		Eventually(routeCondition(web, "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonUnsupportedValue),
			HaveField("Message", ContainSubstring("GRPCRoute "+ns+"/health"))))
		warned("HTTPRoute", "web", kit.ReasonUnsupportedValue)
		Consistently(servedRoutes(edge), "1s").Should(HaveLen(1))

		By("serving a method match without a service as a regular expression, after the exact call")
		anyService := kubeobj.GRPCRoute(ns, "any", "edge", "", "Watch", "grpc", 80)
		anyService.Spec.Rules[0].Matches[0].Method.Service = nil
		create(anyService)
		Eventually(servedRoutes(edge)).Should(Equal([]contract.Route{
			{Path: "/grpc.health.v1.Health/Check", PathType: contract.PathExact, Backend: contract.Backend{URL: "http://" + grpcSvc.Spec.ClusterIP + ":80", Protocol: contract.BackendH2C}},
			{Path: "/[^/]+/Watch", PathType: contract.PathRegularExpression, Backend: contract.Backend{URL: "http://" + grpcSvc.Spec.ClusterIP + ":80", Protocol: contract.BackendH2C}},
		}))
		Eventually(routeCondition(anyService, "Accepted")).Should(HaveField("Status", metav1.ConditionTrue))

		By("refusing a regular expression the proxy cannot compile, serving nothing of its route")
		bad := kubeobj.GRPCRoute(ns, "bad", "edge", "", "(?!Get)", "grpc", 80)
		bad.Spec.Rules[0].Matches[0].Method.Service = nil
		bad.Spec.Rules[0].Matches[0].Method.Type = ptr.To(gatewayv1.GRPCMethodMatchRegularExpression)
		create(bad)
		Eventually(routeCondition(bad, "Accepted")).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonUnsupportedValue),
			HaveField("Message", ContainSubstring("not RE2 syntax"))))
		warned("GRPCRoute", "bad", kit.ReasonUnsupportedValue)
		Expect(servedRoutes(edge)(Default)).To(HaveLen(2))
		quiet()
	})

	It("leaves a Gateway of another controller's class, and the routes to it, alone", func() {
		class("gw-not-ours", "example.com/gateway-controller", nil)
		ours := class("gw-ours-too", gateway.ControllerName, nil)
		ns := newNamespace()
		newBackendService(ns, "web")
		other := kubeobj.Gateway(ns, "other", "gw-not-ours", https)
		mine := kubeobj.Gateway(ns, "mine", ours.Name, https)
		route := kubeobj.HTTPRoute(ns, "both", "other", kubeobj.HTTPRule(prefix, "/", "", "web", 80))
		route.Spec.ParentRefs = append(route.Spec.ParentRefs, gatewayv1.ParentReference{Name: "mine"})
		create(other, mine, route)
		// Once the route's entry for the Gateway of ours is written, the other has been seen.
		Eventually(func(g Gomega) []gatewayv1.RouteParentStatus {
			got := &gatewayv1.HTTPRoute{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(route), got)).To(Succeed())
			return got.Status.Parents
		}).Should(ConsistOf(And(HaveField("ParentRef.Name", gatewayv1.ObjectName("mine")), HaveField("ControllerName", gateway.ControllerName))))
		Consistently(func(g Gomega) {
			got := &gatewayv1.Gateway{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(other), got)).To(Succeed())
			g.Expect(got.Finalizers).To(BeEmpty())
			g.Expect(got.Status.Listeners).To(BeEmpty())
			g.Expect(got.Status.Conditions).To(HaveEach(HaveField("Reason", "Pending")), "as the API server defaulted them")
			g.Expect(events(g, "Gateway", other.Name)).To(BeEmpty())
			g.Expect(apierrors.IsNotFound(k8s.Get(ctx, secretKey(proxies.ParentTypeGateway, other), &corev1.Secret{}))).To(BeTrue())
		}).WithTimeout(2 * time.Second).Should(Succeed())
	})

	It("stops serving a Gateway whose class goes: its proxy, finalizer and status are removed", func() {
		gc := &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "gw-going"}, Spec: gatewayv1.GatewayClassSpec{ControllerName: gateway.ControllerName}}
		create(gc)
		ns := newNamespace()
		edge := kubeobj.Gateway(ns, "edge", gc.Name, https)
		create(edge)
		Eventually(func() error { return k8s.Get(ctx, proxyKey(proxies.ParentTypeGateway, edge), &appsv1.StatefulSet{}) }).Should(Succeed())
		Eventually(gatewayCondition(edge, "Accepted")).Should(HaveField("Status", metav1.ConditionTrue))

		Expect(gw.Delete(ctx, gc)).To(Succeed())
		expectGone(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: proxyKey(proxies.ParentTypeGateway, edge).Name}})
		Eventually(func(g Gomega) {
			got := &gatewayv1.Gateway{}
			g.Expect(gw.Get(ctx, client.ObjectKeyFromObject(edge), got)).To(Succeed())
			g.Expect(got.Finalizers).To(BeEmpty())
			g.Expect(got.Status.Listeners).To(BeEmpty())
			g.Expect(got.Status.Conditions).NotTo(ContainElement(HaveField("Reason", kit.ReasonGatewayClassAccepted)))
		}).Should(Succeed())
	})
})

func eventTypes(g Gomega, kind, name string) []string {
	var types []string
	for _, e := range events(g, kind, name) {
		types = append(types, e.Type)
	}
	return types
}
