package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientevents "k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/ingress"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// expectRenewalCopied renews Secret app-tls of ns (for app.example.com, as cert-manager writes
// it) and waits for the operator's copy copyName to hold the new certificate.
func expectRenewalCopied(ns, copyName string, now time.Time) {
	GinkgoHelper()
	renewedPEM, renewedKey := proxytest.SelfSigned(GinkgoT(), []string{"app.example.com"}, now.Add(-time.Minute), now.Add(60*24*time.Hour))
	s := &corev1.Secret{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "app-tls"}, s)).To(Succeed())
	s.Data = map[string][]byte{corev1.TLSCertKey: renewedPEM, corev1.TLSPrivateKeyKey: renewedKey}
	Expect(k8s.Update(ctx, s)).To(Succeed())
	Eventually(func(g Gomega) []byte {
		cp := &corev1.Secret{}
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testSetup.Namespace, Name: copyName}, cp)).To(Succeed())
		return cp.Data[corev1.TLSCertKey]
	}).Should(Equal(renewedPEM))
}

var _ = Describe("Certificates", func() {
	It("serves a bring-your-own certificate on its custom host, and reports bad Secrets without breaking the tailnet name", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		now := time.Now()
		certPEM, keyPEM := proxytest.SelfSigned(GinkgoT(), []string{"app.example.com"}, now.Add(-time.Hour), now.Add(30*24*time.Hour))
		allowTLSSecrets(ns)
		Expect(k8s.Create(ctx, tlsSecret(ns, "app-tls", certPEM, keyPEM))).To(Succeed())
		ing := newIngress(ns, "byo", func(i *networkingv1.Ingress) {
			i.Spec.TLS = append(i.Spec.TLS, networkingv1.IngressTLS{Hosts: []string{"app.example.com"}, SecretName: "app-tls"})
			i.Spec.Rules = []networkingv1.IngressRule{kubeobj.Rule("app.example.com", kubeobj.Path("/", networkingv1.PathTypePrefix, kubeobj.Backend("web", "admin")))}
		})
		copyName := certs.CertCopyName(proxies.ParentOf(proxies.ParentTypeIngress, ing).ProxyName(), ns, "app-tls")

		By("copying the certificate into the proxy's namespace and naming it in the Serve config")
		Eventually(func(g Gomega) {
			cfg := proxyConfigOf(g, proxies.ParentTypeIngress, ing)
			g.Expect(cfg.Hostname).To(Equal("byo"))
			g.Expect(cfg.Serve.TLS.Certificates).To(Equal([]contract.CertificateRef{{SecretName: copyName, Hosts: []string{"app.example.com"}}}))
			g.Expect(cfg.Serve.Routes).To(ContainElement(HaveField("Host", "app.example.com")))
			cp := &corev1.Secret{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testSetup.Namespace, Name: copyName}, cp)).To(Succeed())
			g.Expect(cp.Type).To(Equal(corev1.SecretTypeTLS))
			g.Expect(cp.Data[corev1.TLSCertKey]).To(Equal(certPEM))
			role := &rbacv1.Role{}
			g.Expect(k8s.Get(ctx, proxyKey(proxies.ParentTypeIngress, ing), role)).To(Succeed())
			g.Expect(role.Rules).To(ContainElement(And(HaveField("ResourceNames", []string{copyName}), HaveField("Verbs", []string{"get", "list", "watch"}))))
		}).Should(Succeed())

		By("following a renewed certificate (as cert-manager writes it)")
		expectRenewalCopied(ns, copyName, now)

		By("dropping an expired certificate with a CertificateExpired Event, keeping the tailnet name")
		s := &corev1.Secret{}
		expiredPEM, expiredKey := proxytest.SelfSigned(GinkgoT(), []string{"app.example.com"}, now.Add(-48*time.Hour), now.Add(-time.Hour))
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "app-tls"}, s)).To(Succeed())
		s.Data = map[string][]byte{corev1.TLSCertKey: expiredPEM, corev1.TLSPrivateKeyKey: expiredKey}
		Expect(k8s.Update(ctx, s)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(ingressEvents(g, ing)).To(ContainElement(kit.ReasonCertificateExpired))
			cfg := proxyConfigOf(g, proxies.ParentTypeIngress, ing)
			g.Expect(cfg.Serve.TLS.Certificates).To(BeEmpty())
			g.Expect(cfg.Hostname).To(Equal("byo"))
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testSetup.Namespace, Name: copyName}, &corev1.Secret{})).NotTo(Succeed(), "the stale copy is removed")
		}).Should(Succeed())

		By("reporting a Secret of the wrong type")
		Expect(k8s.Delete(ctx, s)).To(Succeed())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app-tls"},
			Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}})).To(Succeed())
		// An Opaque Secret is not cached (only kubernetes.io/tls ones are): touch the Ingress.
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
		ing.Annotations = map[string]string{"touch": "1"}
		Expect(k8s.Update(ctx, ing)).To(Succeed())
		Eventually(func(g Gomega) []string { return ingressEvents(g, ing) }).Should(ContainElement(kit.ReasonTLSSecretWrongType))

		By("removing the copies with the proxy")
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "app-tls"}, s)).To(Succeed())
		Expect(k8s.Delete(ctx, s)).To(Succeed())
		Expect(k8s.Create(ctx, tlsSecret(ns, "app-tls", certPEM, keyPEM))).To(Succeed())
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: testSetup.Namespace, Name: copyName}, &corev1.Secret{})
		}).Should(Succeed())
		Expect(k8s.Delete(ctx, ing)).To(Succeed())
		expectGone(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testSetup.Namespace, Name: copyName}})
	})

	It("reads no Secret in a namespace whose owner has not let it, says so, and serves it once allowed", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		now := time.Now()
		certPEM, keyPEM := proxytest.SelfSigned(GinkgoT(), []string{"app.example.com"}, now.Add(-time.Hour), now.Add(30*24*time.Hour))
		Expect(k8s.Create(ctx, tlsSecret(ns, "app-tls", certPEM, keyPEM))).To(Succeed())
		ing := newIngress(ns, "byo-denied", func(i *networkingv1.Ingress) {
			i.Spec.TLS = append(i.Spec.TLS, networkingv1.IngressTLS{Hosts: []string{"app.example.com"}, SecretName: "app-tls"})
		})
		copyName := certs.CertCopyName(proxies.ParentOf(proxies.ParentTypeIngress, ing).ProxyName(), ns, "app-tls")

		By("serving the tailnet name alone, with a TLSSecretNotPermitted Warning naming the role to bind")
		Eventually(func(g Gomega) {
			g.Expect(ingressEvents(g, ing)).To(ContainElement(kit.ReasonTLSSecretNotPermitted))
			cfg := proxyConfigOf(g, proxies.ParentTypeIngress, ing)
			g.Expect(cfg.Hostname).To(Equal("byo-denied"))
			g.Expect(cfg.Serve.TLS.Certificates).To(BeEmpty())
		}).Should(Succeed())
		events := &corev1.EventList{}
		Expect(k8s.List(ctx, events, client.InNamespace(ns))).To(Succeed())
		var notes []string
		for _, e := range events.Items {
			if e.Reason == kit.ReasonTLSSecretNotPermitted {
				notes = append(notes, e.Message)
			}
		}
		Expect(notes).To(ContainElement(ContainSubstring(certs.TLSSecretReaderRole)))
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: testSetup.Namespace, Name: copyName}, &corev1.Secret{})).NotTo(Succeed())

		By("serving the Secret once the namespace's owner binds the role (the Ingress touched, or within the recheck)")
		allowTLSSecrets(ns)
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
		ing.Annotations = map[string]string{"touch": "1"}
		Expect(k8s.Update(ctx, ing)).To(Succeed())
		Eventually(func(g Gomega) {
			cfg := proxyConfigOf(g, proxies.ParentTypeIngress, ing)
			g.Expect(cfg.Serve.TLS.Certificates).To(Equal([]contract.CertificateRef{{SecretName: copyName, Hosts: []string{"app.example.com"}}}))
		}).Should(Succeed())

		By("following a renewal there, through the namespace's watch started then")
		expectRenewalCopied(ns, copyName, now)
	})

	It("holds issuance when the tailnet's domain has used up the CA's weekly limit, and lifts the hold when the window moves", func() {
		const domain = "guard1.example"
		// As many new certificates for other names of the domain as the limit, the oldest two days ago.
		start := time.Now().Add(-48 * time.Hour)
		full := &acmebudget.Ledger{}
		for i := range testSetup.CertificateLimits.PerDomain {
			full.Entries = append(full.Entries, acmebudget.Entry{Name: fmt.Sprintf("n%d.%s", i, domain),
				At: start.Add(time.Duration(i) * time.Minute), Serial: fmt.Sprintf("s%d", i)})
		}
		writeLedger(domain, full)

		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "limited", nil)
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: "nLimited", FQDN: "limited." + domain})

		By("putting a hold into the Serve config, with a port error and an Event")
		Eventually(func(g Gomega) {
			hold := proxyConfigOf(g, proxies.ParentTypeIngress, ing).Serve.TLS.Hold
			g.Expect(hold).NotTo(BeNil())
			g.Expect(hold.Reason).To(Equal(kit.ReasonCertificateRateLimited))
			g.Expect(hold.Until).To(BeTemporally("~", start.Add(acmebudget.LetsEncrypt.Window), time.Second))
			g.Expect(ingressEvents(g, ing)).To(ContainElement(kit.ReasonCertificateRateLimited))
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			g.Expect(portError(ing)).To(Equal("limited." + domain + ":" + kit.ReasonCertificateRateLimited))
		}).Should(Succeed())

		By("lifting it once the oldest certificate leaves the window (the ledger moved a week on)")
		for i := range full.Entries {
			full.Entries[i].At = full.Entries[i].At.Add(-6 * 24 * time.Hour)
		}
		writeLedger(domain, full)
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: "nLimited", FQDN: "limited." + domain,
			Certificates: map[string]contract.CertificateStatus{"limited." + domain: {Reason: contract.CertReasonIssuanceHeld}}})
		Eventually(func(g Gomega) {
			g.Expect(proxyConfigOf(g, proxies.ParentTypeIngress, ing).Serve.TLS.Hold).To(BeNil())
			l := ledgerOf(g, domain)
			g.Expect(l.Entries).To(ContainElement(And(HaveField("Name", "limited."+domain), HaveField("Reserved", true))))
		}).Should(Succeed())

		By("counting the certificate the proxy then reports, once")
		issued := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "0badc0de",
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: "nLimited", FQDN: "limited." + domain, HTTPSEndpoint: "limited." + domain,
			Certificates: map[string]contract.CertificateStatus{"limited." + domain: issued}})
		Eventually(func(g Gomega) {
			l := ledgerOf(g, domain)
			n := 0
			for _, e := range l.Entries {
				if e.Name == "limited."+domain {
					n++
					g.Expect(e.Serial).To(Equal("0badc0de"))
					g.Expect(e.Reserved).To(BeFalse())
				}
			}
			g.Expect(n).To(Equal(1))
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			g.Expect(portError(ing)).To(BeEmpty())
			g.Expect(ing.Status.LoadBalancer.Ingress).To(ContainElement(HaveField("Hostname", "limited."+domain)))
		}).Should(Succeed())
	})

	It("does not mint a new auth key for a proxy whose stored identity survives a restart", func() {
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "restarts", nil)
		Eventually(func(g Gomega) string { return proxyConfigOf(g, proxies.ParentTypeIngress, ing).AuthKey }).ShouldNot(BeEmpty())
		// The device logged in (the tailnet client stored its profile), and a new Pod has just
		// started: it cleared device_id until it is up again.
		s := &corev1.Secret{}
		Expect(k8s.Get(ctx, secretKey(proxies.ParentTypeIngress, ing), s)).To(Succeed())
		s.Data[contract.StateTailnetProfile] = []byte("profile-1234")
		s.Data[contract.StateDeviceID] = nil
		Expect(k8s.Update(ctx, s)).To(Succeed())
		Eventually(func(g Gomega) string { return proxyConfigOf(g, proxies.ParentTypeIngress, ing).AuthKey }).Should(BeEmpty())
		Consistently(func(g Gomega) string { return proxyConfigOf(g, proxies.ParentTypeIngress, ing).AuthKey }, "2s").Should(BeEmpty())
	})

	It("gives a ProxyGroup one certificate Secret per tailnet name, writable by the group, and its BYO copies", func() {
		const domain = "guard2.example"
		pg := newProxyGroup("certs", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)
		reportReplica("certs", 0, contract.ProxyState{DeviceID: "nCerts0", FQDN: "certs-0." + domain})
		ns := newNamespace()
		newBackendService(ns, "web")
		now := time.Now()
		certPEM, keyPEM := proxytest.SelfSigned(GinkgoT(), []string{"app.example.com"}, now.Add(-time.Hour), now.Add(30*24*time.Hour))
		allowTLSSecrets(ns)
		Expect(k8s.Create(ctx, tlsSecret(ns, "app-tls", certPEM, keyPEM))).To(Succeed())
		newIngress(ns, "shared", func(i *networkingv1.Ingress) {
			i.Annotations = map[string]string{kit.AnnotationProxyGroup: "certs"}
			i.Spec.TLS = append(i.Spec.TLS, networkingv1.IngressTLS{Hosts: []string{"app.example.com"}, SecretName: "app-tls"})
		})
		fqdn := "shared." + domain
		copyName := certs.CertCopyName("certs", ns, "app-tls")

		Eventually(func(g Gomega) {
			s := &corev1.Secret{}
			g.Expect(k8s.Get(ctx, nsKey(contract.GroupCertSecret(fqdn)), s)).To(Succeed())
			g.Expect(s.Type).To(Equal(corev1.SecretTypeTLS))
			g.Expect(metav1.IsControlledBy(s, pg)).To(BeTrue(), "owned by the ProxyGroup")
			role := &rbacv1.Role{}
			g.Expect(k8s.Get(ctx, nsKey("certs"), role)).To(Succeed())
			g.Expect(role.Rules).To(ContainElement(And(
				HaveField("ResourceNames", ContainElement(contract.GroupCertSecret(fqdn))),
				HaveField("Verbs", ContainElements("update", "patch", "watch")))))
			g.Expect(role.Rules).To(ContainElement(And(HaveField("ResourceNames", []string{copyName}), HaveField("Verbs", []string{"get", "list", "watch"}))))
			serve, _ := groupDocuments(g, "certs")
			ws := serve.Services["svc:shared"]
			g.Expect(ws.TLS.Hold).To(BeNil(), "within the limits: the issuer may ask the CA")
			g.Expect(ws.TLS.Certificates).To(Equal([]contract.CertificateRef{{SecretName: copyName, Hosts: []string{"app.example.com"}}}))
			g.Expect(ledgerOf(g, domain).Entries).To(ContainElement(And(HaveField("Name", fqdn), HaveField("Reserved", true))))
		}).Should(Succeed())
	})
})

