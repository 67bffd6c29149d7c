package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
	"github.com/tsingress/tsingress/internal/testing/tailnetdial"
)

// relayPort is the port the PROXY protocol backend answers on, TCP and UDP.
const relayPort = 7000

// A standalone L3 proxy that relays its Service's ports with PROXY protocol headers: the backend
// reads the client's tailnet address and the address it connected to, over TCP (v1 and v2) and
// UDP (v2), a changed version takes effect without a restart, and the ports not relayed stay
// DNATed.
func TestServiceProxyPROXYProtocol(t *testing.T) {
	netnstest.NeedRoot(t, "nft")
	env := proxytest.StartKube(t)
	w := newWorld(t)
	top := proxytest.NewTopology(t, clusterIPA)
	proxytest.AddProxyProtocolBackend(t, top, clusterIPA, relayPort)
	relayed := []contract.Port{{Port: relayPort, Protocol: "TCP"}, {Port: relayPort, Protocol: "UDP"}}
	cfg := &contract.ProxyConfig{
		Kind: contract.KindService, Hostname: "db", Tags: []string{"tag:k8s"}, ControlURL: w.lt.ControlURL,
		AuthKey: w.mintKey(t).Secret.Reveal(), StateSecret: "db-0",
		Firewall: contract.FirewallConfig{Mode: contract.FirewallNFTables},
		Forward:  &contract.Destination{IPs: []string{clusterIPA.String()}, ProxyProtocol: 2, Ports: relayed},
	}
	data, err := contract.ProxyConfigs.Encode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	env.Secret(t, ns, "db-0", data)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	health, done := w.start(t, ctx, proxy.Options{
		ConfigSecret: "db-0", Kube: env.Config, Namespace: ns, PodUID: "pod-1", StateDir: t.TempDir(), NetNS: top.Proxy.Path,
	})
	if _, err := w.client.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitReady(t, health, done)
	sec, err := env.Client.CoreV1().Secrets(ns).Get(t.Context(), "db-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := contract.ParseState(sec.Data)
	if err != nil {
		t.Fatal(err)
	}
	var proxyIP netip.Addr
	for _, s := range st.TailnetIPs {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			proxyIP = a
		}
	}
	dst := netip.AddrPortFrom(proxyIP, relayPort)

	// ask sends payload over network to the relayed port and returns the backend's answer.
	ask := func(network, payload string) (answer, src string, err error) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		c, err := tailnetdial.Dial(ctx, w.client, network, dst.String())
		if err != nil {
			return "", "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second)) // a read error follows
		if network == "tcp" {
			payload += "\n"
		}
		if _, err := io.WriteString(c, payload); err != nil {
			return "", "", err
		}
		if network == "tcp" {
			// Until the relay closes: the client's netstack keeps no closed connection behind,
			// which would hold up its Close.
			b, err := io.ReadAll(c)
			return string(b), c.LocalAddr().String(), err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		return string(buf[:n]), c.LocalAddr().String(), err
	}
	expect := func(t *testing.T, network string, version int) {
		t.Helper()
		var got, want string
		var err error
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			var src string
			got, src, err = ask(network, "hello "+network)
			want = fmt.Sprintf("v%d %s %s hello %s", version, src, dst, network)
			if err == nil && got == want {
				return
			}
		}
		var relayLogs []string
		for _, l := range strings.Split(w.logs.String(), "\n") {
			if strings.Contains(l, "relay") {
				relayLogs = append(relayLogs, l)
			}
		}
		t.Fatalf("%s to %s: the backend answered %q (%v), want %q; the proxy's relay logs:\n%s", network, dst, got, err, want,
			strings.Join(relayLogs, "\n"))
	}
	expect(t, "tcp", 2)
	expect(t, "udp", 2)
	// The other ports are DNATed as before: the echo backend answers, with no header in the way.
	proxytest.ExpectBackend(t, w.client, proxyIP, clusterIPA)

	t.Run("version change", func(t *testing.T) {
		cfg.AuthKey = ""
		cfg.Forward = &contract.Destination{IPs: []string{clusterIPA.String()}, ProxyProtocol: 1,
			Ports: []contract.Port{{Port: relayPort, Protocol: "TCP"}}}
		data, err := contract.ProxyConfigs.Encode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.Client.CoreV1().Secrets(ns).Patch(t.Context(), "db-0", "application/merge-patch+json",
			mustJSON(t, map[string]any{"data": data}), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		expect(t, "tcp", 1)
		// UDP is no longer relayed: the datagram is DNATed to the backend as it is, which
		// finds no header in it.
		var got string
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !strings.HasPrefix(got, "no header"); {
			got, _, _ = ask("udp", "hello udp")
		}
		if !strings.HasPrefix(got, "no header") {
			t.Errorf("UDP after v1: the backend answered %q, want \"no header: ...\"", got)
		}
	})

	t.Run("logs", func(t *testing.T) {
		out := w.logs.String()
		for _, evidence := range []string{"relaying with PROXY protocol headers", "stopped a PROXY protocol relay"} {
			if !strings.Contains(out, evidence) {
				t.Errorf("the logs lack %q", evidence)
			}
		}
	})
}
