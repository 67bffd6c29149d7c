package reliability

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// badInput is one thing users get wrong, and what the operator must say about it.
type badInput struct {
	name string
	// make creates the bad input in namespace ns (which has the Service echo) and returns the
	// object the outcome shows on.
	make func(ns string) client.Object
	// reason is the Warning Event's reason on the object; condition, "Type=Reason", a condition
	// of the object that must say so. ignored means the operator must leave the object alone:
	// no proxy and no Event.
	reason, condition string
	ignored           bool
	// also checks, once the outcome shows, what the case must leave working.
	also func(g Gomega, obj client.Object)
}

// Groups and classes the cases name.
const (
	goodGroup   = "bad-input-pg"
	egressGroup = "bad-input-egress"
	goodClass   = "bad-input-good"
	badClass    = "bad-input-invalid"
)

func badInputs() []badInput {
	now := time.Now()
	tags := func(v string) func(string) client.Object {
		return func(ns string) client.Object {
			return create(ingress(ns, "web", "tags-"+ns, annotate(kit.AnnotationTags, v)))
		}
	}
	byo := func(secret func(ns string) *corev1.Secret) func(string) client.Object {
		return func(ns string) client.Object {
			if s := secret(ns); s != nil {
				create(s)
			}
			return create(ingress(ns, "web", "byo-"+ns, withBYO("app.example.com", "cert")))
		}
	}
	validCert, validKey := certificate([]string{"app.example.com"}, now.Add(-time.Hour), now.Add(90*24*time.Hour))
	_, otherKey := certificate([]string{"app.example.com"}, now.Add(-time.Hour), now.Add(90*24*time.Hour))
	expiredCert, expiredKey := certificate([]string{"app.example.com"}, now.Add(-90*24*time.Hour), now.Add(-time.Hour))
	futureCert, futureKey := certificate([]string{"app.example.com"}, now.Add(24*time.Hour), now.Add(90*24*time.Hour))
	otherHostCert, otherHostKey := certificate([]string{"other.example.com"}, now.Add(-time.Hour), now.Add(90*24*time.Hour))
	svc := func(mutate ...func(*corev1.Service)) func(string) client.Object {
		return func(ns string) client.Object { return create(lbService(ns, "db", mutate...)) }
	}
	haSvc := func(group string, mutate ...func(*corev1.Service)) func(string) client.Object {
		return func(ns string) client.Object {
			return create(lbService(ns, "db", append([]func(*corev1.Service){svcAnnotate(kit.AnnotationProxyGroup, group)}, mutate...)...))
		}
	}
	proxyReady := kit.ConditionProxyReady + "="
	svcValid := kit.ConditionIngressSvcValid + "="

	return []badInput{
		// Annotations of Ingresses.
		{name: "tags without the tag: prefix", make: tags("k8s"), reason: kit.ReasonInvalidAnnotation},
		{name: "an empty tag", make: tags("tag:"), reason: kit.ReasonInvalidAnnotation},
		{name: "tags that are only commas", make: tags(" , "), reason: kit.ReasonInvalidAnnotation},
		{name: "a tag with a space", make: tags("tag:a b"), reason: kit.ReasonInvalidAnnotation},
		{name: "a tag with an underscore", make: tags("tag:k8s,tag:bad_tag"), reason: kit.ReasonInvalidAnnotation},
		{name: "http-redirect that is not a boolean", reason: kit.ReasonInvalidAnnotation, also: proxyCreated,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "redirect-"+ns, annotate(kit.AnnotationHTTPRedirect, "maybe")))
			}},
		{name: "an unknown backend-protocol", reason: kit.ReasonInvalidAnnotation, also: proxyCreated,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "proto-"+ns, annotate(kit.AnnotationBackendProtocol, "gopher")))
			}},
		// Hostnames.
		{name: "a tailnet hostname longer than a DNS label", reason: kit.ReasonInvalidHostname,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", strings.Repeat("x", 64)+".example.ts.net"))
			}},
		{name: "a wildcard as the tailnet name", reason: kit.ReasonInvalidHostname,
			make: func(ns string) client.Object { return create(ingress(ns, "web", "*.example.ts.net")) }},
		{name: "two Ingresses on a ProxyGroup with one hostname", reason: kit.ReasonDuplicateHostname,
			make: func(ns string) client.Object {
				create(ingress(ns, "first", "dup-"+ns, onGroup(goodGroup)))
				waitForFinalizer(&networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "first"}})
				return create(ingress(ns, "second", "dup-"+ns, onGroup(goodGroup)))
			}},
		{name: "a hostname whose Tailscale Service belongs to someone else", reason: kit.ReasonInvalidTailscaleSvc,
			make: func(ns string) client.Object {
				_, err := tsAPI.PutService(context.Background(), tailnet.Service{Name: "svc:foreign-" + ns, Ports: []string{"tcp:443"}, Comment: "not the operator's"})
				Expect(err).NotTo(HaveOccurred())
				return create(ingress(ns, "web", "foreign-"+ns, onGroup(goodGroup)))
			}},
		// References.
		{name: "a ProxyGroup that does not exist", reason: kit.ReasonProxyGroupNotFound,
			make: func(ns string) client.Object { return create(ingress(ns, "web", "nopg-"+ns, onGroup("no-such-group"))) }},
		{name: "a ProxyGroup of type egress", reason: kit.ReasonProxyGroupWrongType,
			make: func(ns string) client.Object { return create(ingress(ns, "web", "egress-"+ns, onGroup(egressGroup))) }},
		{name: "a ProxyClass that does not exist", reason: kit.ReasonProxyClassNotReady,
			make: func(ns string) client.Object {
				ing := ingress(ns, "web", "nopc-"+ns)
				ing.Labels = map[string]string{kit.LabelProxyClass: "no-such-class"}
				return create(ing)
			}},
		{name: "an invalid ProxyClass", reason: kit.ReasonProxyClassNotReady,
			make: func(ns string) client.Object {
				ing := ingress(ns, "web", "badpc-"+ns)
				ing.Labels = map[string]string{kit.LabelProxyClass: badClass}
				return create(ing)
			}},
		// Backends.
		{name: "only a backend Service that does not exist", reason: kit.ReasonNoValidBackends,
			make: func(ns string) client.Object {
				ing := ingress(ns, "web", "nosvc-"+ns)
				ing.Spec.DefaultBackend = ptr.To(backend("no-such-service", httpPort))
				return create(ing)
			}},
		{name: "a path to a Service that does not exist", reason: kit.ReasonInvalidIngressBackend, also: proxyCreated,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "misssvc-"+ns, withRule("", "/api", backend("no-such-service", httpPort))))
			}},
		{name: "a path to a port the Service lacks", reason: kit.ReasonInvalidIngressBackend, also: proxyCreated,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "noport-"+ns, withRule("", "/api", backend("echo", networkingv1.ServiceBackendPort{Number: 9999}))))
			}},
		{name: "a path to a headless Service", reason: kit.ReasonInvalidIngressBackend, also: proxyCreated,
			make: func(ns string) client.Object {
				h := echoService(ns, "headless")
				h.Spec.ClusterIP = corev1.ClusterIPNone
				create(h)
				return create(ingress(ns, "web", "headless-"+ns, withRule("", "/api", backend("headless", httpPort))))
			}},
		{name: "a resource backend", reason: kit.ReasonInvalidIngressBackend, also: proxyCreated,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "resource-"+ns, withRule("", "/files", networkingv1.IngressBackend{
					Resource: &corev1.TypedLocalObjectReference{APIGroup: ptr.To("example.com"), Kind: "Bucket", Name: "b"}})))
			}},
		{name: "no valid backend on a ProxyGroup", reason: kit.ReasonNoValidBackends,
			make: func(ns string) client.Object {
				ing := ingress(ns, "web", "hanosvc-"+ns, onGroup(goodGroup))
				ing.Spec.DefaultBackend = ptr.To(backend("no-such-service", httpPort))
				return create(ing)
			}},
		// Rules.
		{name: "a rule host that is neither the tailnet name nor a certificate's", reason: kit.ReasonUnsupportedHost, also: proxyCreated,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "host-"+ns, withRule("other.example.com", "/", backend("echo", httpPort))))
			}},
		{name: "a wildcard rule host without a certificate", reason: kit.ReasonUnsupportedHost, also: proxyCreated,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "wild-"+ns, withRule("*.example.com", "/", backend("echo", httpPort))))
			}},
		{name: "the same path twice", reason: kit.ReasonDuplicatePath, also: proxyCreated,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "dup-path-"+ns, withRule("", "/a", backend("echo", httpPort)), withRule("", "/a", backend("echo", httpPort))))
			}},
		// Bring-your-own certificates.
		{name: "a TLS Secret that does not exist", reason: kit.ReasonTLSSecretNotFound, also: proxyCreated,
			make: byo(func(string) *corev1.Secret { return nil })},
		{name: "a TLS Secret of type Opaque", reason: kit.ReasonTLSSecretWrongType, also: proxyCreated,
			make: byo(func(ns string) *corev1.Secret {
				return tlsSecret(ns, "cert", corev1.SecretTypeOpaque, validCert, validKey)
			})},
		{name: "a TLS Secret holding garbage", reason: kit.ReasonTLSSecretInvalid, also: proxyCreated,
			make: byo(func(ns string) *corev1.Secret {
				return tlsSecret(ns, "cert", corev1.SecretTypeTLS, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"), []byte("garbage"))
			})},
		{name: "a TLS Secret whose key does not match", reason: kit.ReasonTLSSecretInvalid, also: proxyCreated,
			make: byo(func(ns string) *corev1.Secret {
				return tlsSecret(ns, "cert", corev1.SecretTypeTLS, validCert, otherKey)
			})},
		{name: "an expired certificate", reason: kit.ReasonCertificateExpired, also: proxyCreated,
			make: byo(func(ns string) *corev1.Secret {
				return tlsSecret(ns, "cert", corev1.SecretTypeTLS, expiredCert, expiredKey)
			})},
		{name: "a certificate not valid yet", reason: kit.ReasonCertificateExpired, also: proxyCreated,
			make: byo(func(ns string) *corev1.Secret {
				return tlsSecret(ns, "cert", corev1.SecretTypeTLS, futureCert, futureKey)
			})},
		{name: "a certificate for other hosts", reason: kit.ReasonCertificateHostMismatch, also: proxyCreated,
			make: byo(func(ns string) *corev1.Secret {
				return tlsSecret(ns, "cert", corev1.SecretTypeTLS, otherHostCert, otherHostKey)
			})},
		// Services.
		{name: "a Service hostname that is not a DNS label", reason: kit.ReasonInvalidAnnotation, condition: proxyReady + kit.ReasonProxyInvalid,
			make: svc(svcAnnotate(kit.AnnotationHostname, "Bad_Name"))},
		{name: "a Service hostname longer than a DNS label", reason: kit.ReasonInvalidAnnotation, condition: proxyReady + kit.ReasonProxyInvalid,
			make: svc(svcAnnotate(kit.AnnotationHostname, strings.Repeat("h", 64)))},
		{name: "expose that is not \"true\"", reason: kit.ReasonInvalidAnnotation, condition: proxyReady + kit.ReasonProxyInvalid,
			make: svc(svcAnnotate(kit.AnnotationExpose, "yes"))},
		{name: "bad tags on a Service", reason: kit.ReasonInvalidAnnotation, condition: proxyReady + kit.ReasonProxyInvalid,
			make: svc(svcAnnotate(kit.AnnotationTags, "tag:ok,nope"))},
		{name: "a headless Service", reason: kit.ReasonInvalidService, condition: proxyReady + kit.ReasonProxyInvalid,
			make: svc(func(s *corev1.Service) {
				s.Spec.Type, s.Spec.LoadBalancerClass, s.Spec.ClusterIP = corev1.ServiceTypeClusterIP, nil, corev1.ClusterIPNone
				s.Annotations[kit.AnnotationExpose] = "true"
			})},
		{name: "a Service's ProxyClass that does not exist", reason: kit.ReasonProxyClassNotReady, condition: proxyReady + kit.ReasonProxyPending,
			make: svc(func(s *corev1.Service) { s.Labels = map[string]string{kit.LabelProxyClass: "no-such-class"} })},
		{name: "a Service on a ProxyGroup that does not exist", reason: kit.ReasonProxyGroupNotFound, condition: svcValid + kit.ReasonProxyGroupNotFound,
			make: haSvc("no-such-group")},
		{name: "a Service on a ProxyGroup of type egress", reason: kit.ReasonProxyGroupWrongType, condition: svcValid + kit.ReasonProxyGroupWrongType,
			make: haSvc(egressGroup)},
		{name: "a Service on a ProxyGroup with a bad hostname", reason: kit.ReasonInvalidAnnotation, condition: svcValid + kit.ReasonInvalidAnnotation,
			make: haSvc(goodGroup, svcAnnotate(kit.AnnotationHostname, "-bad-"))},
		{name: "two Services on a ProxyGroup with one hostname", reason: kit.ReasonDuplicateHostname, condition: svcValid + kit.ReasonDuplicateHostname,
			make: func(ns string) client.Object {
				first := create(lbService(ns, "first", svcAnnotate(kit.AnnotationProxyGroup, goodGroup, kit.AnnotationHostname, "dupsvc-"+ns)))
				waitForFinalizer(first)
				return create(lbService(ns, "second", svcAnnotate(kit.AnnotationProxyGroup, goodGroup, kit.AnnotationHostname, "dupsvc-"+ns)))
			}},
		// Shapes the operator does not serve: left alone.
		{name: "a LoadBalancer Service of another class", ignored: true,
			make: svc(func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptr.To("example.com/other") })},
		{name: "a LoadBalancer Service without a class", ignored: true,
			make: svc(func(s *corev1.Service) { s.Spec.LoadBalancerClass = nil })},
		{name: "a NodePort Service", ignored: true,
			make: svc(func(s *corev1.Service) { s.Spec.Type, s.Spec.LoadBalancerClass = corev1.ServiceTypeNodePort, nil })},
		{name: "an Ingress of another class", ignored: true,
			make: func(ns string) client.Object {
				return create(ingress(ns, "web", "other-"+ns, func(i *networkingv1.Ingress) { i.Spec.IngressClassName = ptr.To("nginx") }))
			}},
		// ProxyGroups and ProxyClasses.
		{name: "a ProxyGroup of type kube-apiserver", reason: kit.ReasonProxyGroupInvalid,
			condition: tsv1alpha1.ProxyGroupReady + "=" + kit.ReasonProxyGroupInvalid,
			make: func(ns string) client.Object {
				return create(proxyGroup(ns+"-api", tsv1alpha1.ProxyGroupTypeKubeAPIServer))
			}},
		{name: "a ProxyGroup whose ProxyClass does not exist", condition: tsv1alpha1.ProxyGroupReady + "=" + kit.ReasonProxyGroupPending,
			make: func(ns string) client.Object {
				return create(proxyGroup(ns+"-nopc", tsv1alpha1.ProxyGroupTypeIngress, func(pg *tsv1alpha1.ProxyGroup) { pg.Spec.ProxyClass = "no-such-class" }))
			}},
		{name: "a ProxyClass with a bad label key", reason: kit.ReasonProxyClassInvalid,
			condition: tsv1alpha1.ProxyClassReady + "=" + kit.ReasonProxyClassInvalid,
			make: proxyClass(func(s *tsv1alpha1.ProxyClassSpec) {
				s.StatefulSet = &tsv1alpha1.StatefulSet{Labels: map[string]string{"bad key!": "v"}}
			})},
		{name: "a ProxyClass with a bad label value", reason: kit.ReasonProxyClassInvalid,
			condition: tsv1alpha1.ProxyClassReady + "=" + kit.ReasonProxyClassInvalid,
			make: proxyClass(func(s *tsv1alpha1.ProxyClassSpec) {
				s.StatefulSet = &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{Labels: map[string]string{"app": strings.Repeat("v", 64)}}}
			})},
		{name: "a ProxyClass with a bad annotation key", reason: kit.ReasonProxyClassInvalid,
			condition: tsv1alpha1.ProxyClassReady + "=" + kit.ReasonProxyClassInvalid,
			make: proxyClass(func(s *tsv1alpha1.ProxyClassSpec) {
				s.StatefulSet = &tsv1alpha1.StatefulSet{Annotations: map[string]string{"a/b/c": "v"}}
			})},
		{name: "a ProxyClass image with white space", reason: kit.ReasonProxyClassInvalid,
			condition: tsv1alpha1.ProxyClassReady + "=" + kit.ReasonProxyClassInvalid,
			make: proxyClass(func(s *tsv1alpha1.ProxyClassSpec) {
				s.StatefulSet = &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{Image: "proxy :v1"}}}
			})},
		{name: "a ProxyClass asking for a ServiceMonitor without its CRD", reason: kit.ReasonProxyClassInvalid,
			condition: tsv1alpha1.ProxyClassReady + "=" + kit.ReasonProxyClassInvalid,
			make: proxyClass(func(s *tsv1alpha1.ProxyClassSpec) {
				s.Metrics = &tsv1alpha1.Metrics{Enable: true, ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true}}
			})},
		{name: "a ProxyClass overriding a TS_ variable", reason: kit.ReasonCustomTSEnvVar,
			condition: tsv1alpha1.ProxyClassReady + "=" + kit.ReasonProxyClassValid,
			make: proxyClass(func(s *tsv1alpha1.ProxyClassSpec) {
				s.StatefulSet = &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{TailscaleContainer: &tsv1alpha1.Container{
					Env: []tsv1alpha1.Env{{Name: "TS_USERSPACE", Value: "true"}}}}}
			})},
	}
}

