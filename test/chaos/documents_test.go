//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/test/framework"
)

// The documents a proxy reads, edited by hand under load: the proxy keeps serving what it had,
// does not restart, and the operator puts its documents back.
var _ = Describe("Documents corrupted under load", func() {
	It("leave the proxies serving and are put back", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "chaos-docs")
		suite.StartBackend(ctx, ns, suite.image)
		ing := framework.Ingress(ns, "web", "chaos-doc-"+framework.Token(), "")
		suite.Create(ctx, ing)
		pg := framework.ProxyGroup("chaos-docs-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		var has []request
		for i := range 2 {
			ha := framework.Ingress(ns, fmt.Sprintf("ha%d", i), fmt.Sprintf("chaos-doc-ha%d-%s", i, framework.Token()), pg.Name)
			suite.Create(ctx, ha)
			has = append(has, httpsEcho(suite.ServedName(ctx, ha)))
		}
		suite.WaitGroupReady(ctx, pg)
		standalone := httpsEcho(suite.ServedName(ctx, ing))
		for _, r := range append(has, standalone) {
			expectServing(ctx, r, "an Ingress")
		}
		proxy := proxyOf(ctx, "ingress", ing) + "-0"
		cm := client.ObjectKey{Namespace: opNS, Name: pg.Name + "-ingress-config"}
		before := restarts(ctx, nil)

		edits := []struct {
			what string
			obj  client.Object
			edit func(client.Object)
			back func(g Gomega, obj client.Object)
		}{
			{"the standalone proxy's config overwritten with garbage", &corev1.Secret{},
				func(o client.Object) { o.(*corev1.Secret).Data[contract.ProxyConfigs.Keys()[0]] = []byte("{garbage") },
				func(g Gomega, o client.Object) {
					_, _, err := contract.ProxyConfigs.Decode(o.(*corev1.Secret).Data)
					g.Expect(err).NotTo(HaveOccurred())
				}},
			{"the standalone proxy's config left with only a future version", &corev1.Secret{},
				func(o client.Object) {
					s := o.(*corev1.Secret)
					for _, k := range contract.ProxyConfigs.Keys() {
						delete(s.Data, k)
					}
					s.Data["proxy-config.v99.json"] = []byte(`{"version":99}`)
				},
				func(g Gomega, o client.Object) {
					_, v, err := contract.ProxyConfigs.Decode(o.(*corev1.Secret).Data)
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(v).To(BeNumerically("<", 99))
				}},
			{"the group's Serve config overwritten with garbage", &corev1.ConfigMap{},
				func(o client.Object) {
					c := o.(*corev1.ConfigMap)
					for k := range c.Data {
						if strings.HasPrefix(k, "serve-config.") {
							c.Data[k] = "garbage"
						}
					}
				},
				groupServesTwo},
			{"the group's Serve config left with only a future version", &corev1.ConfigMap{},
				func(o client.Object) {
					c := o.(*corev1.ConfigMap)
					for k := range c.Data {
						if strings.HasPrefix(k, "serve-config.") {
							delete(c.Data, k)
						}
					}
					c.Data["serve-config.v99.json"] = `{"version":99}`
				},
				groupServesTwo},
		}
		var rows []string
		for _, e := range edits {
			By(e.what)
			key := client.ObjectKey{Namespace: opNS, Name: proxy}
			if _, ok := e.obj.(*corev1.ConfigMap); ok {
				key = cm
			}
			results := underLoadAll(ctx, append(has, standalone), func() {
				Eventually(ctx, func() error {
					if err := suite.K8s.Get(ctx, key, e.obj); err != nil {
						return err
					}
					e.edit(e.obj)
					return suite.K8s.Update(ctx, e.obj, client.FieldOwner("kubectl-edit"))
				}).Should(Succeed())
				edited := time.Now()
				Eventually(ctx, func(g Gomega) {
					g.Expect(suite.K8s.Get(ctx, key, e.obj)).To(Succeed())
					e.back(g, e.obj)
				}).WithTimeout(time.Minute).Should(Succeed(), "put back")
				time.Sleep(max(time.Until(edited.Add(10*time.Second)), 0))
			})
			var sent, failed int64
			var errs []loadResult
			for _, r := range results {
				sent, failed = sent+r.sent, failed+r.failed
				errs = append(errs, r)
			}
			rows = append(rows, fmt.Sprintf("| %s | %d | %d |", e.what, sent, failed))
			Expect(failed).To(BeZero(), "%s: %s", e.what, failures(errs...))
		}
		var nRestarts int32
		for pod, n := range restarts(ctx, nil) {
			if b, ok := before[pod]; ok {
				nRestarts += n - b
			}
		}
		suite.report.add("### Documents corrupted under load\n\nThe documents proxies read, edited by hand (an update by another field "+
			"manager) while a standalone Ingress and two Ingresses on a ProxyGroup each get 5 requests/s for the 10s after the edit: "+
			"the operator puts each back, and %d containers restarted.\n\n| Edit | Requests | Failed |\n| --- | --- | --- |\n%s\n",
			nRestarts, strings.Join(rows, "\n"))
		Expect(nRestarts).To(BeZero(), "restarts")
	})
})

// groupServesTwo checks that the group's Serve config reads, with both Ingresses' entries.
func groupServesTwo(g Gomega, o client.Object) {
	data := map[string][]byte{}
	for k, v := range o.(*corev1.ConfigMap).Data {
		data[k] = []byte(v)
	}
	doc, _, err := contract.ServeConfigs.Decode(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Services).To(HaveLen(2))
}

// underLoadAll runs each request at 5/s while during runs.
func underLoadAll(ctx context.Context, rs []request, during func()) []loadResult {
	var stops []func() loadResult
	for _, r := range rs {
		stops = append(stops, background(ctx, 5, r))
	}
	during()
	var out []loadResult
	for _, stop := range stops {
		out = append(out, stop())
	}
	return out
}
