//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/test/framework"
)

// Object kinds of the churn.
const (
	kindIngress   = "standalone Ingress"
	kindService   = "standalone Service"
	kindHAIngress = "Ingress on a ProxyGroup"
	kindHAService = "Service on a ProxyGroup"
)

// churned is one object of the churn.
type churned struct {
	kind string
	obj  client.Object
	live bool
}

// The operator's Pod is deleted at random moments while Ingresses and Services, standalone and
// on a ProxyGroup, are created, edited and deleted. Afterwards everything converges, and an
// audit of the cluster and the tailnet finds nothing left over and one device per proxy.
var _ = Describe("The operator killed while objects churn", func() {
	It("converges with no orphan, no stuck finalizer and one device per live proxy", func(ctx SpecContext) {
		ns := suite.NewNamespace(ctx, "chaos-churn")
		suite.StartBackend(ctx, ns, suite.image)
		pg := framework.ProxyGroup("chaos-churn-"+framework.Token(), 2)
		suite.Create(ctx, pg)
		rng := rand.New(rand.NewPCG(uint64(GinkgoRandomSeed()), 17))
		n := suite.objects
		kinds := map[string]int{kindIngress: n * 8 / 30, kindService: n * 6 / 30, kindHAService: n * 6 / 30}
		kinds[kindHAIngress] = n - kinds[kindIngress] - kinds[kindService] - kinds[kindHAService]

		var objects []*churned
		ops := map[string]int{}
		serial := 0
		newObject := func(kind string) *churned {
			serial++
			name := fmt.Sprintf("o%d", serial)
			c := &churned{kind: kind, live: true}
			switch kind {
			case kindIngress:
				c.obj = framework.Ingress(ns, name, fmt.Sprintf("churn-%s-%s", name, ns[len(ns)-5:]), "")
			case kindHAIngress:
				c.obj = framework.Ingress(ns, name, fmt.Sprintf("churn-%s-%s", name, ns[len(ns)-5:]), pg.Name)
			case kindService:
				c.obj = l3Service(ns, name, "")
			case kindHAService:
				c.obj = l3Service(ns, name, pg.Name)
			}
			Expect(suite.K8s.Create(ctx, c.obj)).To(Succeed())
			ops["create"]++
			return c
		}
		// edit changes what an object asks for: a path more or less; a new hostname for the
		// objects on the group, which moves them to a new Tailscale Service.
		edit := func(c *churned) {
			err := retryOnConflict(ctx, c.obj, func() {
				switch o := c.obj.(type) {
				case *networkingv1.Ingress:
					if c.kind == kindHAIngress && rng.IntN(2) == 0 {
						o.Spec.TLS[0].Hosts[0] = fmt.Sprintf("%s-r%d", strings.SplitN(o.Spec.TLS[0].Hosts[0], "-r", 2)[0], rng.IntN(1000))
						return
					}
					if len(o.Spec.Rules) > 0 {
						o.Spec.Rules = nil
					} else {
						pt := networkingv1.PathTypePrefix
						o.Spec.Rules = []networkingv1.IngressRule{{IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
							Paths: []networkingv1.HTTPIngressPath{{Path: "/v2", PathType: &pt, Backend: *o.Spec.DefaultBackend}}}}}}
					}
				case *corev1.Service:
					if o.Annotations == nil { // read back without any
						o.Annotations = map[string]string{}
					}
					if c.kind == kindHAService {
						o.Annotations[kit.AnnotationHostname] = fmt.Sprintf("%s-%s-r%d", o.Name, ns, rng.IntN(1000))
					} else {
						o.Annotations["example.com/edited"] = fmt.Sprint(rng.IntN(1000))
					}
				}
			})
			Expect(err).NotTo(HaveOccurred())
			ops["edit"]++
		}

		By(fmt.Sprintf("creating %d objects, then editing, deleting and recreating them while the operator is killed %d times", n, suite.operatorKills))
		start := time.Now()
		var kills []time.Time
		killerDone := make(chan struct{})
		// The killer's own generator: a rand.Rand is not safe for concurrent use.
		killerRng := rand.New(rand.NewPCG(uint64(GinkgoRandomSeed()), 50))
		go func() {
			defer GinkgoRecover()
			defer close(killerDone)
			for range suite.operatorKills {
				time.Sleep(time.Duration(1000+killerRng.IntN(7000)) * time.Millisecond)
				if ctx.Err() != nil {
					return
				}
				pods := &corev1.PodList{}
				// A loaded API server may time out a request: retried, within bounds.
				Eventually(ctx, func() error {
					return suite.K8s.List(ctx, pods, client.InNamespace(opNS), operatorPods)
				}).WithTimeout(time.Minute).Should(Succeed())
				for _, p := range pods.Items {
					if p.DeletionTimestamp == nil {
						Expect(client.IgnoreNotFound(suite.K8s.Delete(ctx, &p))).To(Succeed())
					}
				}
				kills = append(kills, time.Now())
			}
		}()
		for kind, count := range sortedCounts(kinds) {
			for range count {
				objects = append(objects, newObject(kind))
				time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
			}
		}
	churn:
		for {
			select {
			case <-killerDone:
				break churn
			case <-time.After(time.Duration(500+rng.IntN(2000)) * time.Millisecond):
			}
			c := objects[rng.IntN(len(objects))]
			switch r := rng.IntN(100); {
			case !c.live:
				objects = append(objects, newObject(c.kind))
			case r < 65:
				edit(c)
			default:
				Expect(client.IgnoreNotFound(suite.K8s.Delete(ctx, c.obj))).To(Succeed())
				c.live = false
				ops["delete"]++
			}
		}
		churnTook := time.Since(start)
		Expect(kills).To(HaveLen(suite.operatorKills), "operator Pods deleted")

		By("converging")
		converged := time.Now()
		var live []*churned
		for _, c := range objects {
			if c.live {
				live = append(live, c)
			}
		}
		Eventually(ctx, func(g Gomega) {
			g.Expect(stuck(ctx, g, ns)).To(BeEmpty(), "objects being deleted")
			for _, c := range live {
				g.Expect(serve(ctx, g, c)).To(Succeed(), "%s %s", c.kind, c.obj.GetName())
			}
		}).WithTimeout(10*time.Minute).WithPolling(2*time.Second).Should(Succeed(), "every live object served, every deleted one gone")
		convergeTook := time.Since(converged)

		By("auditing the cluster and the tailnet")
		a := audit(ctx, ns, pg, live)
		byKind := map[string]int{}
		for _, c := range live {
			byKind[c.kind]++
		}
		suite.report.add("### The operator killed while objects churn\n\n%d objects (%s) created, then edited (a path more or less; "+
			"a new hostname for the objects on a ProxyGroup of 2 replicas, which moves them to a new Tailscale Service), deleted "+
			"and recreated, %d operations in all (%s), while the operator's Pod was deleted %d times, 1 to 8s apart (%s). Afterwards, "+
			"within %s, every deleted object was gone and each of the %d live ones served through the tailnet (HTTPS or TCP). The audit:\n\n%s\n",
			n, countList(kinds), ops["create"]+ops["edit"]+ops["delete"], countList(ops), len(kills), churnTook.Round(time.Second),
			convergeTook.Round(time.Second), len(live), a.table())
		a.expectClean()

		By("deleting everything: nothing left on the tailnet")
		for _, c := range live {
			Expect(client.IgnoreNotFound(suite.K8s.Delete(ctx, c.obj))).To(Succeed())
		}
		Expect(suite.K8s.Delete(ctx, pg)).To(Succeed())
		Eventually(ctx, func(g Gomega) {
			devices, err := suite.API.Devices(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			var left []string
			for _, d := range devices {
				if d.ID != suite.ClientID {
					left = append(left, d.Hostname)
				}
			}
			g.Expect(left).To(BeEmpty(), "devices left")
			services, err := suite.API.Services(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(services).To(BeEmpty(), "Tailscale Services left")
			g.Expect(stuck(ctx, g, ns)).To(BeEmpty())
			g.Expect(children(ctx, g, ns, pg.Name)).To(BeEmpty(), "the operator's children left")
		}).Should(Succeed())
		suite.report.add("Once every object and the ProxyGroup were deleted: 0 devices, 0 Tailscale Services and 0 children of theirs " +
			"(Secrets, certificate Secrets included, StatefulSets, ConfigMaps, Roles, RoleBindings, ServiceAccounts) left.")
	})
})

