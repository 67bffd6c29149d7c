package controller

import (
	"fmt"
	"maps"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

func newProxyGroup(name string, mutate func(*tsv1alpha1.ProxyGroup)) *tsv1alpha1.ProxyGroup {
	pg := &tsv1alpha1.ProxyGroup{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress}}
	if mutate != nil {
		mutate(pg)
	}
	Expect(k8s.Create(ctx, pg)).To(Succeed())
	return pg
}

func nsKey(name string) client.ObjectKey {
	return client.ObjectKey{Namespace: testSetup.Namespace, Name: name}
}

func replicaConfig(g Gomega, pg string, i int) *contract.ProxyConfig {
	s := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, nsKey(fmt.Sprintf("%s-%d-config", pg, i)), s)).To(Succeed())
	cfg, _, err := contract.ProxyConfigs.Decode(s.Data)
	g.Expect(err).NotTo(HaveOccurred())
	return cfg
}

// olderProxyAdvertises is what replica i may advertise when it runs a proxy that reads configs
// before v4: the list in its config's oldest version.
func olderProxyAdvertises(g Gomega, pg string, i int) []string {
	s := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, nsKey(fmt.Sprintf("%s-%d-config", pg, i)), s)).To(Succeed())
	g.Expect(s.Data).To(HaveKey("proxy-config.v1.json"))
	cfg, v, err := contract.ProxyConfigs.Decode(map[string][]byte{"proxy-config.v1.json": s.Data["proxy-config.v1.json"]})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(v).To(Equal(1))
	return cfg.AdvertiseServices
}

// reportReplica plays replica i: it writes state for its live Pod.
func reportReplica(pg string, i int, st contract.ProxyState) { reportReplicaSharded(pg, i, st, 1) }

// reportReplicaSharded plays replica i of a group whose documents are in count shards: it
// writes state for its live Pod over its state Secret and count-1 report Secrets, as the
// proxy does (contract.SplitReport).
func reportReplicaSharded(pg string, i int, st contract.ProxyState, count int) {
	name := fmt.Sprintf("%s-%d", pg, i)
	pod := &corev1.Pod{}
	Eventually(func() error { return k8s.Get(ctx, nsKey(name), pod) }).Should(Succeed(), "replica Pod %s", name)
	st.PodUID = string(pod.UID)
	data, err := st.Data()
	Expect(err).NotTo(HaveOccurred())
	shards, err := contract.SplitReport(data, count)
	Expect(err).NotTo(HaveOccurred())
	for k, shard := range shards {
		s := &corev1.Secret{}
		Eventually(func() error { return k8s.Get(ctx, nsKey(contract.ReportShardName(name, k)), s) }).Should(Succeed())
		patch := client.MergeFrom(s.DeepCopy())
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		for k, v := range shard {
			s.Data[k] = v
		}
		Expect(k8s.Patch(ctx, s, patch, client.FieldOwner("proxy"))).To(Succeed())
	}
}

// awaitKernelReplicas waits until the n replicas of group pg run on the kernel path, which the
// first Service put on a group rolls them onto, so that what a spec reports is for those Pods.
func awaitKernelReplicas(pg string, n int) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		sts := &appsv1.StatefulSet{}
		g.Expect(k8s.Get(ctx, nsKey(pg), sts)).To(Succeed())
		args := sts.Spec.Template.Spec.Containers[0].Args
		g.Expect(args).NotTo(ContainElement("--group-l7-only"))
		for i := range n {
			pod := &corev1.Pod{}
			g.Expect(k8s.Get(ctx, nsKey(fmt.Sprintf("%s-%d", pg, i)), pod)).To(Succeed())
			g.Expect(pod.Spec.Containers[0].Args).To(Equal(args), "replica %d rolled", i)
		}
	}, "1m").Should(Succeed())
}

