package controller

import (
	"fmt"
	"strings"
	"sync/atomic"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
)

var nsCounter atomic.Int32

// newNamespace creates a namespace of its own for a spec, so specs do not see each other.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("spec-%d", nsCounter.Add(1))}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

func newBackendService(ns, name string) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http", Port: 80}, {Name: "admin", Port: 8080},
		}, Selector: map[string]string{"app": name}},
	}
	Expect(k8s.Create(ctx, s)).To(Succeed())
	return s
}

func newIngress(ns, name string, mutate func(*networkingv1.Ingress)) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{name}}},
			DefaultBackend:   ptr.To(kubeobj.Backend("web", "http")),
		},
	}
	if mutate != nil {
		mutate(ing)
	}
	Expect(k8s.Create(ctx, ing)).To(Succeed())
	return ing
}

func proxyKey(typ string, obj client.Object) client.ObjectKey {
	return client.ObjectKey{Namespace: testSetup.Namespace, Name: proxies.ParentOf(typ, obj).ProxyName()}
}

func secretKey(typ string, obj client.Object) client.ObjectKey {
	k := proxyKey(typ, obj)
	k.Name += "-0"
	return k
}

// proxyConfigOf reads the proxy config the operator wrote for obj.
func proxyConfigOf(g Gomega, typ string, obj client.Object) *contract.ProxyConfig {
	s := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, secretKey(typ, obj), s)).To(Succeed())
	cfg, _, err := contract.ProxyConfigs.Decode(s.Data)
	g.Expect(err).NotTo(HaveOccurred())
	return cfg
}

// reportState plays the proxy: it writes state keys for the live Pod into the state Secret.
func reportState(typ string, obj client.Object, st contract.ProxyState) {
	pod := &corev1.Pod{}
	Eventually(func() error { return k8s.Get(ctx, secretKey(typ, obj), pod) }).Should(Succeed(), "the StatefulSet's Pod")
	st.PodUID = string(pod.UID)
	data, err := st.Data()
	Expect(err).NotTo(HaveOccurred())
	s := &corev1.Secret{}
	Expect(k8s.Get(ctx, secretKey(typ, obj), s)).To(Succeed())
	patch := client.MergeFrom(s.DeepCopy())
	for k, v := range data {
		s.Data[k] = v
	}
	Expect(k8s.Patch(ctx, s, patch, client.FieldOwner("proxy"))).To(Succeed())
}

func ingressEvents(g Gomega, ing *networkingv1.Ingress) []string {
	return eventReasons(g, "Ingress", ing.Name)
}

func expectGone(obj client.Object) {
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	}).Should(BeTrue(), "%T %s should be gone", obj, obj.GetName())
}

