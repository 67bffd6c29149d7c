package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/poll"
)

// Ingresses annotated tailscale.com/funnel, one standalone and one on a ProxyGroup of two
// replicas, with certificates from the local tailnet's ACME CA: while the tailnet's policy does
// not grant the proxies' tag the funnel attribute, each says so (Event, and port 443's error)
// and the internet gets nothing; once it does, a client that is not on the tailnet resolves the
// names in the public DNS, reaches the Funnel relay and gets the pages, verifying the
// certificates; the ProxyGroup's name stays public while a replica stops; when the annotation
// goes, the names leave the internet and stay on the tailnet.
func TestFunnelIngress(t *testing.T) {
	begin := time.Now()
	lt, _ := localtailnettest.Start(t, localtailnet.Options{ACME: true, Funnel: true, Logf: t.Logf})
	// Namespace "internal" is not let use Funnel: its Ingress asks and stays on the tailnet.
	w := startCluster(t, lt, contract.FirewallAuto, func(s *kit.Settings) { s.FunnelNamespaces = []string{"public"} })
	if err := w.lt.ACME.UseInProcess(t.Setenv); err != nil {
		t.Fatal(err)
	}
	const ns, pg = "public", "edge"
	backend := newHAGroupWithBackend(t, w, ns, pg)
	newIngress := func(name string, annotations map[string]string) *networkingv1.Ingress {
		annotations[kit.AnnotationFunnel] = "true"
		return webIngress(ns, name, name, annotations)
	}
	solo, shared := newIngress("solo", map[string]string{}), newIngress("shared", map[string]string{kit.AnnotationProxyGroup: pg})
	for _, ing := range []*networkingv1.Ingress{solo, shared} {
		if err := w.k8s.Create(w.ctx, ing); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "internal"}}); err != nil {
		t.Fatal(err)
	}
	if err := w.k8s.Create(w.ctx, loopbackService("internal", "web", backend.port())); err != nil {
		t.Fatal(err)
	}
	private := webIngress("internal", "private", "private", map[string]string{kit.AnnotationFunnel: "true"})
	if err := w.k8s.Create(w.ctx, private); err != nil {
		t.Fatal(err)
	}
	runStandaloneProxy(t, w, client.MatchingLabels{kit.LabelParentName: solo.Name}, proxy.Options{})
	runStandaloneProxy(t, w, client.MatchingLabels{kit.LabelParentName: private.Name}, proxy.Options{})
	privateName := "private." + w.lt.Domain
	replicas := []*haReplica{newHAReplica(t, w, pg, 0, nil, ""), newHAReplica(t, w, pg, 1, nil, "")}
	for _, r := range replicas {
		r.start()
	}
	names := map[*networkingv1.Ingress]string{solo: "solo." + w.lt.Domain, shared: "shared." + w.lt.Domain}

	// Not permitted: said on each Ingress, served on the tailnet only.
	for ing, fqdn := range names {
		poll.Eventually(t, 90*time.Second, ing.Name+" status with Funnel not permitted", func() error {
			return wantPortError(w, ing, fqdn, kit.ReasonFunnelNotPermitted)
		})
		poll.Eventually(t, 10*time.Second, ing.Name+" FunnelNotPermitted Event", func() error {
			return wantEvent(w, ing, kit.ReasonFunnelNotPermitted, `{"target": ["tag:k8s"], "attr": ["funnel"]}`)
		})
	}
	laptop := joinClient(t, w, "laptop")
	onTailnet := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: laptop.Dial, TLSClientConfig: &tls.Config{RootCAs: w.lt.ACME.Roots()}, DisableKeepAlives: true}}
	public := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: w.lt.PublicDialer(), TLSClientConfig: &tls.Config{RootCAs: w.lt.ACME.Roots()}, DisableKeepAlives: true}}
	for _, fqdn := range names {
		poll.Eventually(t, 30*time.Second, "https://"+fqdn+" on the tailnet", func() error { return fetch(onTailnet, fqdn, "web /tailnet") })
		if err := fetch(public, fqdn, "web /"); err == nil {
			t.Errorf("https://%s answers the internet before the policy grants Funnel", fqdn)
		}
	}
	t.Logf("both Ingresses served on the tailnet, Funnel not permitted, %s after creation", time.Since(begin).Round(time.Millisecond))

	// Granted: public.
	w.lt.SetNodeAttrs([]localtailnet.NodeAttr{{Target: []string{"tag:k8s"}, Attr: []string{"funnel"}}})
	granted := time.Now()
	for ing, fqdn := range names {
		poll.Eventually(t, 60*time.Second, "https://"+fqdn+" from the internet", func() error { return fetch(public, fqdn, "web /from-the-internet") })
		if h := backend.lastHeaders(); h.Get("Tailscale-Funnel-Request") != "?1" || h.Get("Tailscale-User-Login") != "" ||
			!strings.HasPrefix(h.Get("X-Forwarded-For"), "127.0.0.1") {
			t.Errorf("%s: headers at the backend of a request from the internet: %v", ing.Name, h)
		}
		poll.Eventually(t, 30*time.Second, ing.Name+" status without a port error", func() error { return wantPortError(w, ing, fqdn, "") })
		poll.Eventually(t, 10*time.Second, ing.Name+" FunnelEnabled Event", func() error {
			return wantEvent(w, ing, kit.ReasonFunnelEnabled, "https://"+fqdn)
		})
	}
	t.Logf("both Ingresses served to the internet %s after the policy granted Funnel", time.Since(granted).Round(time.Millisecond))

	// The namespace the operator keeps off Funnel: said on the Ingress, on the tailnet only,
	// though the tailnet's policy would let its proxy.
	poll.Eventually(t, 30*time.Second, "private's port 443 error", func() error {
		return wantPortError(w, private, privateName, kit.ReasonFunnelNamespaceNotPermitted)
	})
	if err := wantEvent(w, private, kit.ReasonFunnelNamespaceNotPermitted, "namespace internal"); err != nil {
		t.Error(err)
	}
	poll.Eventually(t, 30*time.Second, "https://"+privateName+" on the tailnet", func() error { return fetch(onTailnet, privateName, "web /private") })
	if err := fetch(public, privateName, "web /"); err == nil {
		t.Errorf("https://%s answers the internet, though its namespace may not use Funnel", privateName)
	}

	// A replica of the group goes: the relay sends the shared name's connections to the other.
	replicas[1].stop(t)
	for i := range 10 {
		if err := fetch(public, names[shared], fmt.Sprintf("web /one-replica/%d", i)); err != nil {
			t.Errorf("with one replica left: %v", err)
		}
	}
	replicas[1].start()
	// Back before the next step, which expects the tailnet name served without a pause.
	poll.Eventually(t, 60*time.Second, "replica 1 advertising svc:shared again", func() error { return replicas[1].advertises(w, "svc:shared") })

	// The annotation goes: off the internet, still on the tailnet.
	for ing, fqdn := range names {
		patch := client.MergeFrom(ing.DeepCopy())
		delete(ing.Annotations, kit.AnnotationFunnel)
		if err := w.k8s.Patch(w.ctx, ing, patch); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 30*time.Second, "https://"+fqdn+" gone from the internet", func() error {
			if err := fetch(public, fqdn, "web /"); err == nil {
				return fmt.Errorf("still answers the internet")
			}
			return nil
		})
		if err := fetch(onTailnet, fqdn, "web /still"); err != nil {
			t.Errorf("%s no longer served on the tailnet: %v", fqdn, err)
		}
	}
}

