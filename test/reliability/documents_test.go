package reliability

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// The documents between the operator and its proxies live in Secrets and ConfigMaps anyone with
// access can edit. A hand edit must not stick where the operator owns the document, must not
// cost the other objects their entries, and must not start a loop.
var _ = Describe("Documents edited by hand", Ordered, func() {
	const group = "docs-pg"
	var (
		ns       string
		healed   []string
		groupCM  = client.ObjectKey{Namespace: opNS, Name: group + "-ingress-config"}
		entries  = []string{"svc:docs-web", "svc:docs-db"}
		standing *corev1.Secret // a standalone proxy's config Secret as the operator wrote it
	)

	// configSecret finds the config (and state) Secret of a standalone Ingress's proxy.
	configSecret := func(g Gomega, name string) *corev1.Secret {
		list := &corev1.SecretList{}
		g.Expect(k8s.List(context.Background(), list, client.InNamespace(opNS), client.MatchingLabels{
			kit.LabelParentName: name, kit.LabelParentNS: ns, kit.LabelSecretType: "config-state"})).To(Succeed())
		g.Expect(list.Items).To(HaveLen(1), "the config Secret of %s", name)
		return &list.Items[0]
	}
	// groupEntries checks that the group's documents carry every entry.
	groupEntries := func(g Gomega) {
		cm := &corev1.ConfigMap{}
		g.Expect(k8s.Get(context.Background(), groupCM, cm)).To(Succeed())
		serve, _, err := contract.ServeConfigs.Decode(cmDataBytes(cm))
		g.Expect(err).NotTo(HaveOccurred(), "the Serve config")
		g.Expect(serve.Services).To(HaveKey(entries[0]))
		dnat, _, err := contract.DNATConfigs.Decode(cmDataBytes(cm))
		g.Expect(err).NotTo(HaveOccurred(), "the DNAT config")
		g.Expect(dnat.Services).To(HaveKey(entries[1]))
	}
	// edit changes an object as a user would (an update by another field manager).
	edit := func(obj client.Object, change func()) {
		GinkgoHelper()
		Eventually(func() error {
			if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
				return err
			}
			change()
			return k8s.Update(context.Background(), obj, client.FieldOwner("kubectl-edit"))
		}).Should(Succeed())
	}
	restored := func(what string, check func(g Gomega)) {
		GinkgoHelper()
		start := time.Now()
		Eventually(check).Should(Succeed(), what)
		settle()
		Expect(opLog.panicsSeen()).To(BeEmpty())
		operatorStillRunning()
		healed = append(healed, fmt.Sprintf("| %s | %s |", what, time.Since(start).Round(100*time.Millisecond)))
	}

	BeforeAll(func() {
		ns = newNamespace("docs")
		create(echoService(ns, "echo"))
		create(proxyGroup(group, tsv1alpha1.ProxyGroupTypeIngress))
		create(ingress(ns, "web", "docs-web", onGroup(group)))
		create(lbService(ns, "db", svcAnnotate(kit.AnnotationProxyGroup, group, kit.AnnotationHostname, "docs-db")))
		create(ingress(ns, "alone", "docs-alone"))
		Eventually(groupEntries).Should(Succeed())
		Eventually(func(g Gomega) {
			s := configSecret(g, "alone")
			_, _, err := contract.ProxyConfigs.Decode(s.Data)
			g.Expect(err).NotTo(HaveOccurred())
			standing = s
		}).Should(Succeed())
		settle()
	})

	// sameConfig checks that every version the operator writes is back, saying what it said
	// before. Only the auth key may differ: without a proxy logged in (none runs here), a
	// config the operator cannot read gets a new key.
	sameConfig := func(g Gomega) {
		s := configSecret(g, "alone")
		for _, k := range contract.ProxyConfigs.Keys() {
			if _, ok := standing.Data[k]; !ok {
				continue
			}
			got, _, err := contract.ProxyConfigs.Decode(map[string][]byte{k: s.Data[k]})
			g.Expect(err).NotTo(HaveOccurred(), "key %s", k)
			want, _, err := contract.ProxyConfigs.Decode(map[string][]byte{k: standing.Data[k]})
			g.Expect(err).NotTo(HaveOccurred())
			got.AuthKey, want.AuthKey = "", ""
			g.Expect(got).To(Equal(want), "key %s", k)
		}
	}

	It("restores a proxy config document overwritten with garbage", func() {
		s := configSecret(Default, "alone")
		edit(s, func() { s.Data[contract.ProxyConfigs.Keys()[0]] = []byte("{garbage") })
		restored("a standalone proxy's config document overwritten with garbage", sameConfig)
	})

	It("restores a proxy config of which only a future version is left", func() {
		s := configSecret(Default, "alone")
		edit(s, func() {
			for _, k := range contract.ProxyConfigs.Keys() {
				delete(s.Data, k)
			}
			s.Data["proxy-config.v99.json"] = []byte(`{"version":99,"kind":"ingress","somethingNew":true}`)
		})
		restored("a standalone proxy's config left with only a future version (v99)", sameConfig)
	})

	It("recreates a deleted config Secret", func() {
		s := configSecret(Default, "alone")
		Expect(k8s.Delete(context.Background(), s)).To(Succeed())
		restored("a standalone proxy's config Secret deleted", func(g Gomega) {
			s := configSecret(g, "alone")
			g.Expect(s.UID).NotTo(Equal(standing.UID))
			cfg, _, err := contract.ProxyConfigs.Decode(s.Data)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cfg.AuthKey).NotTo(BeEmpty(), "a new auth key for the proxy, which lost its state with the Secret")
		})
		standing = configSecret(Default, "alone")
	})

	It("keeps serving from a state Secret holding garbage, and says why", func() {
		s := configSecret(Default, "alone")
		edit(s, func() { s.Data[contract.StateDeviceIPs] = []byte("[garbage") })
		restored("a standalone proxy's state holding garbage", func(g Gomega) {
			sameConfig(g)
			g.Expect(warnings(g, ingressUID(g, ns, "alone"))).To(ContainElement(kit.ReasonProxyStateInvalid))
		})
	})

	It("restores a group's Serve config overwritten with garbage, with every object's entry", func() {
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(context.Background(), groupCM, cm)).To(Succeed())
		edit(cm, func() {
			for _, k := range contract.ServeConfigs.Keys() {
				if _, ok := cm.Data[k]; ok {
					cm.Data[k] = "garbage"
				}
			}
		})
		restored("a ProxyGroup's Serve config overwritten with garbage", groupEntries)
	})

	It("restores a group's documents of which only a future version is left", func() {
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(context.Background(), groupCM, cm)).To(Succeed())
		edit(cm, func() {
			for k := range cm.Data {
				if strings.HasPrefix(k, "serve-config.") || strings.HasPrefix(k, "dnat-config.") {
					delete(cm.Data, k)
				}
			}
			cm.Data["serve-config.v99.json"] = `{"version":99}`
			cm.Data["dnat-config.v99.json"] = `{"version":99}`
		})
		restored("a ProxyGroup's documents left with only a future version (v99)", groupEntries)
	})

	It("keeps every entry when the owner index holds garbage", func() {
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(context.Background(), groupCM, cm)).To(Succeed())
		edit(cm, func() { cm.Data["owners.json"] = "[not an object" })
		restored("a ProxyGroup's owner index overwritten with garbage", groupEntries)
	})

	It("recreates a deleted group ConfigMap with every entry", func() {
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(context.Background(), groupCM, cm)).To(Succeed())
		Expect(k8s.Delete(context.Background(), cm)).To(Succeed())
		restored("a ProxyGroup's ConfigMap deleted", func(g Gomega) {
			now := &corev1.ConfigMap{}
			g.Expect(k8s.Get(context.Background(), groupCM, now)).To(Succeed())
			g.Expect(now.UID).NotTo(Equal(cm.UID))
			groupEntries(g)
		})
	})

	It("ignores a replica state Secret holding garbage", func() {
		s := &corev1.Secret{}
		Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: opNS, Name: group + "-0"}, s)).To(Succeed())
		edit(s, func() {
			if s.Data == nil {
				s.Data = map[string][]byte{}
			}
			s.Data[contract.StateFirewall] = []byte("{garbage")
			s.Data[contract.StateAdvertised] = []byte("not json")
		})
		restored("a ProxyGroup replica's state holding garbage", func(g Gomega) {
			groupEntries(g)
			pg := &tsv1alpha1.ProxyGroup{}
			g.Expect(k8s.Get(context.Background(), client.ObjectKey{Name: group}, pg)).To(Succeed())
			g.Expect(pg.DeletionTimestamp).To(BeNil())
		})
	})

	AfterAll(func() {
		if len(healed) == 0 {
			return
		}
		report.add("### Documents edited by hand (envtest)\n\nEach edit is undone or survived by the operator, with every object's " +
			"entry kept, no panic, and the operator idle again afterwards.\n\n| Edit | Back to normal after |\n| --- | --- |\n" +
			strings.Join(healed, "\n"))
	})
})

func ingressUID(g Gomega, ns, name string) types.UID {
	ing := &networkingv1.Ingress{}
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, ing)).To(Succeed())
	return ing.UID
}
