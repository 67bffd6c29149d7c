//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/test/framework"
)

// publicDial reaches the internet as a client outside the tailnet does: the name's public DNS
// record leads to Tailscale's Funnel relays. With the local tailnet, E2E_FUNNEL_ADDR (its
// Funnel listener, FUNNEL_ADDR of tools/localtailnet's env file) stands for port 443 of them.
func publicDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if relay := os.Getenv("E2E_FUNNEL_ADDR"); relay != "" {
		return d.DialContext(ctx, "tcp", relay)
	}
	return d.DialContext(ctx, network, addr)
}

// publicHTTPClient makes requests as a client on the internet (publicDial), trusting the suite's roots.
func publicHTTPClient() *http.Client {
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		DialContext: publicDial, TLSClientConfig: &tls.Config{RootCAs: suite.roots}, DisableKeepAlives: true}}
}

var _ = Describe("An Ingress annotated tailscale.com/funnel", func() {
	It("is served to a client outside the tailnet, and no longer once the annotation goes", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "e2e")
		newBackend(ctx, ns)
		host := "e2e-funnel-" + framework.Token()
		ing := framework.Ingress(ns, "public", host, "")
		ing.Annotations = map[string]string{kit.AnnotationFunnel: "true"}
		suite.Create(ctx, ing)
		fqdn := suite.ServedName(ctx, ing)
		expectHTTPSEcho(ctx, fqdn)

		// On, or refused by the tailnet's policy, which this suite cannot change.
		funnel := func(g Gomega) string {
			g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(ing), ing)).To(Succeed())
			for _, lb := range ing.Status.LoadBalancer.Ingress {
				for _, p := range lb.Ports {
					if p.Port == 443 && ptr.Deref(p.Error, "") == kit.ReasonFunnelNotPermitted {
						return "refused"
					}
				}
			}
			if slices.Contains(eventReasons(ctx, g, ing, corev1.EventTypeNormal), kit.ReasonFunnelEnabled) {
				return "on"
			}
			return "pending"
		}
		Eventually(ctx, funnel).Should(BeElementOf("on", "refused"), "Funnel on for %s, or refused", fqdn)
		if funnel(Default) == "refused" {
			expectWarning(ctx, ing, kit.ReasonFunnelNotPermitted)
			Skip(`the tailnet's policy does not grant the proxies' tag Funnel: add {"target": ["tag:k8s"], "attr": ["funnel"]} to its nodeAttrs to run this spec`)
		}

		public := publicHTTPClient()
		expectEcho(ctx, public, "https://"+fqdn)
		Expect(get(ctx, public, "https://"+fqdn+"/header?key=Tailscale-Funnel-Request", nil)).To(Equal("?1"),
			"a request from the internet is marked as such at the backend")

		delete(ing.Annotations, kit.AnnotationFunnel)
		Expect(suite.K8s.Update(ctx, ing)).To(Succeed())
		Eventually(ctx, func() error { return echoOnce(ctx, public, "https://"+fqdn) }).ShouldNot(Succeed(), "%s still public", fqdn)
		expectHTTPSEcho(ctx, fqdn)
	})
})

// eventReasons lists the reasons of the Events of type typ on obj.
func eventReasons(ctx context.Context, g Gomega, obj client.Object, typ string) []string {
	events := &corev1.EventList{}
	g.Expect(suite.K8s.List(ctx, events, client.InNamespace(obj.GetNamespace()))).To(Succeed())
	var reasons []string
	for _, e := range events.Items {
		if e.InvolvedObject.Name == obj.GetName() && e.InvolvedObject.UID == obj.GetUID() && e.Type == typ {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}
