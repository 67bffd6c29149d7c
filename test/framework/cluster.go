// Package framework is what the suites that test a cluster through its kubeconfig share
// (test/e2e, test/chaos): the clients of the cluster and of the tailnet, the echo backend, and
// helpers for the objects a spec makes, each deleted after the spec. Specs are Ginkgo's; the
// helpers fail them through Gomega.
package framework

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
)

// Cluster is the cluster under test, reached through the kubeconfig.
type Cluster struct {
	Config    *rest.Config
	K8s       client.Client
	Clientset kubernetes.Interface
	// SpecNamespace is the namespace NewNamespace made last: the current spec's, for a dump on
	// failure.
	SpecNamespace string
}

// Connect loads the kubeconfig by the usual rules and makes the clients; timeout, unless zero,
// bounds every request.
func Connect(timeout time.Duration) *Cluster {
	GinkgoHelper()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	Expect(err).NotTo(HaveOccurred(), "kubeconfig")
	cfg.Timeout = timeout
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(tsv1alpha1.AddToScheme(scheme)).To(Succeed())
	Expect(gatewayv1.Install(scheme)).To(Succeed())
	c := &Cluster{Config: cfg}
	c.K8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	c.Clientset, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// SetDefaults makes timeout the default of every Eventually, polled every half second.
func SetDefaults(timeout time.Duration) {
	SetDefaultEventuallyTimeout(timeout)
	// Gomega applies no default timeout to an Eventually given a context: a spec waiting for
	// something that never happens would hang until -test.timeout instead of failing.
	EnforceDefaultTimeoutsWhenUsingContexts()
	SetDefaultEventuallyPollingInterval(500 * time.Millisecond)
}

// EnvOr is the environment variable name, or def when it is unset or empty.
func EnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Token is a random lower-case word: unique names and echo payloads.
func Token() string { return strings.ToLower(rand.Text()[:8]) }

// NewNamespace creates a namespace named prefix-<random> and deletes it after the spec, once
// the objects the spec made are gone, and waits until it is gone too: a namespace left
// Terminating (no namespace controller, a finalizer nobody removes) fails the spec.
func (c *Cluster) NewNamespace(ctx context.Context, prefix string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	c.Create(ctx, ns)
	c.SpecNamespace = ns.Name
	return ns.Name
}

// Create creates obj and deletes it after the spec (DeleteAfter).
func (c *Cluster) Create(ctx context.Context, obj client.Object) {
	GinkgoHelper()
	Expect(c.K8s.Create(ctx, obj)).To(Succeed(), "creating %T %s", obj, obj.GetName())
	c.DeleteAfter(obj)
}

// DeleteAfter deletes obj after the spec and waits until it is gone: an object with a proxy
// goes once the operator has removed its proxy and device.
func (c *Cluster) DeleteAfter(obj client.Object) {
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(c.K8s.Delete(ctx, obj))).To(Succeed())
		Eventually(ctx, func() error { return c.K8s.Get(ctx, client.ObjectKeyFromObject(obj), obj) }).
			Should(Satisfy(apierrors.IsNotFound), "%T %s still there", obj, obj.GetName())
	})
}

// The echo backend: agnhost netexec, as in config/samples, answering HTTP on 8080 (/echo?msg=)
// and UDP on 8081 ("echo <text>"), behind a Service with ports 80 (named http) and 8081.
const (
	DefaultBackendImage = "registry.k8s.io/e2e-test-images/agnhost:2.53"
	BackendName         = "echo" // the Service's and the Deployment's
	HTTPPort            = 80
	UDPPort             = 8081
)

// StartBackend runs the echo backend in ns, from image, behind the Service BackendName, and
// waits until it is available.
func (c *Cluster) StartBackend(ctx context.Context, ns, image string) {
	GinkgoHelper()
	c.Create(ctx, BackendService(ns, BackendName, corev1.ServiceTypeClusterIP))
	c.RunWorkload(ctx, ns, BackendName, image, "netexec", "--http-port=8080", fmt.Sprintf("--udp-port=%d", UDPPort))
}

// RunWorkload runs a Deployment name in ns of one container name, from image with args, its Pods
// labelled app=name, and waits until it is available.
func (c *Cluster) RunWorkload(ctx context.Context, ns, name, image string, args ...string) {
	GinkgoHelper()
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: image, Args: args}}},
			},
		},
	}
	c.Create(ctx, dep)
	Eventually(ctx, func(g Gomega) {
		g.Expect(c.K8s.Get(ctx, client.ObjectKeyFromObject(dep), dep)).To(Succeed())
		g.Expect(dep.Status.AvailableReplicas).To(BeNumerically(">=", 1))
	}).Should(Succeed(), "Deployment %s/%s available", ns, name)
}

