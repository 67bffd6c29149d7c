package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/tailcfg"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/proxy/web"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/poll"
)

// App capabilities the tailnet policy grants a caller reach an Ingress's backends when the
// Ingress accepts them, standalone and on a ProxyGroup: a standalone proxy passes what the
// policy grants on its device, a replica what it grants on the Tailscale Service. A caller
// granted nothing gets "{}", whatever it sent; capabilities not accepted never pass; a change
// of the policy shows within the proxies' identity cache (10s).
func TestAppCapabilitiesWholeFlow(t *testing.T) {
	begin := time.Now()
	w := startWorldWith(t, localtailnet.Options{ACME: true, Logf: t.Logf}, contract.FirewallAuto)
	if err := w.lt.ACME.UseInProcess(t.Setenv); err != nil {
		t.Fatal(err)
	}
	const ns, pg = "caps", "pg"
	const admin, mon, unaccepted = "example.com/cap/admin", "example.com/cap/mon", "example.com/cap/unaccepted"
	backend := newHAGroupWithBackend(t, w, ns, pg)
	newIngress := func(name string, annotations map[string]string) *networkingv1.Ingress {
		annotations[kit.AnnotationAcceptAppCaps] = admin + "," + mon
		ing := webIngress(ns, name, name, annotations)
		if err := w.k8s.Create(w.ctx, ing); err != nil {
			t.Fatal(err)
		}
		return ing
	}
	solo, shared := newIngress("solo", map[string]string{}), newIngress("shared", map[string]string{kit.AnnotationProxyGroup: pg})
	w.lt.SetAppGrants([]localtailnet.AppGrant{
		{Src: []string{"alice@example.com"}, Dst: []string{"tag:k8s"}, App: tailcfg.PeerCapMap{admin: {`{"on":"device"}`}}},
		{Src: []string{"alice@example.com"}, Dst: []string{"svc:shared"}, App: tailcfg.PeerCapMap{admin: {`{"on":"service"}`}}},
		{Src: []string{"*"}, Dst: []string{"*"}, App: tailcfg.PeerCapMap{unaccepted: {`{}`}}},
	})
	runStandaloneProxy(t, w, client.MatchingLabels{kit.LabelParentName: solo.Name}, proxy.Options{})
	for i := range 2 {
		newHAReplica(t, w, pg, i, nil, "").start()
	}

	alice := capsClient(joinClient(t, w, "alice-laptop"), w)
	bob := capsClient(joinUser(t, w, "bob-laptop", "bob@example.com", "Bob Example"), w)
	names := map[string]string{solo.Name: "solo." + w.lt.Domain, shared.Name: "shared." + w.lt.Domain}
	// caps asks as c, sending a forged header, and returns what the backend was given.
	caps := func(c *http.Client, fqdn string) (string, error) {
		req, err := http.NewRequestWithContext(w.ctx, http.MethodGet, "https://"+fqdn+"/caps", nil)
		if err != nil {
			return "", err
		}
		req.Header.Set(web.HeaderAppCapabilities, `{"`+admin+`":[{"on":"forged"}]}`)
		res, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK || string(body) != "web /caps" {
			return "", fmt.Errorf("%s: %d %q", fqdn, res.StatusCode, body)
		}
		return backend.lastHeaders().Get(web.HeaderAppCapabilities), nil
	}
	expect := func(c *http.Client, who, ing, want string) {
		t.Helper()
		poll.Eventually(t, 90*time.Second, who+" on "+ing, func() error {
			got, err := caps(c, names[ing])
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("%s = %q, want %q", web.HeaderAppCapabilities, got, want)
			}
			return nil
		})
	}
	expect(alice, "alice", solo.Name, `{"example.com/cap/admin":[{"on":"device"}]}`)
	expect(alice, "alice", shared.Name, `{"example.com/cap/admin":[{"on":"service"}]}`)
	t.Logf("alice's grants at both backends %s after creation", time.Since(begin).Round(time.Millisecond))
	for _, ing := range []string{solo.Name, shared.Name} {
		expect(bob, "bob", ing, `{}`)
	}

	w.lt.SetAppGrants(nil)
	revoked := time.Now()
	for _, ing := range []string{solo.Name, shared.Name} {
		expect(alice, "alice after the grants are gone", ing, `{}`)
	}
	t.Logf("the grants' removal seen at both backends %s after it", time.Since(revoked).Round(time.Millisecond))
}

func capsClient(node *tsnet.Server, w *world) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: node.Dial, TLSClientConfig: &tls.Config{RootCAs: w.lt.ACME.Roots()}, DisableKeepAlives: true}}
}
