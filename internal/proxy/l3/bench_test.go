package l3

import (
	"context"
	"io"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/contract"
)

// BenchmarkTCP pushes data from a userspace tsnet client over the tailnet through the proxy's
// TUN and DNAT to a backend, which counts what arrived: the whole data path, both tailnet
// ends on this machine's CPUs. Run with -bench TCP -benchtime 64x or so.
func BenchmarkTCP(b *testing.B) {
	top := newTopology(b)
	env := startTailnet(b)
	ctx := b.Context()
	fwd, err := New(ctx, Options{NetNS: top.Proxy.Path, FirewallMode: contract.FirewallNFTables, Logf: b.Logf})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { fwd.Close(context.Background()) })
	proxy := env.join(b, "proxy", fwd.TUN())
	client := env.join(b, "client", nil)
	ip4, _ := proxy.TailscaleIPs()
	if err := fwd.SetTailnetIPs([]netip.Addr{ip4}); err != nil {
		b.Fatal(err)
	}
	err = fwd.SetMappings(ctx, []Mapping{{Name: contract.StandaloneMapping, TailnetIPs: []netip.Addr{ip4},
		Destination: contract.Destination{IPs: []string{backendA4.String()}}}})
	if err != nil {
		b.Fatal(err)
	}
	// The first packets wait for the tailnet path.
	eventually(b, "TCP echo", 10*time.Second, backendA4.String(), func(ctx context.Context) (string, error) {
		return tcpEcho(ctx, client, ip4, "warm up")
	})

	c, err := client.Dial(ctx, "tcp", netip.AddrPortFrom(ip4, sinkPort).String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	chunk := make([]byte, 1<<20)
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		b.Fatal(err)
	}
	got, err := io.ReadAll(c)
	b.StopTimer()
	if n, _ := strconv.Atoi(string(got)); err != nil || n != b.N*len(chunk) {
		b.Fatalf("backend received %q bytes (%v), want %d", got, err, b.N*len(chunk))
	}
}
