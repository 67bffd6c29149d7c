package controller

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// 200 objects on a 2-replica group: every one gets its entry and Tailscale Service, the group's
// Pods are not replaced after the first Service's roll onto the kernel path, and the documents spread over ConfigMaps within the shard bound
// (small in these tests), which the replicas may read.
var _ = Describe("A ProxyGroup with many objects", func() {
	It("configures 100 Ingresses and 100 Services without restarting replicas after the first Service's roll", func() {
		pg := newProxyGroup("many", func(p *tsv1alpha1.ProxyGroup) {})
		DeferCleanup(k8s.Delete, ctx, pg)
		ns := newNamespace()
		newBackendService(ns, "web")
		onGroup := func(s *corev1.Service) { s.Annotations = map[string]string{kit.AnnotationProxyGroup: "many"} }
		// The first Service rolls the replicas onto the kernel path, once; none is replaced after.
		newService(ns, "db-000", onGroup)
		awaitKernelReplicas("many", 2)
		pods := map[string]string{}
		Eventually(func(g Gomega) {
			for i := range 2 {
				pod := &corev1.Pod{}
				g.Expect(k8s.Get(ctx, nsKey(fmt.Sprintf("many-%d", i)), pod)).To(Succeed())
				pods[pod.Name] = string(pod.UID)
			}
		}).Should(Succeed())

		start := time.Now()
		for i := range 100 {
			newIngress(ns, fmt.Sprintf("site-%03d", i), func(ing *networkingv1.Ingress) {
				ing.Annotations = map[string]string{kit.AnnotationProxyGroup: "many"}
			})
			if i > 0 {
				newService(ns, fmt.Sprintf("db-%03d", i), onGroup)
			}
		}
		Eventually(func(g Gomega) {
			serve, dnat := groupDocuments(g, "many")
			g.Expect(serve.Services).To(HaveLen(100))
			g.Expect(dnat.Services).To(HaveLen(100))
		}, "3m", "500ms").Should(Succeed())
		Eventually(func(g Gomega) []string { return olderProxyAdvertises(g, "many", 1) }, "1m").Should(HaveLen(200))
		GinkgoWriter.Printf("200 objects configured in %s\n", time.Since(start))

		shards := readGroupShards(Default, "many")
		Expect(len(shards)).To(BeNumerically(">", 1))
		total := 0
		for _, data := range shards {
			size := 0
			for _, v := range data {
				size += len(v)
			}
			Expect(size).To(BeNumerically("<=", testSetup.GroupShardBytes))
			total += size
		}
		AddReportEntry("group documents for 200 objects (bytes)", total)
		AddReportEntry("group ConfigMaps for 200 objects", len(shards))
		role := &rbacv1.Role{}
		Expect(k8s.Get(ctx, nsKey("many"), role)).To(Succeed())
		Expect(role.Rules[0].ResourceNames).To(HaveLen(len(shards)), "the replicas may read every shard")

		By("reading the replicas' reports spread over as many Secrets as the documents")
		_, dnat := groupDocuments(Default, "many")
		services := slices.Sorted(maps.Keys(dnat.Services))
		// In a tailnet of its own: the certificates of its 100 Ingresses count against that
		// tailnet's limits, not the one the other specs share.
		report := func(advertised []string) contract.ProxyState {
			return contract.ProxyState{FQDN: "many.scale.test", Advertised: advertised}
		}
		for i := range 2 {
			reportReplicaSharded("many", i, report(services), len(shards))
		}
		configured := func(svcName string) func(g Gomega) string {
			return func(g Gomega) string {
				svc := &corev1.Service{}
				g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: strings.TrimPrefix(svcName, "svc:"+ns+"-")}, svc)).To(Succeed())
				c := meta.FindStatusCondition(svc.Status.Conditions, kit.ConditionIngressSvcConfigured)
				g.Expect(c).NotTo(BeNil())
				return c.Message
			}
		}
		for _, name := range services {
			Eventually(configured(name), "1m").Should(HavePrefix("2/2 "), name)
		}
		// A change in one report Secret other than the state Secret, alone.
		withdrawn := ""
		for _, name := range services {
			if contract.ShardOf(contract.ReportService(name), len(shards)) > 0 {
				withdrawn = name
				break
			}
		}
		Expect(withdrawn).NotTo(BeEmpty())
		reportReplicaSharded("many", 1, report(slices.DeleteFunc(slices.Clone(services), func(s string) bool { return s == withdrawn })), len(shards))
		Eventually(configured(withdrawn)).Should(HavePrefix("1/2 "))

		for name, uid := range pods {
			pod := &corev1.Pod{}
			Expect(k8s.Get(ctx, nsKey(name), pod)).To(Succeed())
			Expect(string(pod.UID)).To(Equal(uid), "replica %s was replaced", name)
		}
		Expect(k8s.DeleteAllOf(ctx, &networkingv1.Ingress{}, client.InNamespace(ns))).To(Succeed())
	})
})
