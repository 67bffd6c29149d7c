package controller

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/net/netns"
	tsnetserver "tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
)

// liveKeysOf lists the tailnet's usable auth keys minted for the proxy of obj.
func liveKeysOf(obj client.Object) []localtailnet.Key {
	var keys []localtailnet.Key
	for _, k := range tsnet.LiveKeys() {
		if strings.Contains(k.Description+" ", " "+obj.GetNamespace()+"/"+obj.GetName()+" ") { // the nonce follows, if any
			keys = append(keys, k)
		}
	}
	return keys
}

var _ = Describe("Auth keys", func() {
	It("holds one live key when the config write fails after the mint, and leaves no key or device behind", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "keys"}}
		config := secretKey(proxies.ParentTypeIngress, ing)
		By("refusing the first write of the proxy's config Secret, which follows the mint")
		applyFaults.fail("Secret", config.Namespace, config.Name, 1)
		created := newIngress(ns, "keys", nil)

		var cfg *contract.ProxyConfig
		Eventually(func(g Gomega) {
			cfg = proxyConfigOf(g, proxies.ParentTypeIngress, ing)
			g.Expect(cfg.AuthKey).NotTo(BeEmpty())
		}).Should(Succeed())
		Consistently(func() []localtailnet.Key { return liveKeysOf(ing) }, 2*time.Second).Should(HaveLen(1),
			"one live key: the one the config holds")
		s := &corev1.Secret{}
		Expect(k8s.Get(ctx, config, s)).To(Succeed())
		Expect(s.Annotations[proxies.AnnotationAuthKeyID]).To(Equal(liveKeysOf(ing)[0].ID))

		By("logging a device in with it, as the proxy does")
		netns.SetEnabled(false) // an in-process node, without privileges
		node := &tsnetserver.Server{Dir: GinkgoT().TempDir(), ControlURL: tsnet.ControlURL, Hostname: cfg.Hostname,
			AuthKey: cfg.AuthKey, Logf: logger.Discard, UserLogf: logger.Discard}
		DeferCleanup(node.Close)
		st, err := node.Up(ctx)
		Expect(err).NotTo(HaveOccurred())
		deviceID := string(st.Self.ID)
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: deviceID, FQDN: strings.TrimSuffix(st.Self.DNSName, ".")})
		Expect(liveKeysOf(ing)).To(BeEmpty(), "the key is spent")

		By("deleting the Ingress")
		Expect(k8s.Delete(ctx, created)).To(Succeed())
		Eventually(func() bool {
			_, err := tsClient.Device(ctx, deviceID)
			return tailnet.IsNotFound(err)
		}).Should(BeTrue(), "the device is gone with its proxy")
		Expect(liveKeysOf(ing)).To(BeEmpty())
	})

	It("revokes a key minted for an intent that no config delivered, and an unused key when its proxy goes", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orphan"}}
		config := secretKey(proxies.ParentTypeIngress, ing)
		By("leaving what an operator stopped between a mint and its config write leaves: the intent, and the key")
		orphan, err := tsClient.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour,
			Description: "tsingress Ingress " + ns + "/orphan 00aa11bb22"})
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: config.Name,
			Annotations: map[string]string{proxies.AnnotationAuthKeyIntent: "00aa11bb22"}}})).To(Succeed())
		Expect(liveKeysOf(ing)).To(HaveLen(1))

		created := newIngress(ns, "orphan", nil)
		Eventually(func(g Gomega) {
			g.Expect(proxyConfigOf(g, proxies.ParentTypeIngress, ing).AuthKey).NotTo(BeEmpty())
			keys := liveKeysOf(ing)
			g.Expect(keys).To(HaveLen(1))
			g.Expect(keys[0].ID).NotTo(Equal(orphan.ID))
		}).Should(Succeed(), "the orphan revoked, one key delivered")

		By("deleting the Ingress before its proxy logs in")
		Expect(k8s.Delete(ctx, created)).To(Succeed())
		Eventually(func() []localtailnet.Key { return liveKeysOf(ing) }).Should(BeEmpty())
	})
})
