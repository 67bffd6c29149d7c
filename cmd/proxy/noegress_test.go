package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"tailscale.com/envknob"
	"tailscale.com/ipn/store/mem"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

const (
	// noEgressChildEnv makes TestNoEgressChild run the flow (inside the watched namespace); its
	// value is the ClusterIP to forward to.
	noEgressChildEnv = "TSINGRESS_TEST_NOEGRESS_CLUSTERIP"
	// runProxyEnv makes the test binary the proxy: run with the binary's arguments, before the
	// testing package is set up, so that nothing in the proxy knows it runs under a test (the
	// tailnet client skips log upload in tests).
	runProxyEnv = "TSINGRESS_TEST_RUN_PROXY"
	// controlHost names the control server, as a cluster names its own: a lookup of it can fail,
	// and so can its address, and then the tailnet client looks for another way to it.
	controlHost = "control.tsingress.test"
)

func init() {
	if os.Getenv(runProxyEnv) != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
}

// The whole L3 flow (a local tailnet, the proxy as its binary runs with its defaults, a client,
// traffic to a Service) inside a network namespace whose only way off the machine is a TUN that
// the test reads: any packet to an address that is not local, a DNS query to the resolver
// included, fails the test. The proxy meets a control server it cannot reach at first, as when
// DNS or the server is down, which makes the tailnet client look the server up through
// Tailscale's public DERP servers (bootstrap DNS) unless the proxy refuses.
func TestNoEgress(t *testing.T) {
	netnstest.NeedRoot(t, "nft")
	clusterIP := netip.MustParseAddr("10.96.0.10")
	top := proxytest.NewTopology(t, clusterIP)
	p := top.Proxy
	watch := newEgressWatch(t, p, "egress0")
	// The ClusterIPs stay reachable through the node; everything else that is not local goes
	// into the watch.
	p.IP(t, "route", "replace", "default", "via", "192.0.2.1", "dev", "egress0")
	p.IP(t, "-6", "route", "replace", "default", "via", "2001:db8::1", "dev", "egress0")
	p.IP(t, "route", "add", "10.96.0.0/24", "via", "10.250.1.1")

	// The namespace's resolver is local and answers nothing; the control server's name is in
	// its hosts file.
	dir := t.TempDir()
	hosts, resolv := filepath.Join(dir, "hosts"), filepath.Join(dir, "resolv.conf")
	writeFile(t, hosts, "127.0.0.1 localhost "+controlHost+"\n::1 localhost\n")
	writeFile(t, resolv, "nameserver 127.0.0.53\n")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", p.Name, "sh", "-c",
		`mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf && exec "$2" -test.run='^TestNoEgressChild$' -test.v`,
		hosts, resolv, os.Args[0])
	cmd.Env = append(os.Environ(), noEgressChildEnv+"="+clusterIP.String(), "KUBECONFIG=", "KUBERNETES_SERVICE_HOST=")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestNoEgressChild")) {
		t.Fatalf("the flow in the namespace: %v\n%s", err, out)
	}
	time.Sleep(200 * time.Millisecond) // packets still on their way to the watch
	if sent := watch.sent(); len(sent) > 0 {
		t.Errorf("packets to addresses off the machine:\n%s\n\nthe flow's output:\n%s", strings.Join(sent, "\n"), out)
	}
}

// TestNoEgressChild is the flow of TestNoEgress, run inside its namespace; alone it does nothing.
func TestNoEgressChild(t *testing.T) {
	clusterIP := os.Getenv(noEgressChildEnv)
	if clusterIP == "" {
		t.Skip("runs inside the namespace of TestNoEgress")
	}
	ctx := t.Context()
	lt, api := localtailnettest.Start(t, localtailnet.Options{})
	key, err := api.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(lt.ControlURL)
	if err != nil {
		t.Fatal(err)
	}
	controlURL := "http://" + controlHost + ":" + u.Port()

	// The control server refuses connections while the proxy starts.
	nft(t, "add table inet noegress")
	nft(t, "add chain inet noegress out { type filter hook output priority 0; }")
	nft(t, "add rule inet noegress out tcp dport "+u.Port()+" reject with tcp reset")

	cfg, err := contract.ProxyConfigs.Encode(&contract.ProxyConfig{
		Kind: contract.KindService, Hostname: "noegress", Tags: []string{"tag:k8s"}, ControlURL: controlURL,
		AuthKey: key.Secret.Reveal(), StateSecret: "noegress-0", Forward: &contract.Destination{IPs: []string{clusterIP}},
	})
	if err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	proxyCmd := exec.Command(os.Args[0], "--config-dir", writeConfig(t, cfg), "--state-dir", stateDir,
		"--health-addr", "", "--tailnet-port", "0", "--verbose")
	proxyCmd.Env = append(os.Environ(), runProxyEnv+"=1")
	var proxyOut syncBuffer
	proxyCmd.Stdout, proxyCmd.Stderr = &proxyOut, &proxyOut
	if err := proxyCmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- proxyCmd.Wait() }()
	defer func() {
		_ = proxyCmd.Process.Signal(syscall.SIGTERM) // fails only once it has exited, as exited says
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("the proxy: %v", err)
			}
		case <-time.After(30 * time.Second):
			proxyCmd.Process.Kill()
			t.Error("the proxy did not stop")
		}
		if t.Failed() {
			t.Logf("the proxy's output:\n%s", proxyOut.String())
		}
	}()

	// Until the tailnet client has tried another way to the control server.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(proxyOut.String(), "bootstrapDNS"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the proxy never looked for another address of the control server: the test no longer provokes bootstrap DNS")
		}
	}
	nft(t, "delete table inet noegress")

	envknob.Setenv("TS_DISABLE_PORTMAPPER", "true") // the test's own node; the proxy started without it
	client := &tsnet.Server{Dir: t.TempDir(), ControlURL: controlURL, Hostname: "client", Store: new(mem.Store), Ephemeral: true,
		AuthKey: mustKey(t, api), Logf: logger.Discard, UserLogf: logger.Discard}
	t.Cleanup(func() { client.Close() })
	if _, err := client.Up(ctx); err != nil {
		t.Fatal(err)
	}
	var ip4 netip.Addr
	for deadline := time.Now().Add(60 * time.Second); !ip4.IsValid(); time.Sleep(200 * time.Millisecond) {
		select {
		case err := <-exited:
			t.Fatalf("the proxy exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not log in")
		}
		ip4 = stateIPv4(filepath.Join(stateDir, "noegress-0", "proxy-state.json"))
	}
	proxytest.ExpectBackend(t, client, ip4, netip.MustParseAddr(clusterIP))
}

