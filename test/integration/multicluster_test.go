package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/tsnet"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/poll"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// mcCluster is one cluster of the multi-cluster test: its control plane and operator, and the
// one replica of its ProxyGroup, whose backends answer with the cluster's name.
type mcCluster struct {
	name    string
	w       *world
	replica *haReplica
	ing     *networkingv1.Ingress
	svc     *corev1.Service
}

// Two clusters (two API servers, two operators) on one tailnet, each with a ProxyGroup "pg",
// an HA Ingress "web" and an HA Service "db" of the same names, serve the Tailscale Services
// svc:web and svc:db together: both operators are recorded as owners, clients are spread over
// both clusters, and a client routed to one cluster keeps getting answers, from the other, when
// that cluster's ProxyGroup goes away. Neither operator deletes a service the other still owns:
// not when its ProxyGroup goes, not when its objects go; the last owner's release deletes it.
func TestMultiClusterIngress(t *testing.T) {
	netnstest.NeedRoot(t, "nft") // the replicas DNAT the HA Service's VIP in network namespaces
	begin := time.Now()
	lt, _ := localtailnettest.Start(t, localtailnet.Options{HTTPS: true})
	ca := proxytest.NewCA(t)
	const ns, pg, webSvc, dbSvc = "shop", "pg", "svc:web", "svc:db"
	var clusters []*mcCluster
	for _, name := range []string{"east", "west"} {
		c := &mcCluster{name: name, w: startCluster(t, lt, contract.FirewallAuto, func(s *kit.Settings) {
			s.SharedServiceResync = sharedResync
		})}
		clusters = append(clusters, c)
		k8s, ctx := c.w.k8s, c.w.ctx
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
		backend := newRecordingBackend(t, name)
		if err := k8s.Create(ctx, loopbackService(ns, "web", backend.port())); err != nil {
			t.Fatal(err)
		}
		// Same group name in both clusters; the prefix tells their devices apart on the tailnet.
		if err := k8s.Create(ctx, &tsv1alpha1.ProxyGroup{
			ObjectMeta: metav1.ObjectMeta{Name: pg},
			Spec: tsv1alpha1.ProxyGroupSpec{Type: tsv1alpha1.ProxyGroupTypeIngress, Replicas: ptr.To[int32](1),
				HostnamePrefix: name},
		}); err != nil {
			t.Fatal(err)
		}
		c.ing = &networkingv1.Ingress{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Annotations: map[string]string{kit.AnnotationProxyGroup: pg}},
			Spec: networkingv1.IngressSpec{
				IngressClassName: ptr.To("tailscale"),
				TLS:              []networkingv1.IngressTLS{{Hosts: []string{"web"}}},
				DefaultBackend: &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
					Name: "web", Port: networkingv1.ServiceBackendPort{Name: "http"}}},
			},
		}
		c.svc = &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db", Annotations: map[string]string{
				kit.AnnotationProxyGroup: pg, kit.AnnotationHostname: "db"}},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(kit.LoadBalancerClass),
				Ports: []corev1.ServicePort{{Name: "db", Port: proxytest.EchoTCPPort, Protocol: corev1.ProtocolTCP}},
			},
		}
		for _, o := range []client.Object{c.ing, c.svc} {
			if err := k8s.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		// The cluster's backend of the HA Service answers on its ClusterIP, as kube-proxy would
		// make it reachable from the replica's Pod, with the cluster's name.
		top := proxytest.NewTopology(t)
		proxytest.AddBackend(t, top, netip.MustParseAddr(c.svc.Spec.ClusterIP), name)
		c.replica = newHAReplica(t, c.w, pg, 0, ca, top.Proxy.Path)
		c.replica.start()
	}
	east, west := clusters[0], clusters[1]
	api := east.w.api

	// Both operators record their ownership; both replicas host both services.
	operatorIDs := []string{idOf(t, east), idOf(t, west)}
	slices.Sort(operatorIDs)
	for _, svc := range []string{webSvc, dbSvc} {
		poll.Eventually(t, 60*time.Second, svc+" owned by both operators", func() error {
			return wantOwners(api, svc, operatorIDs)
		})
		for _, c := range clusters {
			poll.Eventually(t, 60*time.Second, c.name+" advertising "+svc, func() error { return c.replica.advertises(c.w, svc) })
		}
	}
	ts, err := api.Service(east.w.ctx, dbSvc)
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.AddrPortFrom(ts.Addrs[0], proxytest.EchoTCPPort).String()
	t.Logf("both clusters serve %s and %s %s after creation", webSvc, dbSvc, time.Since(begin).Round(time.Millisecond))

	// The control plane spreads clients over the services' hosts: two clients reach both.
	webURL := "https://web." + lt.Domain + "/"
	routedTo := map[string]*tsnet.Server{}
	for _, host := range []string{"laptop", "phone"} {
		cl := joinClient(t, east.w, host) // the tailnet is the same from either cluster
		httpc := haHTTPClient(cl, ca.Pool())
		var web, db string
		poll.Eventually(t, 30*time.Second, host+" reaching both services", func() error {
			ctx, cancel := context.WithTimeout(east.w.ctx, 5*time.Second)
			defer cancel()
			var err error
			if web, err = answerOf(ctx, httpc, webURL); err != nil {
				return err
			}
			db, err = proxytest.Echo(ctx, cl, "tcp", vip)
			return err
		})
		if web != db {
			t.Errorf("%s: %s answered by %s, %s by %s; want one host for both", host, webSvc, web, dbSvc, db)
		}
		routedTo[web] = cl
	}
	if routedTo["east"] == nil || routedTo["west"] == nil {
		t.Fatalf("clients routed to %v; want one to each cluster", slices.Sorted(maps.Keys(routedTo)))
	}

	// The clusters' Ingresses differ for a while (a change rolled out to one cluster first): the
	// service carries what either asks for, whichever operator writes last.
	patch := client.MergeFrom(east.ing.DeepCopy())
	east.ing.Annotations[kit.AnnotationHTTPRedirect] = "true"
	if err := east.w.k8s.Patch(east.w.ctx, east.ing, patch); err != nil {
		t.Fatal(err)
	}
	wantPorts := []string{"tcp:443", "tcp:80"}
	poll.Eventually(t, 30*time.Second, webSvc+" with east's port 80", func() error { return wantServicePorts(api, webSvc, wantPorts) })
	patch = client.MergeFrom(west.ing.DeepCopy())
	west.ing.Labels = map[string]string{"rollout": "next"} // west's operator passes over its Ingress again
	if err := west.w.k8s.Patch(west.w.ctx, west.ing, patch); err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if err := wantServicePorts(api, webSvc, wantPorts); err != nil {
			t.Fatalf("after west's operator passed over its Ingress: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A write by one operator made from a read that predates the other's record (two clusters
	// claiming the service at once) drops that record: the other operator notices and records
	// itself again, without any change to its objects, so that a release never deletes the
	// service under it.
	for _, name := range []string{webSvc, dbSvc} {
		svc, err := api.Service(east.w.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		var refs map[string][]map[string]any
		if err := json.Unmarshal([]byte(svc.Annotations["tailscale.com/owner-references"]), &refs); err != nil {
			t.Fatal(err)
		}
		refs["ownerRefs"] = slices.DeleteFunc(refs["ownerRefs"], func(r map[string]any) bool { return r["operatorID"] == idOf(t, east) })
		raw, _ := json.Marshal(refs)
		svc.Annotations["tailscale.com/owner-references"] = string(raw)
		if _, err := api.PutService(east.w.ctx, svc); err != nil {
			t.Fatal(err)
		}
		if err := wantOwners(api, name, []string{idOf(t, west)}); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 3*sharedResync, "east recording itself again on "+name, func() error { return wantOwners(api, name, operatorIDs) })
	}

	// West's ProxyGroup goes; its replica stops as its Pod does. The client it served moves to
	// east.
	cl := routedTo["west"]
	httpc := haHTTPClient(cl, ca.Pool())
	ctx, stopLoad := context.WithCancel(east.w.ctx)
	defer stopLoad()
	const every = 50 * time.Millisecond
	load := startHALoad(ctx, every, []string{webURL, vip}, func(ctx context.Context, target string) (string, error) {
		if target == webURL {
			return answerOf(ctx, httpc, target)
		}
		return proxytest.Echo(ctx, cl, "tcp", target)
	})
	tl := &haTimeline{load: load}
	time.Sleep(2 * time.Second)
	if err := west.w.k8s.Delete(west.w.ctx, &tsv1alpha1.ProxyGroup{ObjectMeta: metav1.ObjectMeta{Name: pg}}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, "west's replica Pod going", func() error {
		pod := &corev1.Pod{}
		err := west.w.k8s.Get(west.w.ctx, client.ObjectKey{Namespace: west.w.opNS, Name: pg + "-0"}, pod)
		if apierrors.IsNotFound(err) || (err == nil && pod.DeletionTimestamp != nil) {
			return nil
		}
		return fmt.Errorf("Pod still there (%v)", err)
	})
	tl.mark(true, "stopping west's replica")
	west.replica.stop(t)
	tl.mark(false, "west's replica stopped")
	time.Sleep(4 * time.Second)
	stopLoad()
	rep := summarize(load.wait())
	t.Logf("timeline:\n  %s", tl)
	t.Logf("west's ProxyGroup going: %s; answered by %v", rep, rep.answeredBy)
	for _, f := range rep.fails {
		t.Logf("  failed: %s", f)
	}
	if rep.total < 100 {
		t.Errorf("only %d requests sent", rep.total)
	}
	// One move of the client's route (west's withdrawal), which may cost the requests then in
	// flight on each target; none may fail away from it.
	if len(rep.fails) > 2*5 {
		t.Errorf("%d requests failed; want at most 10", len(rep.fails))
	}
	for _, f := range rep.fails {
		if !tl.nearMove(f) {
			t.Errorf("a request failed away from the route change: %s", f)
		}
	}
	reqs := load.wait()
	for _, r := range reqs[len(reqs)-20:] {
		if r.err != nil || r.answer != "east" {
			t.Errorf("after west's ProxyGroup went, %s answered by %q (%v); want east", r.target, r.answer, r.err)
		}
	}
	// West's objects still stand, so the services keep both owners.
	for _, svc := range []string{webSvc, dbSvc} {
		if err := wantOwners(api, svc, operatorIDs); err != nil {
			t.Errorf("after west's ProxyGroup went: %s: %v", svc, err)
		}
	}

	// West's objects go: west releases the services to east, which keeps serving.
	for _, o := range []client.Object{west.ing, west.svc} {
		if err := west.w.k8s.Delete(west.w.ctx, o); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 30*time.Second, "west's "+o.GetName()+" deleted", func() error {
			if err := west.w.k8s.Get(west.w.ctx, client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
	for _, svc := range []string{webSvc, dbSvc} {
		if err := wantOwners(api, svc, []string{idOf(t, east)}); err != nil {
			t.Errorf("after west's objects went: %s: %v", svc, err)
		}
	}
	ctx2, cancel := context.WithTimeout(east.w.ctx, 10*time.Second)
	defer cancel()
	if who, err := answerOf(ctx2, httpc, webURL); err != nil || who != "east" {
		t.Errorf("after west left, %s: %q, %v", webSvc, who, err)
	}
	if who, err := proxytest.Echo(ctx2, cl, "tcp", vip); err != nil || who != "east" {
		t.Errorf("after west left, %s: %q, %v", dbSvc, who, err)
	}

	// East's Ingress goes too: its Tailscale Service goes with its last owner.
	if err := east.w.k8s.Delete(east.w.ctx, east.ing); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, webSvc+" deleted with its last owner", func() error {
		if _, err := api.Service(east.w.ctx, webSvc); !tailnet.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}

// sharedResync is how often the operators check their records on shared Tailscale Services in
// the multi-cluster test, rather than every five minutes.
const sharedResync = 2 * time.Second

// wantServicePorts checks a Tailscale Service's ports.
func wantServicePorts(api tailnet.Client, name string, ports []string) error {
	svc, err := api.Service(context.Background(), name)
	if err != nil {
		return err
	}
	if !slices.Equal(svc.Ports, ports) {
		return fmt.Errorf("%s ports %v, want %v", name, svc.Ports, ports)
	}
	return nil
}

// idOf is a cluster's operator ID: the UID of its namespace.
func idOf(t *testing.T, c *mcCluster) string {
	t.Helper()
	nsObj := &corev1.Namespace{}
	if err := c.w.k8s.Get(c.w.ctx, client.ObjectKey{Name: c.w.opNS}, nsObj); err != nil {
		t.Fatal(err)
	}
	return string(nsObj.UID)
}

// wantOwners checks that a Tailscale Service's ownership records name exactly the operators ids.
func wantOwners(api tailnet.Client, name string, ids []string) error {
	svc, err := api.Service(context.Background(), name)
	if err != nil {
		return err
	}
	var refs struct {
		OwnerRefs []struct {
			OperatorID string `json:"operatorID"`
		} `json:"ownerRefs"`
	}
	if err := json.Unmarshal([]byte(svc.Annotations["tailscale.com/owner-references"]), &refs); err != nil {
		return fmt.Errorf("ownership annotation: %w", err)
	}
	var got []string
	for _, r := range refs.OwnerRefs {
		got = append(got, r.OperatorID)
	}
	slices.Sort(got)
	if !slices.Equal(got, ids) {
		return fmt.Errorf("owners %v, want %v", got, ids)
	}
	return nil
}

// answerOf gets url and returns who answered: the first word of the body ("east /").
func answerOf(ctx context.Context, c *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	res, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return "", err
	}
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%d %q", res.StatusCode, body)
	}
	who, _, _ := strings.Cut(string(body), " ")
	return who, nil
}
