package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// Addresses that exist only in the test's namespaces, standing in for ClusterIPs.
var (
	clusterIPA = netip.MustParseAddr("10.96.0.10")
	clusterIPB = netip.MustParseAddr("10.96.0.11")
)

// A standalone L3 proxy from its config Secret: it replaces stale state, DNATs its tailnet
// address to the destination in its kernel namespace, follows changed destinations without a
// restart, reports what it installed, and leaves nothing behind when it stops.
func TestServiceProxy(t *testing.T) {
	netnstest.NeedRoot(t, "nft")
	env := proxytest.StartKube(t)
	w := newWorld(t)
	top := proxytest.NewTopology(t, clusterIPA, clusterIPB)
	secrets := env.Client.CoreV1().Secrets(ns)
	key := w.mintKey(t)
	cfg := &contract.ProxyConfig{
		Kind: contract.KindService, Hostname: "db", Tags: []string{"tag:k8s"}, ControlURL: w.lt.ControlURL,
		AuthKey: key.Secret.Reveal(), StateSecret: "db-0",
		Firewall: contract.FirewallConfig{Mode: contract.FirewallNFTables},
		Forward:  &contract.Destination{IPs: []string{clusterIPA.String()}},
	}
	data, err := contract.ProxyConfigs.Encode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// With the keys of an earlier Pod, which must not read as current.
	stale := contract.ProxyState{PodUID: "old-pod", DeviceID: "nOLD", Firewall: &contract.FirewallStatus{
		Mode: contract.FirewallIPTables, PodUID: "old-pod",
		Mappings: map[string]contract.AppliedDNAT{contract.StandaloneMapping: {TailnetIPs: []string{"100.64.9.9"}, Destinations: []string{"10.9.9.9"}}},
	}}
	staleData, _ := stale.Data()
	for k, v := range staleData {
		data[k] = v
	}
	env.Secret(t, ns, "db-0", data)
	writeConfig := func(t *testing.T) {
		t.Helper()
		data, err := contract.ProxyConfigs.Encode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := secrets.Patch(t.Context(), "db-0", "application/merge-patch+json", mustJSON(t, map[string]any{"data": data}), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	readState := func(t *testing.T) *contract.ProxyState {
		t.Helper()
		sec, err := secrets.Get(t.Context(), "db-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := contract.ParseState(sec.Data)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	// mapping waits until the state reports a standalone mapping that satisfies ok.
	mapping := func(t *testing.T, what string, ok func(contract.AppliedDNAT) bool) {
		t.Helper()
		eventually(t, what, func() bool {
			st := readState(t)
			return st.Firewall != nil && st.Firewall.PodUID == "pod-1" && ok(st.Firewall.Mappings[contract.StandaloneMapping])
		})
	}
	to := func(dst netip.Addr) func(contract.AppliedDNAT) bool {
		return func(m contract.AppliedDNAT) bool {
			return m.Error == "" && slices.Equal(m.Destinations, []string{dst.String()})
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	health, done := w.start(t, ctx, proxy.Options{
		ConfigSecret: "db-0", Kube: env.Config, Namespace: ns, PodUID: "pod-1", StateDir: t.TempDir(), NetNS: top.Proxy.Path,
	})
	if _, err := w.client.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitReady(t, health, done)

	st := readState(t)
	var ip4 netip.Addr
	for _, s := range st.TailnetIPs {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			ip4 = a
		}
	}
	if st.PodUID != "pod-1" || st.DeviceID == "" || st.DeviceID == "nOLD" || st.FQDN != "db.tailnet.test" || !ip4.IsValid() ||
		st.ConfigVersion != contract.ProxyConfigs.Newest() || st.Firewall == nil || st.Firewall.Mode != contract.FirewallNFTables || st.Firewall.PodUID != "pod-1" {
		t.Fatalf("state = %+v, firewall %+v", st, st.Firewall)
	}
	// The Service is IPv4 only: only the IPv4 tailnet address has a destination.
	if m := st.Firewall.Mappings[contract.StandaloneMapping]; !slices.Equal(m.TailnetIPs, []string{ip4.String()}) ||
		!slices.Equal(m.Destinations, []string{clusterIPA.String()}) || m.Error != "" {
		t.Errorf("mapping = %+v", m)
	}
	if out := top.Proxy.IP(t, "-brief", "addr", "show", "dev", "tailscale0"); !strings.Contains(out, ip4.String()+"/32") {
		t.Errorf("the TUN lacks the tailnet address %s: %s", ip4, out)
	}
	proxytest.ExpectBackend(t, w.client, ip4, clusterIPA)

	t.Run("changed destination", func(t *testing.T) {
		// As the operator writes it once the device is logged in: no auth key.
		cfg.AuthKey = ""
		cfg.Forward = &contract.Destination{IPs: []string{clusterIPB.String()}}
		writeConfig(t)
		mapping(t, "the mapping to "+clusterIPB.String(), to(clusterIPB))
		proxytest.ExpectBackend(t, w.client, ip4, clusterIPB)

		// An ExternalName whose name never resolves (RFC 6761): the error reaches the state
		// and readiness, and the next good destination mends both.
		cfg.Forward = &contract.Destination{DNSName: "db.invalid"}
		writeConfig(t)
		mapping(t, "the mapping error", func(m contract.AppliedDNAT) bool { return strings.Contains(m.Error, "db.invalid") })
		eventually(t, "readiness to name the failure", func() bool {
			res, err := http.Get(health + "/readyz")
			if err != nil {
				return false
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(res.Body)
			return res.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "db.invalid")
		})
		cfg.Forward = &contract.Destination{IPs: []string{clusterIPA.String()}}
		writeConfig(t)
		mapping(t, "the mapping back to "+clusterIPA.String(), to(clusterIPA))
		waitReady(t, health, done)
		proxytest.ExpectBackend(t, w.client, ip4, clusterIPA)

		if got := readState(t).DeviceID; got != st.DeviceID {
			t.Errorf("device %s after the changes, want %s: the proxy logged in again", got, st.DeviceID)
		}
	})

	t.Run("firewall mode change restarts and cleans up", func(t *testing.T) {
		if left := proxytest.Leftovers(t, top.Proxy); len(left) == 0 {
			t.Fatal("no TUN or rules found while the proxy runs: the leftover check sees nothing")
		}
		cfg.Firewall.Mode = contract.FirewallIPTables
		writeConfig(t)
		err := waitDone(t, done)
		if !errors.Is(err, proxy.ErrRestartRequired) || !strings.Contains(err.Error(), "firewall mode") {
			t.Fatalf("Run returned %v, want ErrRestartRequired for the firewall mode", err)
		}
		if left := proxytest.Leftovers(t, top.Proxy); len(left) > 0 {
			t.Errorf("after Run returned, still there:\n%s", strings.Join(left, "\n"))
		}
	})

	t.Run("no auth key in the logs", func(t *testing.T) {
		out := w.logs.String()
		for _, evidence := range []string{"logged in to the tailnet", "forwarding", "authKey=REDACTED", "removed the TUN device"} {
			if !strings.Contains(out, evidence) {
				t.Errorf("the logs lack %q; is the capture working?\n%s", evidence, out)
			}
		}
		if strings.Contains(out, key.Secret.Reveal()) || strings.Contains(out, "tskey-auth-") {
			t.Error("the auth key appears in the logs")
		}
	})
}

// L3 over both families, and over IPv4 alone when the proxy's namespace has IPv6 disabled (as
// Docker and some CNIs run containers): a dual-stack Service's IPv6 tailnet address reaches its
// IPv6 ClusterIP, TCP and UDP; without IPv6 the IPv4 address still does, the proxy is ready,
// and its state says, per family, why IPv6 is not forwarded.
func TestServiceProxyFamilies(t *testing.T) {
	netnstest.NeedRoot(t, "nft")
	env := proxytest.StartKube(t)
	w := newWorld(t)
	if _, err := w.client.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	clusterIP6 := netip.MustParseAddr("fd00:96::10")
	for i, ipv6Off := range []bool{false, true} {
		name := map[bool]string{false: "dual-stack", true: "ipv6-disabled"}[ipv6Off]
		t.Run(name, func(t *testing.T) {
			top := proxytest.NewTopology(t, clusterIPA, clusterIP6)
			if ipv6Off {
				top.Proxy.DisableIPv6(t)
			}
			secret := fmt.Sprintf("db%d-0", i)
			cfg := &contract.ProxyConfig{
				Kind: contract.KindService, Hostname: fmt.Sprintf("db%d", i), Tags: []string{"tag:k8s"}, ControlURL: w.lt.ControlURL,
				AuthKey: w.mintKey(t).Secret.Reveal(), StateSecret: secret,
				Forward: &contract.Destination{IPs: []string{clusterIPA.String(), clusterIP6.String()}},
			}
			data, err := contract.ProxyConfigs.Encode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			env.Secret(t, ns, secret, data)
			ctx, cancel := context.WithCancel(t.Context())
			health, done := w.start(t, ctx, proxy.Options{
				ConfigSecret: secret, Kube: env.Config, Namespace: ns, PodUID: "pod-" + name, StateDir: t.TempDir(), NetNS: top.Proxy.Path,
			})
			t.Cleanup(func() { cancel(); _ = waitDone(t, done) }) // how the proxy stops after the cancel is not what this test checks
			waitReady(t, health, done)

			var st *contract.ProxyState
			var m contract.AppliedDNAT
			eventually(t, "the mapping in the state", func() bool {
				sec, err := env.Client.CoreV1().Secrets(ns).Get(t.Context(), secret, metav1.GetOptions{})
				if err != nil {
					return false
				}
				if st, err = contract.ParseState(sec.Data); err != nil || st.Firewall == nil || len(st.TailnetIPs) != 2 {
					return false
				}
				m = st.Firewall.Mappings[contract.StandaloneMapping]
				return len(m.TailnetIPs) > 0
			})
			var ip4, ip6 netip.Addr
			for _, s := range st.TailnetIPs {
				a := netip.MustParseAddr(s)
				if a.Is4() {
					ip4 = a
				} else {
					ip6 = a
				}
			}
			proxytest.ExpectBackend(t, w.client, ip4, clusterIPA)
			if !ipv6Off {
				if !slices.Equal(m.TailnetIPs, []string{ip4.String(), ip6.String()}) || m.Error != "" || len(st.Firewall.Families) != 0 {
					t.Errorf("mapping %+v, families %+v; want both families forwarded", m, st.Firewall.Families)
				}
				proxytest.ExpectBackend(t, w.client, ip6, clusterIP6)
				return
			}
			if !slices.Equal(m.TailnetIPs, []string{ip4.String()}) || !slices.Equal(m.Destinations, []string{clusterIPA.String()}) ||
				!strings.Contains(m.FamilyErrors[contract.FamilyIPv6], "disable_ipv6=1") || !strings.Contains(m.Error, "ipv6:") {
				t.Errorf("mapping %+v, want IPv4 forwarded and why IPv6 is not", m)
			}
			if fam := st.Firewall.Families[contract.FamilyIPv6]; fam.Reason != contract.FamilyDisabled {
				t.Errorf("IPv6 family %+v, want %s", fam, contract.FamilyDisabled)
			}
		})
	}
}
