//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/tsingress/tsingress/internal/controller/gateway"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/test/framework"
)

var installGatewayAPI sync.Once

// gatewayClass installs the Gateway API CRDs the operator serves (config/gateway-api: it picks
// them up without a restart) once per run, and makes a GatewayClass of this operator for the spec.
func gatewayClass(ctx context.Context) string {
	GinkgoHelper()
	var err error
	installGatewayAPI.Do(func() {
		// The binary may run elsewhere (make test-e2e-local): the CRDs are found from this file.
		_, self, _, _ := runtime.Caller(0)
		_, err = envtest.InstallCRDs(suite.Config, envtest.CRDInstallOptions{
			Paths: []string{filepath.Join(filepath.Dir(self), "..", "..", "config", "gateway-api")}, ErrorIfPathMissing: true})
	})
	Expect(err).NotTo(HaveOccurred(), "installing the Gateway API CRDs")
	gc := &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + framework.Token()},
		Spec: gatewayv1.GatewayClassSpec{ControllerName: gateway.ControllerName}}
	suite.Create(ctx, gc)
	return gc.Name
}

// gatewayCondition reads a condition of a Gateway (nil when it has none of that type).
func gatewayCondition(ctx context.Context, g Gomega, gw *gatewayv1.Gateway, typ string) *metav1.Condition {
	got := &gatewayv1.Gateway{}
	g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(gw), got)).To(Succeed())
	return meta.FindStatusCondition(got.Status.Conditions, typ)
}

// programmedAddresses waits for a Gateway to be Programmed with its listeners' routes attached
// (attached each), and returns its addresses: the MagicDNS name first, then the tailnet IPs.
func programmedAddresses(ctx context.Context, gw *gatewayv1.Gateway, attached int32) []gatewayv1.GatewayStatusAddress {
	GinkgoHelper()
	got := &gatewayv1.Gateway{}
	Eventually(ctx, func(g Gomega) {
		g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(gw), got)).To(Succeed())
		c := meta.FindStatusCondition(got.Status.Conditions, string(gatewayv1.GatewayConditionProgrammed))
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "Programmed: %s", c.Message)
		g.Expect(got.Status.Addresses).NotTo(BeEmpty())
		g.Expect(*got.Status.Addresses[0].Type).To(Equal(gatewayv1.HostnameAddressType))
		g.Expect(got.Status.Listeners).To(HaveEach(HaveField("AttachedRoutes", attached)))
	}).Should(Succeed())
	return got.Status.Addresses
}

// patchAnnotation sets (or, with value "", removes) an annotation of obj.
func patchAnnotation(ctx context.Context, obj client.Object, key, value string) {
	GinkgoHelper()
	Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
	before := obj.DeepCopyObject().(client.Object)
	a := obj.GetAnnotations()
	if value == "" {
		delete(a, key)
	} else {
		if a == nil {
			a = map[string]string{}
		}
		a[key] = value
	}
	obj.SetAnnotations(a)
	Expect(suite.K8s.Patch(ctx, obj, client.MergeFrom(before))).To(Succeed())
}

// newEdgeGateway makes a namespace with the echo backend and, for it, a Gateway "edge" of a
// class of this operator with one HTTPS listener, named prefix-<token> on the tailnet, not
// created yet; port is the backend's HTTP port.
func newEdgeGateway(ctx context.Context, prefix string) (string, int, *gatewayv1.Gateway) {
	GinkgoHelper()
	class := gatewayClass(ctx)
	ns := suite.NewNamespace(ctx, "e2e")
	newBackend(ctx, ns)
	backend := &corev1.Service{}
	Expect(suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: framework.BackendName}, backend)).To(Succeed())
	edge := kubeobj.Gateway(ns, "edge", class, kubeobj.Listener("https", gatewayv1.HTTPSProtocolType, 443))
	edge.Annotations = map[string]string{kit.AnnotationHostname: prefix + "-" + framework.Token()}
	return ns, int(backend.Spec.Ports[0].Port), edge
}

