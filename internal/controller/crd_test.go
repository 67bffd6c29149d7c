package controller

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
)

// These specs prove the generated CRDs' schema: defaults, validation and CEL rules, as the
// real API server applies them.
var _ = Describe("CRD validation", func() {
	pg := func(name string, mutate func(*tsv1alpha1.ProxyGroupSpec)) *tsv1alpha1.ProxyGroup {
		p := &tsv1alpha1.ProxyGroup{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress},
		}
		if mutate != nil {
			mutate(&p.Spec)
		}
		return p
	}
	expectInvalid := func(obj client.Object, msg string) {
		err := k8s.Create(ctx, obj)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring(msg))
	}

	It("accepts a minimal ProxyGroup and defaults its replicas to 2", func() {
		p := pg("crd-minimal", nil)
		Expect(k8s.Create(ctx, p)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, p)
		got := &tsv1alpha1.ProxyGroup{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		Expect(got.Spec.Replicas).To(Equal(ptr.To[int32](2)))
	})

	It("accepts a full ProxyGroup unchanged", func() {
		p := pg("crd-full", func(s *tsv1alpha1.ProxyGroupSpec) {
			s.Replicas = ptr.To[int32](0)
			s.Tags = []tsv1alpha1.Tag{"tag:k8s", "tag:web-1"}
			s.HostnamePrefix = "edge"
			s.ProxyClass = "staging"
		})
		Expect(k8s.Create(ctx, p)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, p)
		got := &tsv1alpha1.ProxyGroup{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		Expect(got.Spec).To(Equal(p.Spec))
	})

	It("rejects a change of type", func() {
		p := pg("crd-immutable", nil)
		Expect(k8s.Create(ctx, p)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, p)
		// A merge patch: the operator may have added its finalizer since the create.
		patch := client.MergeFrom(p.DeepCopy())
		p.Spec.Type = tsv1alpha1.ProxyGroupTypeEgress
		err := k8s.Patch(ctx, p, patch)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("type is immutable"))
	})

	It("refuses kubeAPIServer on a group of another type", func() {
		expectInvalid(pg("crd-apiserver", func(s *tsv1alpha1.ProxyGroupSpec) {
			s.KubeAPIServer = &tsv1alpha1.KubeAPIServerConfig{Hostname: "k8s-api"}
		}), "kubeAPIServer applies to ProxyGroups of type kube-apiserver only")
		p := pg("crd-apiserver", func(s *tsv1alpha1.ProxyGroupSpec) {
			s.Type = tsv1alpha1.ProxyGroupTypeKubeAPIServer
			s.KubeAPIServer = &tsv1alpha1.KubeAPIServerConfig{Hostname: "k8s-api", Mode: ptr.To("noauth")}
		})
		Expect(k8s.Create(ctx, p)).To(Succeed(), "a kube-apiserver group as the Tailscale operator's users write it")
		DeferCleanup(k8s.Delete, ctx, p)
	})

	It("rejects a change of tailnet", func() {
		p := pg("crd-tailnet", func(s *tsv1alpha1.ProxyGroupSpec) { s.Tailnet = "other" })
		Expect(k8s.Create(ctx, p)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, p)
		patch := client.MergeFrom(p.DeepCopy())
		p.Spec.Tailnet = "another"
		err := k8s.Patch(ctx, p, patch)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("ProxyGroup tailnet is immutable"))
	})

	It("rejects an unknown type", func() {
		expectInvalid(pg("crd-type", func(s *tsv1alpha1.ProxyGroupSpec) { s.Type = "connector" }), "spec.type")
	})

	It("rejects negative replicas", func() {
		expectInvalid(pg("crd-negative", func(s *tsv1alpha1.ProxyGroupSpec) { s.Replicas = ptr.To[int32](-1) }), "spec.replicas")
	})

	DescribeTable("rejects a bad tag",
		func(tag string) {
			expectInvalid(pg("crd-tag", func(s *tsv1alpha1.ProxyGroupSpec) { s.Tags = []tsv1alpha1.Tag{tsv1alpha1.Tag(tag)} }), "spec.tags[0]")
		},
		Entry("no prefix", "k8s"),
		Entry("digit first", "tag:1k8s"),
		Entry("underscore", "tag:k8s_web"),
		Entry("empty name", "tag:"),
	)

	It("rejects a bad hostname prefix", func() {
		expectInvalid(pg("crd-prefix", func(s *tsv1alpha1.ProxyGroupSpec) { s.HostnamePrefix = "Edge_" }), "spec.hostnamePrefix")
	})

	It("rejects a ServiceMonitor without metrics", func() {
		pc := &tsv1alpha1.ProxyClass{
			ObjectMeta: metav1.ObjectMeta{Name: "crd-sm"},
			Spec: tsv1alpha1.ProxyClassSpec{Metrics: &tsv1alpha1.Metrics{
				Enable: false, ServiceMonitor: &tsv1alpha1.ServiceMonitor{Enable: true},
			}},
		}
		expectInvalid(pc, "metrics.serviceMonitor.enable requires metrics.enable")
	})

	It("rejects a bad env variable name in a ProxyClass", func() {
		pc := &tsv1alpha1.ProxyClass{
			ObjectMeta: metav1.ObjectMeta{Name: "crd-env"},
			Spec: tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Pod: &tsv1alpha1.Pod{
				TailscaleContainer: &tsv1alpha1.Container{Env: []tsv1alpha1.Env{{Name: "1 BAD"}}},
			}}},
		}
		expectInvalid(pc, "env[0].name")
	})
})