func retryOnConflict(ctx context.Context, obj client.Object, change func()) error {
	for range 10 {
		if err := suite.K8s.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		change()
		err := suite.K8s.Update(ctx, obj)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("%s: conflicts", obj.GetName())
}

// stuck lists the objects being deleted: in the namespace, and ProxyGroups.
func stuck(ctx context.Context, g Gomega, ns string) []string {
	var out []string
	for _, list := range []client.ObjectList{&networkingv1.IngressList{}, &corev1.ServiceList{}} {
		g.Expect(suite.K8s.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		g.Expect(meta.EachListItem(list, func(o runtime.Object) error {
			if co := o.(client.Object); co.GetDeletionTimestamp() != nil {
				out = append(out, co.GetName()+" "+strings.Join(co.GetFinalizers(), ","))
			}
			return nil
		})).To(Succeed())
	}
	pgs := &tsv1alpha1.ProxyGroupList{}
	g.Expect(suite.K8s.List(ctx, pgs)).To(Succeed())
	for _, p := range pgs.Items {
		if p.DeletionTimestamp != nil {
			out = append(out, p.Name)
		}
	}
	return out
}

// serve checks that a live object is served through the tailnet as it now asks.
func serve(ctx context.Context, g Gomega, c *churned) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	switch o := c.obj.(type) {
	case *networkingv1.Ingress:
		g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(o), o)).To(Succeed())
		lb := o.Status.LoadBalancer.Ingress
		g.Expect(lb).NotTo(BeEmpty())
		g.Expect(lb[0].Hostname).To(HavePrefix(o.Spec.TLS[0].Hosts[0]+"."), "the current hostname")
		return httpsEcho(lb[0].Hostname)(rctx)
	case *corev1.Service:
		g.Expect(suite.K8s.Get(ctx, client.ObjectKeyFromObject(o), o)).To(Succeed())
		var ip string
		for _, in := range o.Status.LoadBalancer.Ingress {
			if in.IP != "" && !strings.Contains(in.IP, ":") {
				ip = in.IP
			}
			if c.kind == kindHAService && in.Hostname != "" {
				g.Expect(in.Hostname).To(HavePrefix(o.Annotations[kit.AnnotationHostname]+"."), "the current hostname")
			}
		}
		g.Expect(ip).NotTo(BeEmpty(), "a tailnet IPv4")
		return echo("http://" + ip + ":80")(rctx)
	}
	return nil
}