var _ = Describe("Certificates from Let's Encrypt's staging directory", func() {
	It("are not counted against the production CA's limits for a standalone Ingress", func() {
		const domain = "staging1.example"
		pc := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "staging-standalone"},
			Spec: tsv1alpha1.ProxyClassSpec{UseLetsEncryptStagingEnvironment: true}}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		ns := newNamespace()
		newBackendService(ns, "web")
		ing := newIngress(ns, "trial", func(i *networkingv1.Ingress) { i.Labels = map[string]string{kit.LabelProxyClass: pc.Name} })
		fqdn := "trial." + domain
		issued := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "57a6e0",
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
		reportState(proxies.ParentTypeIngress, ing, contract.ProxyState{DeviceID: "nTrial", FQDN: fqdn, HTTPSEndpoint: fqdn,
			Certificates: map[string]contract.CertificateStatus{fqdn: issued}})
		// The pass that lists the served name has read the certificate the proxy reported.
		Eventually(func(g Gomega) []networkingv1.IngressLoadBalancerIngress {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			return ing.Status.LoadBalancer.Ingress
		}).Should(ContainElement(HaveField("Hostname", fqdn)))
		cm := &corev1.ConfigMap{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: testSetup.Namespace, Name: certs.LedgerConfigMap}, cm); err == nil {
			Expect(cm.Data).NotTo(HaveKey(domain+".json"), "a staging serial in the production ledger")
		}
	})

	It("are not counted for a ProxyGroup whose default ProxyClass is staging, and are for production", func() {
		pc := &tsv1alpha1.ProxyClass{ObjectMeta: metav1.ObjectMeta{Name: "staging-default"},
			Spec: tsv1alpha1.ProxyClassSpec{UseLetsEncryptStagingEnvironment: true}}
		Expect(k8s.Create(ctx, pc)).To(Succeed())
		DeferCleanup(k8s.Delete, ctx, pc)
		pg := newProxyGroup("staging-default-group", func(p *tsv1alpha1.ProxyGroup) { p.Spec.Replicas = ptr.To[int32](1) })
		DeferCleanup(k8s.Delete, ctx, pg)

		// A reconciler of an operator whose default ProxyClass is staging-default, with its own
		// namespace and ledger, called directly.
		certificate := func(defaultClass string) (certs.TailnetCert, error) {
			ns := newNamespace()
			r := &ingress.HAIngressReconciler{Client: k8s, Reporter: kit.Reporter{Recorder: clientevents.NewFakeRecorder(10)},
				Settings: kit.Settings{Namespace: ns, DefaultProxyClass: defaultClass},
				Guard:    &certs.CertGuard{Client: k8s, Namespace: ns, Limits: acmebudget.LetsEncrypt, Now: time.Now},
				Info:     func(context.Context) tailnet.TailnetInfo { return tailnet.TailnetInfo{} }}
			issued := contract.CertificateStatus{Source: contract.CertSourceACME, Serial: "57a6e1",
				NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
			states := []*contract.ProxyState{{FQDN: "staging-default-group-0.staging2.example",
				Certificates: map[string]contract.CertificateStatus{"app.staging2.example": issued}}}
			ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"}}
			c, err := r.Certificate(ctx, &ingress.HAIngressScope{Ing: ing, Hostname: "app", Group: pg, States: states})
			ledger := &corev1.ConfigMap{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: certs.LedgerConfigMap}, ledger); err == nil {
				Expect(defaultClass).To(BeEmpty(), "a staging serial in the production ledger: %v", ledger.Data)
				Expect(ledger.Data["staging2.example.json"]).To(ContainSubstring("57a6e1"))
			} else {
				Expect(apierrors.IsNotFound(err)).To(BeTrue())
				Expect(defaultClass).NotTo(BeEmpty(), "a production serial not counted")
			}
			return c, err
		}
		c, err := certificate("staging-default")
		Expect(err).NotTo(HaveOccurred())
		Expect(c.FQDN).To(Equal("app.staging2.example"))
		Expect(c.Hold).To(BeNil())
		_, err = certificate("")
		Expect(err).NotTo(HaveOccurred())
	})
})