func groupCondition(name, typ string) func(g Gomega) *metav1.Condition {
	return func(g Gomega) *metav1.Condition {
		pg := &tsv1alpha1.ProxyGroup{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, pg)).To(Succeed())
		c := meta.FindStatusCondition(pg.Status.Conditions, typ)
		g.Expect(c).NotTo(BeNil())
		return c
	}
}

var _ = Describe("ProxyGroup reconciler", func() {
	It("runs the replicas, reports readiness per replica, scales down cleanly and deletes", func() {
		pg := newProxyGroup("edge", func(p *tsv1alpha1.ProxyGroup) {
			p.Spec.HostnamePrefix = "edge-proxy"
			p.Spec.Tags = []tsv1alpha1.Tag{"tag:k8s"}
		})

		By("creating one config and one state Secret per replica, the -0 replica issuing certificates")
		var cfg0, cfg1 *contract.ProxyConfig
		Eventually(func(g Gomega) {
			cfg0, cfg1 = replicaConfig(g, "edge", 0), replicaConfig(g, "edge", 1)
		}).Should(Succeed())
		Expect(cfg0.Hostname).To(Equal("edge-proxy-0"))
		Expect(cfg1.Hostname).To(Equal("edge-proxy-1"))
		Expect(cfg0.TLS.CertShareMode).To(Equal(contract.CertIssuer))
		Expect(cfg1.TLS.CertShareMode).To(Equal(contract.CertReader))
		Expect(cfg0.AuthKey).NotTo(BeEmpty())
		Expect(cfg0.AuthKey).NotTo(Equal(cfg1.AuthKey), "one single-use key per replica")
		Expect(cfg0.StateSecret).To(Equal("edge-0"))
		Expect(k8s.Get(ctx, nsKey("edge-0"), &corev1.Secret{})).To(Succeed())
		// Written in the same pass as the Secrets, after them.
		Eventually(func() error { return k8s.Get(ctx, nsKey("edge"+proxies.GroupConfigMapSuffix), &corev1.ConfigMap{}) }).Should(Succeed())

		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(ctx, nsKey("edge"), sts) }).Should(Succeed())
		Expect(*sts.Spec.Replicas).To(BeEquivalentTo(2))
		Expect(sts.Spec.Template.Spec.Containers[0].Args).To(ContainElements(
			"--config-secret=$(POD_NAME)-config", "--group-configmap=edge"+proxies.GroupConfigMapSuffix))
		Expect(metav1.IsControlledBy(sts, pg)).To(BeTrue())
		role := &rbacv1.Role{}
		Expect(k8s.Get(ctx, nsKey("edge"), role)).To(Succeed())
		Expect(role.Rules).To(ContainElement(HaveField("ResourceNames", ConsistOf("edge-0-config", "edge-0", "edge-1-config", "edge-1"))))

		Eventually(groupCondition("edge", tsv1alpha1.ProxyGroupReady)).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Message", ContainSubstring("0/2"))))

		By("becoming available with one replica up and ready with both")
		reportReplica("edge", 0, contract.ProxyState{DeviceID: "nEdge0", FQDN: "edge-proxy-0.tailnet.test", TailnetIPs: []string{"100.64.0.20"}})
		Eventually(groupCondition("edge", tsv1alpha1.ProxyGroupAvailable)).Should(HaveField("Status", metav1.ConditionTrue))
		Expect(groupCondition("edge", tsv1alpha1.ProxyGroupReady)(Default)).To(HaveField("Status", metav1.ConditionFalse))
		reportReplica("edge", 1, contract.ProxyState{DeviceID: "nEdge1", FQDN: "edge-proxy-1.tailnet.test", TailnetIPs: []string{"100.64.0.21"}, ConfigVersion: 4})
		Eventually(groupCondition("edge", tsv1alpha1.ProxyGroupReady)).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Reason", kit.ReasonProxyGroupReady)))

		By("writing v4 and newer, without the list of services, to a replica that reads v4")
		configKeys := func(name string) func(g Gomega) []string {
			return func(g Gomega) []string {
				s := &corev1.Secret{}
				g.Expect(k8s.Get(ctx, nsKey(name), s)).To(Succeed())
				return slices.Sorted(maps.Keys(s.Data))
			}
		}
		newest := contract.ProxyConfigs.Keys()[0]
		Eventually(configKeys("edge-1-config")).Should(ConsistOf("proxy-config.v4.json", newest))
		Expect(configKeys("edge-0-config")(Default)).To(ConsistOf("proxy-config.v1.json", newest),
			"a replica that has not said what it reads gets the oldest version too")
		Expect(k8s.Get(ctx, client.ObjectKey{Name: "edge"}, pg)).To(Succeed())
		Expect(pg.Status.Devices).To(ConsistOf(
			tsv1alpha1.TailnetDevice{Hostname: "edge-proxy-0.tailnet.test", TailnetIPs: []string{"100.64.0.20"}},
			tsv1alpha1.TailnetDevice{Hostname: "edge-proxy-1.tailnet.test", TailnetIPs: []string{"100.64.0.21"}}))
		Eventually(func(g Gomega) string { return replicaConfig(g, "edge", 0).AuthKey }).Should(BeEmpty(), "a logged-in replica loses its key")

		By("scaling down: the surplus replica's Secrets go")
		patch := client.MergeFrom(pg.DeepCopy())
		pg.Spec.Replicas = ptr.To[int32](1)
		Expect(k8s.Patch(ctx, pg, patch)).To(Succeed())
		expectGone(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: "edge-1"}})
		expectGone(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: "edge-1-config"}})
		Eventually(func(g Gomega) int32 {
			g.Expect(k8s.Get(ctx, nsKey("edge"), sts)).To(Succeed())
			return *sts.Spec.Replicas
		}).Should(BeEquivalentTo(1))
		Eventually(groupCondition("edge", tsv1alpha1.ProxyGroupReady)).Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Message", ContainSubstring("1/1"))))

		By("deleting: the finalizer goes once the devices are removed, the children with their owner")
		Expect(k8s.Delete(ctx, pg)).To(Succeed())
		expectGone(pg)
		expectGone(sts)
	})

	It("runs a group of Ingresses unprivileged, as the restricted Pod Security standard admits, and on the kernel path while a Service is on it", func() {
		pg := newProxyGroup("l7-group", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)
		ns := newNamespace()
		newBackendService(ns, "web")
		newIngress(ns, "on-l7-group", func(i *networkingv1.Ingress) { i.Annotations = map[string]string{kit.AnnotationProxyGroup: "l7-group"} })
		restricted := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restricted-" + ns,
			Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
		Expect(k8s.Create(ctx, restricted)).To(Succeed())
		// The API server's PodSecurity admission judges a Pod of the group's template, created
		// there as a dry run.
		admitted := func(sts *appsv1.StatefulSet) error {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: restricted.Name, Name: "replica"}, Spec: sts.Spec.Template.Spec}
			return k8s.Create(ctx, pod, client.DryRunAll)
		}
		template := func(g Gomega) *appsv1.StatefulSet {
			sts := &appsv1.StatefulSet{}
			g.Expect(k8s.Get(ctx, nsKey("l7-group"), sts)).To(Succeed())
			return sts
		}

		By("building replicas without root, capabilities, a TUN device or an init container")
		Eventually(func(g Gomega) {
			sts := template(g)
			spec := sts.Spec.Template.Spec
			g.Expect(spec.InitContainers).To(BeEmpty())
			g.Expect(spec.Volumes).NotTo(ContainElement(HaveField("HostPath", Not(BeNil()))))
			c := spec.Containers[0]
			g.Expect(c.Args).To(ContainElement("--group-l7-only"))
			g.Expect(c.SecurityContext.Capabilities.Add).To(BeEmpty())
			g.Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
			g.Expect(spec.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
			g.Expect(admitted(sts)).To(Succeed())
		}).Should(Succeed())

		By("moving onto the kernel path once a Service is put on the group, which restricted refuses")
		svc := newService(ns, "db", func(s *corev1.Service) { s.Annotations = map[string]string{kit.AnnotationProxyGroup: "l7-group"} })
		Eventually(func(g Gomega) {
			sts := template(g)
			c := sts.Spec.Template.Spec.Containers[0]
			g.Expect(c.Args).NotTo(ContainElement("--group-l7-only"))
			g.Expect(c.SecurityContext.Capabilities.Add).To(ContainElement(corev1.Capability("NET_ADMIN")))
			err := admitted(sts)
			g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a kernel replica in a restricted namespace: want Forbidden, got %v", err)
		}).Should(Succeed())

		By("back to unprivileged once the Service is taken off")
		Expect(k8s.Delete(ctx, svc)).To(Succeed())
		Eventually(func(g Gomega) {
			sts := template(g)
			g.Expect(sts.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--group-l7-only"))
			g.Expect(admitted(sts)).To(Succeed())
		}).Should(Succeed())
	})

	It("refuses a type it does not serve", func() {
		pg := newProxyGroup("egress-group", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Type = tsv1alpha1.ProxyGroupTypeEgress })
		DeferCleanup(k8s.Delete, ctx, pg)
		Eventually(groupCondition("egress-group", tsv1alpha1.ProxyGroupReady)).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyGroupInvalid)))
		Eventually(func(g Gomega) []string { return eventReasons(g, "ProxyGroup", "egress-group") }).Should(ContainElement(kit.ReasonProxyGroupInvalid))
		Expect(apierrors.IsNotFound(k8s.Get(ctx, nsKey("egress-group"), &appsv1.StatefulSet{}))).To(BeTrue())
	})

	It("refuses more replicas than the operator's maximum, leaving the group as it was and minting nothing for them", func() {
		pg := newProxyGroup("big-group", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)
		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(ctx, nsKey("big-group"), sts) }).Should(Succeed())

		over := int32(testSetup.GroupReplicasLimit() + 1)
		// Retried: the operator may be writing the group (its finalizer, its status) meanwhile.
		Eventually(func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(pg), pg); err != nil {
				return err
			}
			pg.Spec.Replicas = ptr.To(over)
			return k8s.Update(ctx, pg)
		}).Should(Succeed())
		Eventually(groupCondition("big-group", tsv1alpha1.ProxyGroupReady)).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyGroupInvalid),
			HaveField("Message", ContainSubstring(fmt.Sprintf("replicas %d is over this operator's maximum of %d", over, over-1)))))
		Eventually(func(g Gomega) []string { return eventReasons(g, "ProxyGroup", "big-group") }).Should(ContainElement(kit.ReasonProxyGroupInvalid))
		Consistently(func(g Gomega) {
			g.Expect(k8s.Get(ctx, nsKey("big-group"), sts)).To(Succeed())
			g.Expect(*sts.Spec.Replicas).To(BeEquivalentTo(1))
			g.Expect(apierrors.IsNotFound(k8s.Get(ctx, nsKey("big-group-1-config"), &corev1.Secret{}))).To(BeTrue(), "no config (nor key) for a second replica")
		}, 2*time.Second).Should(Succeed())
	})

	It("refuses a group that names another tailnet", func() {
		pg := newProxyGroup("other-tailnet", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Tailnet = "team-b" })
		DeferCleanup(k8s.Delete, ctx, pg)
		Eventually(groupCondition("other-tailnet", tsv1alpha1.ProxyGroupReady)).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyGroupInvalid),
			HaveField("Message", ContainSubstring(`spec.tailnet "team-b"`))))
		Eventually(func(g Gomega) []string { return eventReasons(g, "ProxyGroup", "other-tailnet") }).Should(ContainElement(kit.ReasonProxyGroupInvalid))
		Expect(apierrors.IsNotFound(k8s.Get(ctx, nsKey("other-tailnet"), &appsv1.StatefulSet{}))).To(BeTrue())
		Expect(apierrors.IsNotFound(k8s.Get(ctx, nsKey("other-tailnet-0-config"), &corev1.Secret{}))).To(BeTrue(), "no config, no key")
	})

	It("reports a Tailnet as not served, once, with TailnetReady=False", func() {
		tn := &tsv1alpha1.Tailnet{ObjectMeta: metav1.ObjectMeta{Name: "team-b"},
			Spec: tsv1alpha1.TailnetSpec{LoginURL: "https://headscale.example.com", Credentials: tsv1alpha1.TailnetCredentials{SecretName: "team-b-oauth"}}}
		Expect(k8s.Create(ctx, tn)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, tn)
		Eventually(func(g Gomega) *metav1.Condition {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(tn), tn)).To(Succeed())
			return meta.FindStatusCondition(tn.Status.Conditions, tsv1alpha1.TailnetReady)
		}).Should(And(Not(BeNil()), HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonTailnetNotServed),
			HaveField("Message", And(ContainSubstring("https://headscale.example.com"), ContainSubstring("team-b-oauth")))))
		Eventually(func(g Gomega) []string { return eventReasons(g, "Tailnet", "team-b") }).Should(Equal([]string{kit.ReasonTailnetNotServed}))
		Consistently(func(g Gomega) []string { return eventReasons(g, "Tailnet", "team-b") }, "2s").Should(HaveLen(1), "no hot loop")
	})

	It("waits for its ProxyClass", func() {
		pg := newProxyGroup("classy-group", func(p *tsv1alpha1.ProxyGroup) { p.Spec.ProxyClass = "missing-class" })
		DeferCleanup(k8s.Delete, ctx, pg)
		Eventually(groupCondition("classy-group", tsv1alpha1.ProxyGroupReady)).Should(And(
			HaveField("Reason", kit.ReasonProxyGroupPending), HaveField("Message", ContainSubstring("missing-class"))))
	})
})