// auditResult is what the audit counted.
type auditResult struct {
	orphans        map[string][]string // kind → orphaned objects
	devices        int
	liveProxies    int
	perProxy       map[string]int // hostname of a live proxy → its devices
	tailscaleSvcs  int
	expectedSvcs   int
	stuck          []string
	orphanDevices  []string
	orphanServices []string
	keptCerts      []string // a ProxyGroup's certificate Secrets of names no live object serves
}

// audit counts, against the live objects: the operator's children whose parent is gone (or, for
// a group's certificate Secrets, whose name no Ingress serves), the tailnet's devices that no
// live proxy's state names, the devices of each live proxy, the Tailscale Services no live
// object serves, and the objects stuck being deleted.
func audit(ctx context.Context, ns string, pg *tsv1alpha1.ProxyGroup, live []*churned) auditResult {
	GinkgoHelper()
	a := auditResult{orphans: map[string][]string{}, perProxy: map[string]int{}}
	exists := map[string]bool{"proxygroup/" + pg.Name: true}
	services := map[string]bool{}
	certNames := map[string]bool{}
	var stateSecrets []string
	for _, c := range live {
		switch o := c.obj.(type) {
		case *networkingv1.Ingress:
			exists["ingress/"+ns+"/"+o.Name] = true
			host := o.Spec.TLS[0].Hosts[0]
			if c.kind == kindHAIngress {
				services["svc:"+host] = true
				fqdn := o.Status.LoadBalancer.Ingress[0].Hostname
				certNames[strings.ToLower(fqdn)] = true
			}
		case *corev1.Service:
			exists["svc/"+ns+"/"+o.Name] = true
			if c.kind == kindHAService {
				services["svc:"+o.Annotations[kit.AnnotationHostname]] = true
			}
		}
	}
	lists := map[string]client.ObjectList{
		"StatefulSet": &appsv1.StatefulSetList{}, "Secret": &corev1.SecretList{}, "ConfigMap": &corev1.ConfigMapList{},
		"ServiceAccount": &corev1.ServiceAccountList{}, "Role": &rbacv1.RoleList{}, "RoleBinding": &rbacv1.RoleBindingList{},
	}
	for kind, list := range lists {
		Expect(suite.ListEach(ctx, list, proxyNS(), client.MatchingLabels{kit.LabelManaged: "true"})).To(Succeed())
		Expect(meta.EachListItem(list, func(o runtime.Object) error {
			co := o.(client.Object)
			l := co.GetLabels()
			if l[kit.LabelParentType] == "" {
				return nil // the operator's own (its certificate ledger), of no object
			}
			key := l[kit.LabelParentType] + "/" + l[kit.LabelParentName]
			if l[kit.LabelParentType] != "proxygroup" {
				key = l[kit.LabelParentType] + "/" + l[kit.LabelParentNS] + "/" + l[kit.LabelParentName]
			}
			orphan := !exists[key]
			if !orphan && kind == "Secret" && l[kit.LabelSecretType] == "group-certificate" && !certNames[co.GetName()] {
				// Kept by design for a name served again, and deleted with the ProxyGroup
				// (checked once everything is deleted, below).
				a.keptCerts = append(a.keptCerts, co.GetName())
				return nil
			}
			if orphan {
				a.orphans[kind] = append(a.orphans[kind], co.GetName())
			} else if kind == "Secret" && (l[kit.LabelSecretType] == "config-state" || l[kit.LabelSecretType] == "state") {
				stateSecrets = append(stateSecrets, co.GetName())
			}
			return nil
		})).To(Succeed())
	}
	named := map[string]string{} // device ID → the proxy whose state names it
	for _, name := range stateSecrets {
		Eventually(ctx, func(g Gomega) {
			st := state(ctx, g, name)
			g.Expect(st.DeviceID).NotTo(BeEmpty(), "the device of %s", name)
			named[st.DeviceID] = name
		}).WithTimeout(time.Minute).Should(Succeed())
	}
	a.liveProxies = len(stateSecrets)
	devices, err := suite.API.Devices(ctx)
	Expect(err).NotTo(HaveOccurred())
	for _, d := range devices {
		if d.ID == suite.ClientID {
			continue
		}
		a.devices++
		if proxy, ok := named[d.ID]; ok {
			a.perProxy[proxy]++
		} else {
			a.orphanDevices = append(a.orphanDevices, d.Hostname+" ("+d.ID+")")
		}
	}
	tsServices, err := suite.API.Services(ctx)
	Expect(err).NotTo(HaveOccurred())
	a.tailscaleSvcs, a.expectedSvcs = len(tsServices), len(services)
	for _, s := range tsServices {
		if !services[s.Name] {
			a.orphanServices = append(a.orphanServices, s.Name)
		}
	}
	a.stuck = stuck(ctx, Default, ns)
	return a
}