var _ = Describe("Ingress reconciler (standalone)", func() {
	It("creates the proxy's children, reports the served name, and cleans up in order", func() {
		ns := newNamespace()
		web := newBackendService(ns, "web")
		ing := newIngress(ns, "shop", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationHTTPRedirect: "true"}
			i.Spec.Rules = []networkingv1.IngressRule{kubeobj.Rule("",
				kubeobj.Path("/metrics", networkingv1.PathTypeExact, kubeobj.Backend("web", "admin")))}
		})

		By("writing a config Secret with the routes and a fresh auth key")
		var cfg *contract.ProxyConfig
		Eventually(func(g Gomega) {
			cfg = proxyConfigOf(g, proxies.ParentTypeIngress, ing)
		}).Should(Succeed())
		Expect(cfg.Kind).To(Equal(contract.KindIngress))
		Expect(cfg.Hostname).To(Equal("shop"))
		Expect(cfg.Tags).To(Equal([]string{"tag:k8s"}))
		Expect(cfg.AuthKey).NotTo(BeEmpty())
		Expect(cfg.StateSecret).To(Equal(secretKey(proxies.ParentTypeIngress, ing).Name))
		Expect(cfg.Serve.HTTP).To(Equal(contract.HTTPRedirect))
		Expect(cfg.Serve.Routes).To(Equal([]contract.Route{
			{Path: "/metrics", PathType: contract.PathExact, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":8080"}},
			{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://" + web.Spec.ClusterIP + ":80"}},
		}))
		firstKey := cfg.AuthKey

		By("creating a StatefulSet, ServiceAccount, Role and RoleBinding with the parent labels")
		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, ing), sts) }).Should(Succeed())
		Expect(sts.Labels).To(Equal(proxies.ParentOf(proxies.ParentTypeIngress, ing).Labels()))
		Expect(*sts.Spec.Replicas).To(BeEquivalentTo(1))
		c := sts.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal("proxy:test"))
		Expect(c.Args).To(ContainElement("--config-secret=" + cfg.StateSecret))
		Expect(*c.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
		role := &rbacv1.Role{}
		Expect(k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, ing), role)).To(Succeed())
		Expect(role.Rules[0].ResourceNames).To(Equal([]string{cfg.StateSecret}))
		Expect(k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, ing), &rbacv1.RoleBinding{})).To(Succeed())
		Expect(k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, ing), &corev1.ServiceAccount{})).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
		Expect(ing.Finalizers).To(ContainElement(kit.FinalizerName))

		By("keeping the same unused key on later passes")
		patch := client.MergeFrom(ing.DeepCopy())
		ing.Spec.Rules[0].HTTP.Paths[0].Path = "/stats"
		Expect(k8s.Patch(ctx, ing, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			cfg = proxyConfigOf(g, proxies.ParentTypeIngress, ing)
			g.Expect(cfg.Serve.Routes[0].Path).To(Equal("/stats"))
		}).Should(Succeed())
		Expect(cfg.AuthKey).To(Equal(firstKey))

		By("filling status once the running Pod reports its HTTPS endpoint, and dropping the spent key")
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: "nStale1", FQDN: "shop.tailnet.test", HTTPSEndpoint: "shop.tailnet.test"})
		Eventually(func(g Gomega) []networkingv1.IngressLoadBalancerIngress {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			return ing.Status.LoadBalancer.Ingress
		}).Should(Equal([]networkingv1.IngressLoadBalancerIngress{{Hostname: "shop.tailnet.test", Ports: []networkingv1.IngressPortStatus{
			{Port: 443, Protocol: corev1.ProtocolTCP}, {Port: 80, Protocol: corev1.ProtocolTCP}}}}))
		Eventually(func(g Gomega) string { return proxyConfigOf(g, proxies.ParentTypeIngress, ing).AuthKey }).Should(BeEmpty())

		By("deleting the StatefulSet, device and children, then the finalizer")
		Expect(k8s.Delete(ctx, ing)).To(Succeed())
		expectGone(ing)
		expectGone(sts)
		expectGone(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: cfg.StateSecret}})
		expectGone(role)
	})

	It("ignores other classes and ProxyGroup Ingresses, and cleans up when an Ingress leaves the class", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		other := newIngress(ns, "nginx", func(i *networkingv1.Ingress) { i.Spec.IngressClassName = ptr.To("nginx") })
		grouped := newIngress(ns, "grouped", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "pg"}
		})
		ing := newIngress(ns, "moving", nil)
		Eventually(func(g Gomega) { proxyConfigOf(g, proxies.ParentTypeIngress, ing) }).Should(Succeed())
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{HTTPSEndpoint: "moving.tailnet.test"})
		Eventually(func(g Gomega) int {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			return len(ing.Status.LoadBalancer.Ingress)
		}).Should(Equal(1))

		for _, o := range []*networkingv1.Ingress{other, grouped} {
			Consistently(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, o), &appsv1.StatefulSet{}))
			}, "1s").Should(BeTrue())
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(o), o)).To(Succeed())
			Expect(o.Finalizers).To(BeEmpty())
		}

		patch := client.MergeFrom(ing.DeepCopy())
		ing.Spec.IngressClassName = ptr.To("nginx")
		Expect(k8s.Patch(ctx, ing, patch)).To(Succeed())
		expectGone(&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: proxyKey(proxies.ParentTypeIngress, ing).Name}})
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			g.Expect(ing.Finalizers).To(BeEmpty())
			g.Expect(ing.Status.LoadBalancer.Ingress).To(BeEmpty())
		}).Should(Succeed())
	})

	It("reports a missing backend, serves once it exists, and keeps serving through a typo", func() {
		ns := newNamespace()
		ing := newIngress(ns, "waiting", nil)
		Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(
			ContainElements(kit.ReasonInvalidIngressBackend, kit.ReasonNoValidBackends))
		Expect(apierrors.IsNotFound(k8s.Get(ctx, secretKey(proxies.ParentTypeIngress, ing), &corev1.Secret{}))).To(BeTrue())

		newBackendService(ns, "web")
		Eventually(func(g Gomega) { proxyConfigOf(g, proxies.ParentTypeIngress, ing) }).Should(Succeed())

		// A broken edit is reported; the running proxy keeps its last good config.
		patch := client.MergeFrom(ing.DeepCopy())
		ing.Spec.DefaultBackend = ptr.To(kubeobj.Backend("web", 9999))
		Expect(k8s.Patch(ctx, ing, patch)).To(Succeed())
		Eventually(func(g Gomega) int {
			n := 0
			for _, r := range ingressEvents(g, ing) {
				if r == kit.ReasonNoValidBackends {
					n++
				}
			}
			return n
		}).Should(BeNumerically(">=", 2))
		Consistently(func(g Gomega) []contract.Route {
			return proxyConfigOf(g, proxies.ParentTypeIngress, ing).Serve.Routes
		}, "1s").Should(HaveLen(1))
	})

	DescribeTable("rejects bad input with a stable reason and creates no proxy",
		func(name string, mutate func(*networkingv1.Ingress), reason string) {
			ns := newNamespace()
			newBackendService(ns, "web")
			ing := newIngress(ns, name, mutate)
			Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(reason))
			Consistently(func() bool {
				return apierrors.IsNotFound(k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, ing), &appsv1.StatefulSet{}))
			}, "1s").Should(BeTrue())
		},
		Entry("a malformed tag", "badtag", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationTags: "tag:ok,k8s"}
		}, kit.ReasonInvalidAnnotation),
		Entry("a tag the control plane refuses", "refused", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationTags: "tag:not-allowed"}
		}, kit.ReasonTailnetAPIFailed),
		Entry("a TLS host that is no DNS label", "badhost", func(i *networkingv1.Ingress) {
			i.Spec.TLS[0].Hosts = []string{"*.example.com"}
		}, kit.ReasonInvalidHostname),
		Entry("only a host it cannot serve", "otherhost", func(i *networkingv1.Ingress) {
			i.Spec.DefaultBackend = nil
			i.Spec.Rules = []networkingv1.IngressRule{kubeobj.Rule("other.example.com", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", 80)))}
		}, kit.ReasonUnsupportedHost),
		Entry("a missing ProxyClass", "noclass", func(i *networkingv1.Ingress) {
			i.Labels = map[string]string{kit.LabelProxyClass: "does-not-exist"}
		}, kit.ReasonProxyClassNotReady),
	)

	It("says which tags the control plane refused, without leaking credentials", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "refused-msg", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationTags: "tag:not-allowed"}
		})
		Eventually(func(g Gomega) string {
			return strings.Join(eventMessages(g, "Ingress", ing.Name), "\n")
		}).Should(And(ContainSubstring("TagsNotPermitted"), Not(ContainSubstring(tsnet.OAuthClientSecret.Reveal()))))
	})

	It("waits for its ProxyClass to be ready and applies it", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "classy", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.LabelProxyClass: "late-class"}
		})
		Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(kit.ReasonProxyClassNotReady))

		pc := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "late-class"}, Spec: tsv1alpha1.ProxyClassSpec{
			UseLetsEncryptStagingEnvironment: true,
			StatefulSet: &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{
				Labels:             map[string]string{"team": "web", kit.LabelParentName: "hijack"},
				NodeSelector:       map[string]string{"pool": "edge"},
				TailscaleContainer: &tsv1alpha1.Container{Image: "proxy:custom", Env: []tsv1alpha1.Env{{Name: "EXTRA", Value: "1"}}},
			}},
		}}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, ing), sts) }).Should(Succeed())
		tpl := sts.Spec.Template
		Expect(tpl.Labels).To(HaveKeyWithValue("team", "web"))
		Expect(tpl.Labels).To(HaveKeyWithValue(kit.LabelParentName, "classy"), "the operator's labels win")
		Expect(tpl.Spec.NodeSelector).To(Equal(map[string]string{"pool": "edge"}))
		Expect(tpl.Spec.Containers[0].Image).To(Equal("proxy:custom"))
		Expect(tpl.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: "EXTRA", Value: "1"}))
		Eventually(func(g Gomega) string {
			return proxyConfigOf(g, proxies.ParentTypeIngress, ing).TLS.ACMEDirectoryURL
		}).Should(Equal(proxies.LetsEncryptStaging))
	})
})