var _ = Describe("The certificate guard", func() {
	It("counts a replica's parsed report once, however many objects read it, and a new report again", func() {
		ns := newNamespace()
		guard := &certs.CertGuard{Client: k8s, Namespace: ns, Limits: acmebudget.LetsEncrypt, Now: time.Now}
		issued := func(serial string) contract.CertificateStatus {
			return contract.CertificateStatus{Source: contract.CertSourceACME, Serial: serial,
				NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
		}
		ledger := func() string {
			cm := &corev1.ConfigMap{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: certs.LedgerConfigMap}, cm)).To(Succeed())
			return cm.Data["once.example.json"]
		}
		report := &contract.ProxyState{Certificates: map[string]contract.CertificateStatus{"a.once.example": issued("a1a1")}}
		Expect(guard.ObserveReport(ctx, report, false)).To(Succeed())
		Expect(ledger()).To(ContainSubstring("a1a1"))

		// Parsed reports are never changed; this one is, only to show it is not read again.
		report.Certificates["b.once.example"] = issued("b2b2")
		Expect(guard.ObserveReport(ctx, report, false)).To(Succeed())
		Expect(ledger()).NotTo(ContainSubstring("b2b2"))

		next := &contract.ProxyState{Certificates: map[string]contract.CertificateStatus{
			"a.once.example": issued("a1a1"), "b.once.example": issued("b2b2")}}
		Expect(guard.ObserveReport(ctx, next, false)).To(Succeed())
		Expect(ledger()).To(ContainSubstring("b2b2"))
	})

	It("keeps the ledger in bounded segments, rewriting only those a change touches", func() {
		ns := newNamespace()
		now := time.Now()
		guard := &certs.CertGuard{Client: k8s, Namespace: ns, Limits: acmebudget.Limits{PerDomain: 1000, PerName: 5, Window: 7 * 24 * time.Hour},
			Now: func() time.Time { return now }, SegmentSize: 4 << 10}
		const domain = "seg.example"
		names := make([]string, 120)
		for i := range names {
			names[i] = fmt.Sprintf("web-%03d.%s", i, domain)
		}
		// Reserved from many reconcilers at once, as a large group's would.
		var wg sync.WaitGroup
		for _, name := range names {
			wg.Go(func() {
				defer GinkgoRecover()
				hold, err := guard.Hold(ctx, name, contract.CertificateStatus{})
				Expect(err).NotTo(HaveOccurred())
				Expect(hold).To(BeNil())
			})
		}
		wg.Wait()
		segments := func() map[string]*corev1.ConfigMap {
			segs, err := certs.ListLedgerSegments(ctx, k8s, ns)
			Expect(err).NotTo(HaveOccurred())
			out := map[string]*corev1.ConfigMap{}
			for _, s := range segs {
				Expect(s.Size()).To(BeNumerically("<=", 4<<10*4/3), "segment %s", s.CM.Name)
				out[s.CM.Name] = s.CM.DeepCopy()
			}
			return out
		}
		before := segments()
		Expect(len(before)).To(BeNumerically(">=", 3), "120 reservations in segments of 4 KiB")
		l := ledgerIn(Default, ns, domain)
		Expect(l.Entries).To(HaveLen(len(names)))
		for _, name := range names {
			Expect(l.HasReservation(name, now, guard.Limits)).To(BeTrue(), name)
		}

		// One certificate issued: one segment written, the others untouched.
		Expect(guard.Observe(ctx, map[string]contract.CertificateStatus{names[5]: {Source: contract.CertSourceACME, Serial: "c0ffee",
			NotBefore: now, NotAfter: now.Add(90 * 24 * time.Hour)}}, false)).To(Succeed())
		after := segments()
		var rewritten []string
		for name, cm := range after {
			if before[name] == nil || before[name].ResourceVersion != cm.ResourceVersion {
				rewritten = append(rewritten, name)
			}
		}
		Expect(rewritten).To(HaveLen(1))
		Expect(after[rewritten[0]].Data[certs.LedgerKey(domain)]).To(ContainSubstring("c0ffee"))
		Expect(ledgerIn(Default, ns, domain).Entries).To(ContainElement(And(HaveField("Name", names[5]), HaveField("Serial", "c0ffee"), HaveField("Reserved", false))))

		// A new operator (nothing cached) reads the same account and reserves nothing twice.
		fresh := &certs.CertGuard{Client: k8s, Namespace: ns, Limits: guard.Limits, Now: guard.Now, SegmentSize: 4 << 10}
		Expect(fresh.Hold(ctx, names[7], contract.CertificateStatus{})).To(BeNil())
		Expect(ledgerIn(Default, ns, domain).Entries).To(HaveLen(len(names)))

		// Past the window and the names' 90 days, every segment but the first is removed.
		now = now.Add(100 * 24 * time.Hour)
		Expect(fresh.Hold(ctx, "late."+domain, contract.CertificateStatus{})).To(BeNil())
		Eventually(func(g Gomega) []string {
			segs, err := certs.ListLedgerSegments(ctx, k8s, ns)
			g.Expect(err).NotTo(HaveOccurred())
			var names []string
			for _, s := range segs {
				names = append(names, s.CM.Name)
			}
			return names
		}).Should(Equal([]string{certs.LedgerConfigMap}))
		Expect(ledgerIn(Default, ns, domain).Entries).To(ConsistOf(HaveField("Name", "late."+domain)))
	})
})