func proxyClass(mutate func(*tsv1alpha1.ProxyClassSpec)) func(string) client.Object {
	return func(ns string) client.Object {
		pc := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-pc"}}
		mutate(&pc.Spec)
		return create(pc)
	}
}

// waitForFinalizer waits until the operator has taken obj on (its finalizer), so that a second
// object with the same name is the one that came later.
func waitForFinalizer(obj client.Object) {
	GinkgoHelper()
	Eventually(func(g Gomega) []string {
		g.Expect(k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		return obj.GetFinalizers()
	}).ShouldNot(BeEmpty(), "the operator's finalizer on %s", obj.GetName())
}

// proxyCreated checks that a standalone object's problem left the rest of it served: its proxy
// StatefulSet exists.
func proxyCreated(g Gomega, obj client.Object) {
	list := &appsv1.StatefulSetList{}
	g.Expect(k8s.List(context.Background(), list, client.InNamespace(opNS), client.MatchingLabels{
		kit.LabelParentName: obj.GetName(), kit.LabelParentNS: obj.GetNamespace()})).To(Succeed())
	g.Expect(list.Items).To(HaveLen(1), "the proxy of %s/%s", obj.GetNamespace(), obj.GetName())
}

// noProxy checks that the operator made nothing for obj.
func noProxy(g Gomega, obj client.Object) {
	for _, list := range []client.ObjectList{&appsv1.StatefulSetList{}, &corev1.SecretList{}} {
		g.Expect(k8s.List(context.Background(), list, client.InNamespace(opNS), client.MatchingLabels{
			kit.LabelParentName: obj.GetName(), kit.LabelParentNS: obj.GetNamespace()})).To(Succeed())
		g.Expect(meta.LenList(list)).To(BeZero(), "children of %s/%s", obj.GetNamespace(), obj.GetName())
	}
}

// canary is a healthy object whose children must not change while bad input is handled.
type canary struct {
	obj      client.Object
	children map[string]string // "Kind name" → version of what the operator writes
}

func snapshotChildren(obj client.Object, typ string) map[string]string {
	GinkgoHelper()
	out := map[string]string{}
	sel := client.MatchingLabels{kit.LabelParentName: obj.GetName(), kit.LabelParentType: typ}
	if obj.GetNamespace() != "" {
		sel[kit.LabelParentNS] = obj.GetNamespace()
	}
	for kind, list := range map[string]client.ObjectList{"StatefulSet": &appsv1.StatefulSetList{}, "Secret": &corev1.SecretList{}, "ConfigMap": &corev1.ConfigMapList{}} {
		Expect(k8s.List(context.Background(), list, client.InNamespace(opNS), sel)).To(Succeed())
		Expect(meta.EachListItem(list, func(o runtime.Object) error {
			co := o.(client.Object)
			// A StatefulSet's status is written by the controller manager: its spec's generation
			// says whether the operator changed it. Secrets and ConfigMaps have no status.
			if kind == "StatefulSet" {
				out[kind+" "+co.GetName()] = fmt.Sprintf("generation %d", co.GetGeneration())
			} else {
				out[kind+" "+co.GetName()] = co.GetResourceVersion()
			}
			return nil
		})).To(Succeed())
	}
	return out
}

var _ = Describe("Bad input", Ordered, func() {
	var (
		cases    []badInput
		objs     []client.Object
		canaries []canary
		started  time.Time
		took     []time.Duration
		window   = 20 * time.Second
		maxCount int
	)

	BeforeAll(func() {
		ctx := context.Background()
		By("the ProxyGroups and ProxyClasses the cases name")
		create(proxyGroup(goodGroup, tsv1alpha1.ProxyGroupTypeIngress))
		create(proxyGroup(egressGroup, tsv1alpha1.ProxyGroupTypeEgress))
		create(&tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: badClass}, Spec: tsv1alpha1.ProxyClassSpec{
			StatefulSet: &tsv1alpha1.StatefulSet{Labels: map[string]string{"not a key": "v"}}}})

		By("healthy objects, which must not notice anything")
		ns := newNamespace("canary")
		create(echoService(ns, "echo"))
		web := create(ingress(ns, "web", "canary-web"))
		db := create(lbService(ns, "db"))
		ha := create(ingress(ns, "ha", "canary-ha", onGroup(goodGroup)))
		Eventually(func(g Gomega) {
			proxyCreated(g, web)
			proxyCreated(g, db)
			cm := &corev1.ConfigMap{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: goodGroup + "-ingress-config"}, cm)).To(Succeed())
			doc, _, err := contract.ServeConfigs.Decode(cmDataBytes(cm))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Services).To(HaveKey("svc:canary-ha"))
		}).Should(Succeed(), "the healthy objects served")
		settle()
		canaries = []canary{
			{obj: web, children: snapshotChildren(web, "ingress")},
			{obj: db, children: snapshotChildren(db, "svc")},
			{obj: ha},
		}
	})

	It("gives every case its stable reason, leaving the rest of the object served", func() {
		cases = badInputs()
		Expect(len(cases)).To(BeNumerically(">=", 40), "cases")
		started = time.Now()
		for _, c := range cases {
			ns := newNamespace("bad")
			create(echoService(ns, "echo"))
			objs = append(objs, c.make(ns))
		}
		for i, c := range cases {
			obj := objs[i]
			By(c.name)
			Eventually(func(g Gomega) {
				if c.reason != "" {
					g.Expect(warnings(g, obj.GetUID())).To(ContainElement(c.reason), "Warning Events on %s", obj.GetName())
				}
				if c.condition != "" {
					typ, reason, _ := strings.Cut(c.condition, "=")
					cond := meta.FindStatusCondition(conditionsOf(g, obj), typ)
					g.Expect(cond).NotTo(BeNil(), "condition %s", typ)
					g.Expect(cond.Reason).To(Equal(reason), "condition %s: %s", typ, cond.Message)
				}
				if c.also != nil {
					c.also(g, obj)
				}
			}).Should(Succeed(), "case %q", c.name)
			took = append(took, time.Since(started))
		}
		operatorStillRunning()
	})

	It("leaves alone what it does not serve", func() {
		for i, c := range cases {
			if !c.ignored {
				continue
			}
			Consistently(func(g Gomega) {
				noProxy(g, objs[i])
				g.Expect(warnings(g, objs[i].GetUID())).To(BeEmpty())
			}).WithTimeout(2*time.Second).Should(Succeed(), "case %q", c.name)
		}
	})

	It("does not loop: each object is reconciled a bounded number of times while nothing changes", func() {
		settle()
		before := opLog.reconcileCounts()
		total := 0
		for _, n := range before {
			total += n
		}
		Expect(total).To(BeNumerically(">", len(cases)), "reconciles counted so far: the count must see them")
		time.Sleep(window)
		after := opLog.reconcileCounts()
		var busy []string
		for key, n := range after {
			d := n - before[key]
			maxCount = max(maxCount, d)
			if d > 2 {
				busy = append(busy, fmt.Sprintf("%s: %d", key, d))
			}
		}
		sort.Strings(busy)
		Expect(busy).To(BeEmpty(), "objects reconciled more than twice in %s with nothing changing", window)
		Expect(opLog.panicsSeen()).To(BeEmpty(), "panics recovered in reconcilers")
		operatorStillRunning()
	})

	It("leaves the healthy objects as they were", func() {
		ctx := context.Background()
		for _, c := range canaries {
			if c.children == nil {
				continue
			}
			typ := "ingress"
			if _, ok := c.obj.(*corev1.Service); ok {
				typ = "svc"
			}
			Expect(snapshotChildren(c.obj, typ)).To(Equal(c.children), "children of %s", c.obj.GetName())
			Expect(warnings(Default, c.obj.GetUID())).To(BeEmpty(), "Warnings on %s", c.obj.GetName())
		}
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: opNS, Name: goodGroup + "-ingress-config"}, cm)).To(Succeed())
		doc, _, err := contract.ServeConfigs.Decode(cmDataBytes(cm))
		Expect(err).NotTo(HaveOccurred())
		Expect(doc.Services).To(HaveKey("svc:canary-ha"))
		_, err = tsAPI.Service(ctx, "svc:canary-ha")
		Expect(err).NotTo(HaveOccurred(), "the healthy Ingress's Tailscale Service")
	})

	AfterAll(func() {
		if len(took) == 0 {
			return
		}
		var b strings.Builder
		counts := map[string]int{}
		for _, c := range cases {
			switch {
			case c.ignored:
				counts["left alone"]++
			case c.reason != "":
				counts[c.reason]++
			default:
				counts[c.condition]++
			}
		}
		keys := slices.Sorted(maps.Keys(counts))
		fmt.Fprintf(&b, "### Bad input (envtest, operator in-process)\n\n")
		fmt.Fprintf(&b, "%d cases, each checked for its stable reason (Warning Event and/or condition); all reached it %s after the first was created. "+
			"In a %s window with nothing changing, no object was reconciled more than %d times; 0 panics; the healthy Ingress, Service and "+
			"HA Ingress kept their children unchanged and got no Warning.\n\n", len(cases), took[len(took)-1].Round(100*time.Millisecond), window, maxCount)
		fmt.Fprintf(&b, "| Outcome | Cases |\n| --- | --- |\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "| %s | %d |\n", k, counts[k])
		}
		report.add(b.String())
	})
})

// settle waits until the operator has been idle for two seconds: no reconcile anywhere.
func settle() {
	GinkgoHelper()
	last := opLog.reconcileCounts()
	Eventually(func() bool {
		now := opLog.reconcileCounts()
		same := maps.Equal(now, last)
		last = now
		return same
	}).WithTimeout(time.Minute).WithPolling(2*time.Second).Should(BeTrue(), "the operator settling")
}

func cmDataBytes(cm *corev1.ConfigMap) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	return out
}