// fetch gets https://<fqdn>/<path> and checks the answer; path is taken from want ("web /x").
func fetch(c *http.Client, fqdn, want string) error {
	_, path, _ := strings.Cut(want, " ")
	res, err := c.Get("https://" + fqdn + path)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK || string(body) != want {
		return fmt.Errorf("%s: %d %q, want %q", fqdn, res.StatusCode, body, want)
	}
	return nil
}

// wantPortError checks that the Ingress's status lists fqdn with port 443's error reason
// ("" for none).
func wantPortError(w *world, ing *networkingv1.Ingress, fqdn, reason string) error {
	if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(ing), ing); err != nil {
		return err
	}
	for _, lb := range ing.Status.LoadBalancer.Ingress {
		if lb.Hostname != fqdn {
			continue
		}
		for _, p := range lb.Ports {
			if p.Port != 443 {
				continue
			}
			if got := ptr.Deref(p.Error, ""); got != reason {
				return fmt.Errorf("port 443 error %q, want %q", got, reason)
			}
			return nil
		}
	}
	return fmt.Errorf("status %+v lists no port 443 of %s", ing.Status.LoadBalancer.Ingress, fqdn)
}

// wantEvent checks that an Event with reason, whose message contains text, was emitted for ing.
func wantEvent(w *world, ing *networkingv1.Ingress, reason, text string) error {
	list := &eventsv1.EventList{}
	if err := w.k8s.List(w.ctx, list, client.InNamespace(ing.Namespace)); err != nil {
		return err
	}
	var seen []string
	for _, e := range list.Items {
		if e.Regarding.Name != ing.Name || e.Regarding.Kind != "Ingress" {
			continue
		}
		if e.Reason == reason && strings.Contains(e.Note, text) {
			return nil
		}
		seen = append(seen, e.Reason+": "+e.Note)
	}
	return fmt.Errorf("no %s Event saying %q among %q", reason, text, seen)
}