var _ = Describe("A Gateway of a tailscale GatewayClass", func() {
	It("serves an HTTPRoute over HTTPS on its tailnet name, through Funnel when annotated, and leaves nothing behind", func(ctx SpecContext) {
		ns, port, edge := newEdgeGateway(ctx, "e2e-gw")
		route := kubeobj.HTTPRoute(ns, "web", edge.Name, kubeobj.HTTPRule(gatewayv1.PathMatchPathPrefix, "/", "", framework.BackendName, port))
		suite.Create(ctx, edge)
		suite.Create(ctx, route)

		By("programming the Gateway with its MagicDNS name first in its addresses")
		fqdn := programmedAddresses(ctx, edge, 1)[0].Value
		Eventually(ctx, func(g Gomega) []gatewayv1.RouteParentStatus {
			got := &gatewayv1.HTTPRoute{}
			g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(route), got)).To(Succeed())
			return got.Status.Parents
		}).Should(ConsistOf(HaveField("Conditions", ContainElement(And(
			HaveField("Type", "Accepted"), HaveField("Status", metav1.ConditionTrue))))))
		expectHTTPSEcho(ctx, fqdn)
		deviceID := proxyDevice(ctx, proxies.ParentTypeGateway, edge)

		By("serving it to a client outside the tailnet once annotated for Funnel")
		patchAnnotation(ctx, edge, kit.AnnotationFunnel, "true")
		var funnel *metav1.Condition
		Eventually(ctx, func(g Gomega) string {
			funnel = gatewayCondition(ctx, g, edge, "tailscale.com/Funnel")
			g.Expect(funnel).NotTo(BeNil())
			return funnel.Reason
		}).Should(BeElementOf(kit.ReasonFunnelEnabled, kit.ReasonFunnelNotPermitted), "Funnel on for %s, or refused", fqdn)
		refused := funnel.Reason == kit.ReasonFunnelNotPermitted
		public := publicHTTPClient()
		if !refused {
			Expect(funnel.Status).To(Equal(metav1.ConditionTrue))
			expectEcho(ctx, public, "https://"+fqdn)
			Expect(get(ctx, public, "https://"+fqdn+"/header?key=Tailscale-Funnel-Request", nil)).To(Equal("?1"),
				"a request from the internet is marked as such at the backend")

			By("serving it on the tailnet only once the annotation goes")
			patchAnnotation(ctx, edge, kit.AnnotationFunnel, "")
			Eventually(ctx, func() error { return echoOnce(ctx, public, "https://"+fqdn) }).ShouldNot(Succeed(), "%s still public", fqdn)
			Eventually(ctx, func(g Gomega) *metav1.Condition { return gatewayCondition(ctx, g, edge, "tailscale.com/Funnel") }).Should(BeNil())
			expectHTTPSEcho(ctx, fqdn)
		}

		By("removing its proxy and device with the Gateway")
		Expect(suite.K8s.Delete(ctx, edge)).To(Succeed())
		expectProxyGone(ctx, proxies.ParentTypeGateway, edge, deviceID)
		if refused {
			Skip(`Funnel: the tailnet's policy does not grant the proxies' tag Funnel: add {"target": ["tag:k8s"], "attr": ["funnel"]} to its nodeAttrs to run this part`)
		}
	})

	It("copies a route's requests to a RequestMirror's Service, answering from the route's backend", func(ctx SpecContext) {
		if suite.localBackend != "" {
			Skip("the local environment runs no workload Pods: the mirror's server is agnhost's, on kind")
		}
		ns, port, edge := newEdgeGateway(ctx, "e2e-gwmir")
		// A second echo server, whose log shows what reached it.
		suite.RunWorkload(ctx, ns, "shadow", suite.backendImage, "netexec", "--http-port=8080")
		shadow := framework.BackendService(ns, "shadow", corev1.ServiceTypeClusterIP)
		shadow.Spec.Selector = map[string]string{"app": "shadow"}
		suite.Create(ctx, shadow)
		rule := kubeobj.HTTPRule(gatewayv1.PathMatchPathPrefix, "/", "", framework.BackendName, port)
		rule.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror, RequestMirror: &gatewayv1.HTTPRequestMirrorFilter{
			BackendRef: gatewayv1.BackendObjectReference{Name: "shadow", Port: ptr.To(shadow.Spec.Ports[0].Port)}}}}
		suite.Create(ctx, edge)
		suite.Create(ctx, kubeobj.HTTPRoute(ns, "mirrored", edge.Name, rule))
		fqdn := programmedAddresses(ctx, edge, 1)[0].Value

		hc := tailnetHTTPClient(15 * time.Second)
		defer hc.CloseIdleConnections()
		msg := "mirrored-" + framework.Token()
		Eventually(ctx, func() (string, error) { return get(ctx, hc, "https://"+fqdn+"/echo?msg="+msg, nil) }).Should(Equal(msg),
			"the route's backend answers")
		pods := &corev1.PodList{}
		Expect(suite.K8s.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"app": "shadow"})).To(Succeed())
		Expect(pods.Items).NotTo(BeEmpty())
		Eventually(ctx, func() (string, error) {
			b, err := suite.Clientset.CoreV1().Pods(ns).GetLogs(pods.Items[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			return string(b), err
		}).Should(ContainSubstring("GET /echo?msg="+msg), "the mirror's server got the copy")
	})

	It("routes by method, header (exact and regular expression) and query, edits headers both ways, redirects, rewrites and splits by weight", func(ctx SpecContext) {
		ns, port, edge := newEdgeGateway(ctx, "e2e-gwm")
		// Each rule tells the backend which it is in a request header; the backend's /header
		// answers with it.
		rule := func(name string, narrow func(*gatewayv1.HTTPRouteMatch)) gatewayv1.HTTPRouteRule {
			r := kubeobj.HTTPRule(gatewayv1.PathMatchPathPrefix, "/", "", framework.BackendName, port)
			narrow(&r.Matches[0])
			r.Filters = []gatewayv1.HTTPRouteFilter{
				{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{
					Set: []gatewayv1.HTTPHeader{{Name: "X-Rule", Value: name}}, Remove: []string{"X-Debug"}}},
				{Type: gatewayv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gatewayv1.HTTPHeaderFilter{
					Add: []gatewayv1.HTTPHeader{{Name: "X-Served-By-Rule", Value: name}}}},
			}
			return r
		}
		route := kubeobj.HTTPRoute(ns, "narrow", edge.Name,
			rule("default", func(*gatewayv1.HTTPRouteMatch) {}),
			rule("canary", func(m *gatewayv1.HTTPRouteMatch) {
				m.Headers = []gatewayv1.HTTPHeaderMatch{{Name: "X-Track", Value: "canary"}}
			}),
			rule("v2", func(m *gatewayv1.HTTPRouteMatch) {
				m.QueryParams = []gatewayv1.HTTPQueryParamMatch{{Name: "api", Value: "v2"}}
			}),
			rule("post", func(m *gatewayv1.HTTPRouteMatch) { m.Method = ptr.To(gatewayv1.HTTPMethodPost) }),
			rule("build", func(m *gatewayv1.HTTPRouteMatch) {
				m.Headers = []gatewayv1.HTTPHeaderMatch{{Type: ptr.To(gatewayv1.HeaderMatchRegularExpression), Name: "X-Build", Value: "[0-9]+"}}
			}),
			rule("rewritten", func(m *gatewayv1.HTTPRouteMatch) { m.Path.Value = ptr.To("/rewritten") }),
			rule("split", func(m *gatewayv1.HTTPRouteMatch) { m.Path.Value = ptr.To("/split") }))
		// Half of /split goes to a Service that does not exist, and fails.
		splitRule := &route.Spec.Rules[len(route.Spec.Rules)-1]
		splitRule.BackendRefs = append(splitRule.BackendRefs, kubeobj.HTTPRule(gatewayv1.PathMatchPathPrefix, "/", "", "missing", port).BackendRefs...)
		splitRule.Filters = append(splitRule.Filters, gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterURLRewrite,
			URLRewrite: &gatewayv1.HTTPURLRewriteFilter{Path: &gatewayv1.HTTPPathModifier{
				Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/")}}})
		rewritten := &route.Spec.Rules[len(route.Spec.Rules)-2]
		rewritten.Filters = append(rewritten.Filters, gatewayv1.HTTPRouteFilter{Type: gatewayv1.HTTPRouteFilterURLRewrite,
			URLRewrite: &gatewayv1.HTTPURLRewriteFilter{Path: &gatewayv1.HTTPPathModifier{
				Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/")}}})
		route.Spec.Rules = append(route.Spec.Rules, gatewayv1.HTTPRouteRule{
			Matches: []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/old")}}},
			Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gatewayv1.HTTPRequestRedirectFilter{
				StatusCode: ptr.To(http.StatusMovedPermanently),
				Path:       &gatewayv1.HTTPPathModifier{Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/new")}}}},
		})
		suite.Create(ctx, edge)
		suite.Create(ctx, route)

		fqdn := programmedAddresses(ctx, edge, 1)[0].Value
		expectHTTPSEcho(ctx, fqdn)
		deviceID := proxyDevice(ctx, proxies.ParentTypeGateway, edge)

		hc := tailnetHTTPClient(15 * time.Second)
		defer hc.CloseIdleConnections()
		for _, tc := range []struct {
			method, query string
			header        http.Header
			want          string
		}{
			{http.MethodGet, "", nil, "default"},
			{http.MethodGet, "", http.Header{"X-Track": {"canary"}}, "canary"},
			{http.MethodGet, "", http.Header{"X-Track": {"stable"}}, "default"},
			{http.MethodGet, "&api=v2", nil, "v2"},
			{http.MethodGet, "&api=v2", http.Header{"X-Track": {"canary"}}, "canary"}, // headers before query
			{http.MethodPost, "&api=v2", http.Header{"X-Track": {"canary"}}, "post"},  // the method first
			{http.MethodGet, "", http.Header{"X-Build": {"1234"}}, "build"},           // a regular expression
			{http.MethodGet, "", http.Header{"X-Build": {"12a"}}, "default"},          // matching whole values
		} {
			By(fmt.Sprintf("%s with %v%s: rule %s", tc.method, tc.header, tc.query, tc.want))
			header := http.Header{"X-Debug": {"client"}}
			maps.Copy(header, tc.header)
			body, respHeader, err := do(ctx, hc, tc.method, "https://"+fqdn+"/header?key=X-Rule"+tc.query, header)
			Expect(err).NotTo(HaveOccurred())
			Expect(body).To(Equal(tc.want), "the rule named in the request")
			Expect(respHeader.Values("X-Served-By-Rule")).To(Equal([]string{tc.want}), "the rule named in the response")
			body, _, err = do(ctx, hc, tc.method, "https://"+fqdn+"/header?key=X-Debug"+tc.query, header)
			Expect(err).NotTo(HaveOccurred())
			Expect(body).To(BeEmpty(), "the header the rule removes")
		}

		By("reaching the backend at a rewritten path")
		body, respHeader, err := do(ctx, hc, http.MethodGet, "https://"+fqdn+"/rewritten/header?key=X-Rule", nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(body).To(Equal("rewritten"), "/rewritten/header reached the backend as /header")
		Expect(respHeader.Values("X-Served-By-Rule")).To(Equal([]string{"rewritten"}))

		By("splitting /split between the backend and a missing Service, half each")
		served, failed := 0, 0
		for range 40 {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+fqdn+"/split/echo?msg=x", nil)
			Expect(err).NotTo(HaveOccurred())
			resp, err := hc.Do(req)
			Expect(err).NotTo(HaveOccurred())
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				served++
			case http.StatusInternalServerError:
				failed++
			}
		}
		GinkgoWriter.Printf("split: %d served, %d failed of 40\n", served, failed)
		Expect(served+failed).To(Equal(40), "every answer from one of the two")
		Expect(served).To(BeNumerically(">=", 5), "the backend's share")
		Expect(failed).To(BeNumerically(">=", 5), "the missing Service's share")

		By("redirecting with the prefix replaced")
		noFollow := tailnetHTTPClient(15 * time.Second)
		noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		defer noFollow.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+fqdn+"/old/page?x=1", nil)
		Expect(err).NotTo(HaveOccurred())
		resp, err := noFollow.Do(req)
		Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusMovedPermanently))
		Expect(resp.Header.Get("Location")).To(Equal("https://" + fqdn + "/new/page?x=1"))

		Expect(suite.K8s.Delete(ctx, edge)).To(Succeed())
		expectProxyGone(ctx, proxies.ParentTypeGateway, edge, deviceID)
	})

	It("serves plain HTTP listeners on any port without a certificate, each route on the listeners it attaches to, by hostname", func(ctx SpecContext) {
		ns, port, edge := newEdgeGateway(ctx, "e2e-gwp")
		web := kubeobj.Listener("web", gatewayv1.HTTPProtocolType, 80)
		web.Hostname = ptr.To[gatewayv1.Hostname]("*.example.com")
		edge.Spec.Listeners = []gatewayv1.Listener{web, kubeobj.Listener("alt", gatewayv1.HTTPProtocolType, 8080)}
		// Each route tells the backend its listener in a request header; /header answers with it.
		route := func(listener string) *gatewayv1.HTTPRoute {
			rule := kubeobj.HTTPRule(gatewayv1.PathMatchPathPrefix, "/", "", framework.BackendName, port)
			rule.Filters = []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestHeaderModifier,
				RequestHeaderModifier: &gatewayv1.HTTPHeaderFilter{Set: []gatewayv1.HTTPHeader{{Name: "X-Listener", Value: listener}}}}}
			r := kubeobj.HTTPRoute(ns, listener, edge.Name, rule)
			r.Spec.ParentRefs[0].SectionName = ptr.To(gatewayv1.SectionName(listener))
			return r
		}
		suite.Create(ctx, edge)
		suite.Create(ctx, route("web"))
		suite.Create(ctx, route("alt"))

		By("programming the Gateway once its proxy listens, with no certificate to wait for")
		fqdn := programmedAddresses(ctx, edge, 1)[0].Value
		deviceID := proxyDevice(ctx, proxies.ParentTypeGateway, edge)

		hc := tailnetHTTPClient(15 * time.Second)
		defer hc.CloseIdleConnections()
		get := func(url, host string) (int, string, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return 0, "", err
			}
			req.Host = host
			resp, err := hc.Do(req)
			if err != nil {
				return 0, "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), err
		}
		for _, tc := range []struct {
			url, host string
			code      int
			listener  string
		}{
			{"http://" + fqdn + "/header?key=X-Listener", "shop.example.com", http.StatusOK, "web"},
			{"http://" + fqdn + "/header?key=X-Listener", "a.b.example.com", http.StatusOK, "web"}, // a wildcard of any depth
			{"http://" + fqdn + "/header?key=X-Listener", "example.org", http.StatusNotFound, ""},  // no listener's hostname
			{"http://" + fqdn + ":8080/header?key=X-Listener", "example.org", http.StatusOK, "alt"},
		} {
			By(fmt.Sprintf("GET %s for %s: %d %s", tc.url, tc.host, tc.code, tc.listener))
			Eventually(ctx, func(g Gomega) {
				code, body, err := get(tc.url, tc.host)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(code).To(Equal(tc.code), body)
				if tc.code == http.StatusOK {
					g.Expect(body).To(Equal(tc.listener))
				}
			}).Should(Succeed())
		}
		By("serving no HTTPS: no listener asks for it")
		_, _, err := get("https://"+fqdn+"/", fqdn)
		Expect(err).To(HaveOccurred())

		Expect(suite.K8s.Delete(ctx, edge)).To(Succeed())
		expectProxyGone(ctx, proxies.ParentTypeGateway, edge, deviceID)
	})

	It("serves an HTTPS listener's certificateRefs for its own hostname beside the tailnet name", func(ctx SpecContext) {
		ns, port, edge := newEdgeGateway(ctx, "e2e-gwc")
		custom := "shop-" + framework.Token() + ".example.com"
		ca := newTestCA()
		now := time.Now()
		data, leaf := ca.issue(custom, now.Add(-time.Hour), now.Add(24*time.Hour))
		suite.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop-tls"}, Type: corev1.SecretTypeTLS, Data: data})
		// The namespace's owner lets the operator read its TLS Secrets, as for an Ingress's.
		suite.Create(ctx, kubeobj.TLSSecretReaderBinding(ns, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "operator", Namespace: suite.opNS}))
		shop := kubeobj.Listener("shop", gatewayv1.HTTPSProtocolType, 443)
		shop.Hostname = ptr.To(gatewayv1.Hostname(custom))
		shop.TLS = &gatewayv1.ListenerTLSConfig{CertificateRefs: []gatewayv1.SecretObjectReference{{Name: "shop-tls"}}}
		edge.Spec.Listeners = append(edge.Spec.Listeners, shop)
		suite.Create(ctx, edge)
		suite.Create(ctx, kubeobj.HTTPRoute(ns, "web", edge.Name, kubeobj.HTTPRule(gatewayv1.PathMatchPathPrefix, "/", "", framework.BackendName, port)))

		fqdn := programmedAddresses(ctx, edge, 1)[0].Value
		deviceID := proxyDevice(ctx, proxies.ParentTypeGateway, edge)
		addr := netip.AddrPortFrom(peerIPv4(ctx, fqdn), 443).String()
		By("presenting the Secret's certificate for " + custom)
		expectCustomHost(ctx, addr, custom, ca, leaf)
		By("serving the tailnet name with its ACME certificate still")
		expectTailnetName(ctx, addr, fqdn)

		Expect(suite.K8s.Delete(ctx, edge)).To(Succeed())
		expectProxyGone(ctx, proxies.ParentTypeGateway, edge, deviceID)
	})
})
