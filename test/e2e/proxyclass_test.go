//go:build e2e

package e2e

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/test/framework"
)

var _ = Describe("A ProxyClass", func() {
	It("puts its labels, resources and staging switch on the proxy of an Ingress that names it", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		pc := &tsv1alpha1.ProxyClass{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + framework.Token()},
			Spec: tsv1alpha1.ProxyClassSpec{
				UseLetsEncryptStagingEnvironment: true,
				StatefulSet: &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{
					Labels: map[string]string{"team": "e2e"},
					TailscaleContainer: &tsv1alpha1.Container{Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("40Mi")},
						Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("300Mi")},
					}},
				}},
			},
		}
		suite.Create(ctx, pc)
		ing := framework.Ingress(ns, "classy", "e2e-class-"+framework.Token(), "")
		ing.Labels = map[string]string{kit.LabelProxyClass: pc.Name}
		suite.Create(ctx, ing)

		// Not Ready: the staging CA is out of reach of the suite, so no certificate comes. The
		// local environment runs its proxies in one process, with one ACME directory: it leaves
		// this one Pending and says why.
		var pod *corev1.Pod
		if suite.localBackend != "" {
			pod = pendingProxyPod(ctx, "ingress", ns, ing.Name)
		} else {
			pod = proxyPod(ctx, "ingress", ns, ing.Name, false)
		}
		Expect(pod.Labels).To(HaveKeyWithValue("team", "e2e"))
		res := pod.Spec.Containers[0].Resources
		Expect(res.Requests.Memory().String()).To(Equal("40Mi"))
		Expect(res.Limits.Memory().String()).To(Equal("300Mi"))
		// The staging switch reaches the proxy through its config, which the Pod reads.
		secret := &corev1.Secret{}
		Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: suite.opNS, Name: pod.Name}, secret)).To(Succeed())
		cfg, _, err := contract.ProxyConfigs.Decode(secret.Data)
		Expect(err).NotTo(HaveOccurred())
		Expect(cfg.TLS.ACMEDirectoryURL).To(Equal(proxies.LetsEncryptStaging))
	})
})

var _ = Describe("An L7 proxy under the restricted Pod Security Standard", Serial, func() {
	It("is admitted, runs and serves HTTPS when the operator's namespace enforces restricted", func(ctx SpecContext) {
		opNS := &corev1.Namespace{}
		Expect(suite.K8s.Get(ctx, client.ObjectKey{Name: suite.opNS}, opNS)).To(Succeed())
		const enforce = "pod-security.kubernetes.io/enforce"
		before, had := opNS.Labels[enforce]
		setEnforce := func(ctx context.Context, level string, remove bool) {
			GinkgoHelper()
			ns := &corev1.Namespace{}
			Expect(suite.K8s.Get(ctx, client.ObjectKey{Name: suite.opNS}, ns)).To(Succeed())
			patch := client.MergeFrom(ns.DeepCopy())
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			if remove {
				delete(ns.Labels, enforce)
			} else {
				ns.Labels[enforce] = level
			}
			Expect(suite.K8s.Patch(ctx, ns, patch)).To(Succeed())
		}
		// The restricted overlay's namespace already enforces it, and a patch here would take
		// the label from the install's field manager.
		if before != "restricted" {
			setEnforce(ctx, "restricted", false)
			DeferCleanup(func(ctx SpecContext) { setEnforce(ctx, before, !had) })
		}

		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		host := "e2e-psa-" + framework.Token()
		ing := framework.Ingress(ns, "web", host, "")
		suite.Create(ctx, ing)
		pod := proxyPod(ctx, "ingress", ns, ing.Name, true)
		Expect(pod.Status.Phase).To(Equal(corev1.PodRunning))
		expectHTTPSEcho(ctx, suite.ServedName(ctx, ing))
	})
})

// proxyPod waits for the running (and, if asked, Ready) proxy Pod of a standalone parent (type
// ingress or svc) and returns it.
func proxyPod(ctx context.Context, parentType, ns, name string, ready bool) *corev1.Pod {
	GinkgoHelper()
	var pod corev1.Pod
	Eventually(ctx, func(g Gomega) {
		pod = onlyProxyPod(ctx, g, parentType, ns, name)
		g.Expect(pod.Status.Phase).To(Equal(corev1.PodRunning), "proxy Pod %s running", pod.Name)
		if ready {
			g.Expect(framework.PodReady(&pod)).To(BeTrue(), "proxy Pod %s Ready", pod.Name)
		}
	}).Should(Succeed())
	return &pod
}

// pendingProxyPod waits for the one proxy Pod of a parent that the local environment's kubelet
// stand-in reports it does not run.
func pendingProxyPod(ctx context.Context, parentType, ns, name string) *corev1.Pod {
	GinkgoHelper()
	var pod corev1.Pod
	Eventually(ctx, func(g Gomega) {
		pod = onlyProxyPod(ctx, g, parentType, ns, name)
		g.Expect(pod.Status.Conditions).To(ContainElement(And(
			HaveField("Type", corev1.PodScheduled), HaveField("Reason", "NotRunLocally"))), "proxy Pod %s left Pending", pod.Name)
	}).Should(Succeed())
	return &pod
}

// onlyProxyPod lists the proxy Pods of a parent and expects one.
func onlyProxyPod(ctx context.Context, g Gomega, parentType, ns, name string) corev1.Pod {
	pods := &corev1.PodList{}
	g.Expect(suite.ListEach(ctx, pods, proxyNamespaces(), client.MatchingLabels{
		kit.LabelParentType: parentType, kit.LabelParentNS: ns, kit.LabelParentName: name,
	})).To(Succeed())
	g.Expect(pods.Items).To(HaveLen(1), "the proxy Pod")
	return pods.Items[0]
}
