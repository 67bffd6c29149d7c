package controller

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"tailscale.com/net/netns"
	tsnetserver "tailscale.com/tsnet"
	"tailscale.com/types/logger"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// loginDevice logs an in-process node into the local tailnet with authKey, and returns its
// device ID.
func loginDevice(hostname, authKey string) string {
	netns.SetEnabled(false) // an in-process node, without privileges
	node := &tsnetserver.Server{Dir: GinkgoT().TempDir(), ControlURL: tsnet.ControlURL, Hostname: hostname,
		AuthKey: authKey, Logf: logger.Discard, UserLogf: logger.Discard}
	DeferCleanup(node.Close)
	st, err := node.Up(ctx)
	Expect(err).NotTo(HaveOccurred())
	return string(st.Self.ID)
}

// deviceExists reports whether the tailnet still has the device.
func deviceExists(id string) bool {
	_, err := tsClient.Device(ctx, id)
	Expect(tailnet.IsNotFound(err) || err == nil).To(BeTrue(), "reading device %s: %v", id, err)
	return err == nil
}

// A proxy writes its own state Secret, so what it names there is no proof: the operator deletes
// a device only when the tailnet API shows it is the one the proxy's key was minted for.
var _ = Describe("Device deletion", func() {
	It("leaves a device that a proxy's state names but that its key did not log in, with a Warning Event", func() {
		By("a device of the tailnet that is not the proxy's")
		key, err := tsClient.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour, Description: "not a proxy"})
		Expect(err).NotTo(HaveOccurred())
		victim := loginDevice("bystander", key.Secret.Reveal())

		ns := newNamespace()
		newBackendService(ns, "web")
		created := newIngress(ns, "planted", nil)
		ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "planted"}}
		Eventually(func(g Gomega) {
			g.Expect(proxyConfigOf(g, proxies.ParentTypeIngress, ing).AuthKey).NotTo(BeEmpty())
		}).Should(Succeed())
		By("the proxy naming that device in its state Secret")
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: victim, FQDN: "bystander.tailnet.test"})

		Expect(k8s.Delete(ctx, created)).To(Succeed())
		expectGone(created)
		Expect(deviceExists(victim)).To(BeTrue(), "the device the proxy named is still there")
		Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(kit.ReasonDeviceNotMinted))
	})

	It("deletes the device that logged in with the proxy's key, not another one its state names later", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		created := newIngress(ns, "pinned", nil)
		ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pinned"}}
		var cfg *contract.ProxyConfig
		Eventually(func(g Gomega) {
			cfg = proxyConfigOf(g, proxies.ParentTypeIngress, ing)
			g.Expect(cfg.AuthKey).NotTo(BeEmpty())
		}).Should(Succeed())
		own := loginDevice(cfg.Hostname, cfg.AuthKey)
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: own, FQDN: cfg.Hostname + ".tailnet.test"})
		Eventually(func(g Gomega) {
			sa := &corev1.ServiceAccount{}
			g.Expect(k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, ing), sa)).To(Succeed())
			g.Expect(sa.Annotations[proxies.AnnotationMinted+"0"]).To(ContainSubstring(`"deviceID":"` + own + `"`))
		}).Should(Succeed(), "the operator records the device that logged in with the key")

		By("a later device with the proxy's hostname and tags, which only the record tells apart, named in the state")
		key, err := tsClient.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: cfg.Tags, Expiry: time.Hour, Description: "not a proxy"})
		Expect(err).NotTo(HaveOccurred())
		victim := loginDevice(cfg.Hostname, key.Secret.Reveal())
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: victim, FQDN: cfg.Hostname + "-1.tailnet.test"})

		Expect(k8s.Delete(ctx, created)).To(Succeed())
		expectGone(created)
		Eventually(func() bool { return deviceExists(own) }).Should(BeFalse(), "the proxy's own device goes with it")
		Expect(deviceExists(victim)).To(BeTrue(), "the device the proxy named is still there")
		Eventually(func(g Gomega) []string {
			var msgs []string
			for _, m := range eventMessages(g, "Ingress", ing.Name) {
				if strings.HasPrefix(m, kit.ReasonDeviceNotMinted) {
					msgs = append(msgs, m)
				}
			}
			return msgs
		}).Should(ContainElement(ContainSubstring(victim)))
	})

	It("leaves a device that a ProxyGroup replica's state names but that its key did not log in, with a Warning Event", func() {
		key, err := tsClient.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour, Description: "not a proxy"})
		Expect(err).NotTo(HaveOccurred())
		victim := loginDevice("bystander-pg", key.Secret.Reveal())

		pg := newProxyGroup("planted", func(pg *tsv1alpha1.ProxyGroup) { pg.Spec.Replicas = ptr.To[int32](1) })
		Eventually(func(g Gomega) { g.Expect(replicaConfig(g, "planted", 0).AuthKey).NotTo(BeEmpty()) }).Should(Succeed())
		By("replica 0 naming that device in its state Secret")
		reportReplica("planted", 0, contract.ProxyState{DeviceID: victim, FQDN: "bystander-pg.tailnet.test"})

		Expect(k8s.Delete(ctx, pg)).To(Succeed())
		expectGone(pg)
		Expect(deviceExists(victim)).To(BeTrue(), "the device the replica named is still there")
		Eventually(func(g Gomega) []string { return eventReasons(g, "ProxyGroup", "planted") }).Should(ContainElement(kit.ReasonDeviceNotMinted))
	})
})