// BackendService is a Service for the echo backend's Pods: HTTP at HTTPPort (named http) and UDP
// at UDPPort.
func BackendService(ns, name string, typ corev1.ServiceType) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": BackendName},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: HTTPPort, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
				{Name: "udp", Port: UDPPort, TargetPort: intstr.FromInt32(UDPPort), Protocol: corev1.ProtocolUDP},
			},
		},
	}
}

// Ingress is an Ingress of class tailscale for the echo backend at tailnet name host, on
// ProxyGroup group if set. It names the annotation as users write it.
func Ingress(ns, name, host, group string) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{host}}},
			DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
				Name: BackendName, Port: networkingv1.ServiceBackendPort{Name: "http"}}},
		},
	}
	if group != "" {
		ing.Annotations["tailscale.com/proxy-group"] = group
	}
	return ing
}

// ServedName waits for the Ingress's status to name it on the tailnet, as its TLS host followed
// by the tailnet's domain, and returns that name.
func (c *Cluster) ServedName(ctx context.Context, ing *networkingv1.Ingress) string {
	GinkgoHelper()
	host := ing.Spec.TLS[0].Hosts[0]
	var fqdn string
	Eventually(ctx, func(g Gomega) {
		g.Expect(c.K8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
		lb := ing.Status.LoadBalancer.Ingress
		g.Expect(lb).To(HaveLen(1))
		fqdn = lb[0].Hostname
	}).Should(Succeed(), "Ingress %s/%s status", ing.Namespace, ing.Name)
	Expect(fqdn).To(HavePrefix(host + "."))
	return fqdn
}

// ProxyGroup is an Ingress ProxyGroup of replicas.
func ProxyGroup(name string, replicas int32) *tsv1alpha1.ProxyGroup {
	return &tsv1alpha1.ProxyGroup{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress, Replicas: ptr.To(replicas)}}
}

// WaitGroupReady waits until the ProxyGroup reports Ready.
func (c *Cluster) WaitGroupReady(ctx context.Context, pg *tsv1alpha1.ProxyGroup) {
	GinkgoHelper()
	Eventually(ctx, func(g Gomega) {
		g.Expect(c.K8s.Get(ctx, client.ObjectKeyFromObject(pg), pg)).To(Succeed())
		g.Expect(meta.IsStatusConditionTrue(pg.Status.Conditions, tsv1alpha1.ProxyGroupReady)).To(BeTrue(), "conditions %v", pg.Status.Conditions)
	}).Should(Succeed(), "ProxyGroup %s ready", pg.Name)
}

// PodReady says whether the Pod is Ready and not being deleted.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil
		}
	}
	return false
}

// ProxyNamespaces are the namespaces proxy Pods run in: the operator's, and the privileged one
// (E2E_PRIVILEGED_NAMESPACE, which hack/kind-deploy.sh sets with the restricted overlay) where
// kernel-path proxies run apart.
func ProxyNamespaces(operatorNS string) []string {
	if priv := os.Getenv("E2E_PRIVILEGED_NAMESPACE"); priv != "" && priv != operatorNS {
		return []string{operatorNS, priv}
	}
	return []string{operatorNS}
}

// FindPod reads the Pod named name in the first of namespaces that has it.
func (c *Cluster) FindPod(ctx context.Context, namespaces []string, name string) (*corev1.Pod, error) {
	for _, ns := range namespaces {
		p := &corev1.Pod{}
		err := c.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)
		if err == nil {
			return p, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	return nil, apierrors.NewNotFound(corev1.Resource("pods"), fmt.Sprintf("%s (in %v)", name, namespaces))
}

// ListEach lists into list what opts select in each of namespaces: list holds them all.
func (c *Cluster) ListEach(ctx context.Context, list client.ObjectList, namespaces []string, opts ...client.ListOption) error {
	var all []runtime.Object
	for _, ns := range namespaces {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := c.K8s.List(ctx, l, append(opts, client.InNamespace(ns))...); err != nil {
			return err
		}
		items, err := meta.ExtractList(l)
		if err != nil {
			return err
		}
		all = append(all, items...)
	}
	return meta.SetList(list, all)
}