func mustKey(t *testing.T, api *tailnet.APIClient) string {
	t.Helper()
	k, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return k.Secret.Reveal()
}

// stateIPv4 reads the IPv4 tailnet address off a proxy's state file, once the proxy forwards it.
func stateIPv4(path string) netip.Addr {
	b, err := os.ReadFile(path)
	if err != nil {
		return netip.Addr{}
	}
	var m map[string]string
	if json.Unmarshal(b, &m) != nil {
		return netip.Addr{}
	}
	data := map[string][]byte{}
	for k, v := range m {
		data[k] = []byte(v)
	}
	st, err := contract.ParseState(data)
	if err != nil || st.Firewall == nil {
		return netip.Addr{}
	}
	for _, s := range st.Firewall.Mappings[contract.StandaloneMapping].TailnetIPs {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

func nft(t *testing.T, rule string) {
	t.Helper()
	if out, err := exec.Command("nft", rule).CombinedOutput(); err != nil {
		t.Fatalf("nft %s: %v: %s", rule, err, out)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// egressWatch is a TUN that a namespace routes everything that is not local into, as if off the
// machine; it records what arrives.
type egressWatch struct {
	mu   sync.Mutex
	seen []string
}

func newEgressWatch(t *testing.T, ns netnstest.NS, name string) *egressWatch {
	t.Helper()
	var f *os.File
	err := netnamespace.Run(ns.Path, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), name)
		return nil
	})
	if err != nil {
		t.Fatalf("watch TUN: %v", err)
	}
	ns.IP(t, "addr", "add", "192.0.2.2/24", "dev", name)
	ns.IP(t, "addr", "add", "2001:db8::2/64", "dev", name, "nodad")
	ns.IP(t, "link", "set", name, "up")
	w := &egressWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, err := f.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) {
					t.Logf("watch TUN: %v", err)
				}
				return
			}
			if s := describe(buf[:n]); s != "" {
				s = time.Now().Format("15:04:05.000 ") + s
				w.mu.Lock()
				w.seen = append(w.seen, s)
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { f.Close(); <-done })
	return w
}

// sent lists what reached the watch, each destination once.
func (w *egressWatch) sent() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := slices.Clone(w.seen)
	slices.Sort(out)
	return slices.Compact(out)
}

// describe names a packet's protocol and destination, or "" for what the kernel says about the
// watch interface itself to its link (IPv6 neighbour discovery and multicast listener reports).
func describe(pkt []byte) string {
	if len(pkt) < 1 {
		return ""
	}
	var dst netip.Addr
	var proto byte
	var l4 []byte
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < 20 {
			return ""
		}
		dst, proto = netip.AddrFrom4([4]byte(pkt[16:20])), pkt[9]
		l4 = pkt[int(pkt[0]&0x0f)*4:]
	case 6:
		if len(pkt) < 40 {
			return ""
		}
		dst, proto, l4 = netip.AddrFrom16([16]byte(pkt[24:40])), pkt[6], pkt[40:]
		if dst.IsLinkLocalMulticast() || dst.IsLinkLocalUnicast() || dst.IsInterfaceLocalMulticast() {
			return ""
		}
	default:
		return ""
	}
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		if len(l4) >= 4 {
			return fmt.Sprintf("%s %s", map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[proto],
				netip.AddrPortFrom(dst, uint16(l4[2])<<8|uint16(l4[3])))
		}
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		if len(l4) >= 2 {
			msg := fmt.Sprintf("icmp type %d code %d to %s", l4[0], l4[1], dst)
			if inner := l4[min(8, len(l4)):]; proto == unix.IPPROTO_ICMP && l4[0] != 0 && l4[0] != 8 && len(inner) >= 20 {
				msg += fmt.Sprintf(" about a packet from %s to %s, protocol %d, TTL %d", netip.AddrFrom4([4]byte(inner[12:16])), netip.AddrFrom4([4]byte(inner[16:20])), inner[9], inner[8])
			}
			return msg
		}
	}
	return fmt.Sprintf("protocol %d to %s", proto, dst)
}