// children lists the operator's children, in its namespace, of objects in namespace ns or of
// ProxyGroup pg.
func children(ctx context.Context, g Gomega, ns, pg string) []string {
	var out []string
	for kind, list := range map[string]client.ObjectList{
		"StatefulSet": &appsv1.StatefulSetList{}, "Secret": &corev1.SecretList{}, "ConfigMap": &corev1.ConfigMapList{},
		"ServiceAccount": &corev1.ServiceAccountList{}, "Role": &rbacv1.RoleList{}, "RoleBinding": &rbacv1.RoleBindingList{},
	} {
		g.Expect(suite.ListEach(ctx, list, proxyNS(), client.MatchingLabels{kit.LabelManaged: "true"})).To(Succeed())
		g.Expect(meta.EachListItem(list, func(o runtime.Object) error {
			co := o.(client.Object)
			l := co.GetLabels()
			if l[kit.LabelParentNS] == ns || (l[kit.LabelParentType] == "proxygroup" && l[kit.LabelParentName] == pg) {
				out = append(out, kind+" "+co.GetName())
			}
			return nil
		})).To(Succeed())
	}
	return out
}

func (a auditResult) table() string {
	rows := [][2]string{}
	for _, kind := range []string{"Secret", "StatefulSet", "Role", "RoleBinding", "ServiceAccount", "ConfigMap"} {
		rows = append(rows, [2]string{"orphaned " + kind + "s", fmt.Sprint(len(a.orphans[kind]))})
	}
	one := 0
	for _, n := range a.perProxy {
		if n == 1 {
			one++
		}
	}
	rows = append(rows,
		[2]string{"orphaned devices in the tailnet API", fmt.Sprint(len(a.orphanDevices))},
		[2]string{"orphaned Tailscale Services", fmt.Sprint(len(a.orphanServices))},
		[2]string{"objects stuck with finalizers", fmt.Sprint(len(a.stuck))},
		[2]string{"the ProxyGroup's certificate Secrets of names no longer served (kept for reuse while the ProxyGroup lives)", fmt.Sprint(len(a.keptCerts))},
		[2]string{"live proxies (standalone proxies and replicas) with exactly one device", fmt.Sprintf("%d of %d", one, a.liveProxies)},
		[2]string{"devices in the tailnet, besides the suite's client", fmt.Sprint(a.devices)},
		[2]string{"Tailscale Services, for the live objects on the ProxyGroup", fmt.Sprintf("%d, for %d", a.tailscaleSvcs, a.expectedSvcs)},
	)
	s := "| Audit | Count |\n| --- | --- |\n"
	for _, r := range rows {
		s += "| " + r[0] + " | " + r[1] + " |\n"
	}
	return s
}

func (a auditResult) expectClean() {
	GinkgoHelper()
	Expect(a.orphans).To(BeEmpty(), "orphaned children")
	Expect(a.orphanDevices).To(BeEmpty(), "orphaned devices")
	Expect(a.orphanServices).To(BeEmpty(), "orphaned Tailscale Services")
	Expect(a.stuck).To(BeEmpty(), "stuck objects")
	Expect(len(a.perProxy)).To(Equal(a.liveProxies), "live proxies with a device")
	for proxy, n := range a.perProxy {
		Expect(n).To(Equal(1), "devices of %s", proxy)
	}
}

func sortedCounts(m map[string]int) func(func(string, int) bool) {
	return func(yield func(string, int) bool) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !yield(k, m[k]) {
				return
			}
		}
	}
}

func countList(m map[string]int) string {
	var parts []string
	for k, v := range sortedCounts(m) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, v))
	}
	return strings.Join(parts, ", ")
}