var _ = Describe("ProxyGroup availability", func() {
	It("follows the replicas while its ProxyClass is re-validated", func() {
		pc := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "avail-class"},
			Spec: tsv1alpha1.ProxyClassSpec{StatefulSet: &tsv1alpha1.StatefulSet{Labels: map[string]string{"team": "edge"}}}}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		pg := newProxyGroup("avail", func(p *tsv1alpha1.ProxyGroup) {
			p.Spec.Replicas = ptr.To[int32](1)
			p.Spec.ProxyClass = "avail-class"
		})
		DeferCleanup(k8s.Delete, ctx, pg)
		reportReplica("avail", 0, contract.ProxyState{DeviceID: "nAvail0", FQDN: "avail-0.tailnet.test", TailnetIPs: []string{"100.64.0.30"}})
		Eventually(groupCondition("avail", tsv1alpha1.ProxyGroupReady)).Should(HaveField("Status", metav1.ConditionTrue))
		Expect(groupCondition("avail", tsv1alpha1.ProxyGroupAvailable)(Default)).To(HaveField("Status", metav1.ConditionTrue))

		By("breaking the ProxyClass: the group is not ready, but its replica keeps serving")
		patch := client.MergeFrom(pc.DeepCopy())
		pc.Spec.StatefulSet.Labels = map[string]string{"bad key!": "x"}
		Expect(k8s.Patch(ctx, pc, patch)).To(Succeed())
		Eventually(groupCondition("avail", tsv1alpha1.ProxyGroupReady)).Should(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", kit.ReasonProxyGroupPending)))
		Consistently(groupCondition("avail", tsv1alpha1.ProxyGroupAvailable), "1s").Should(And(
			HaveField("Status", metav1.ConditionTrue), HaveField("Message", ContainSubstring("1/1"))))
	})
})
