package l3_test

import (
	"context"
	"encoding/json"
	"log"
	"net/netip"

	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/l3"
)

// A standalone L3 proxy: the forwarder's TUN carries the tsnet node's traffic, and the node's
// own addresses are DNATed to the Service.
func Example() {
	ctx := context.Background()
	cfg := contract.ProxyConfig{Hostname: "db", Forward: &contract.Destination{IPs: []string{"10.96.0.10"}}}

	fwd, err := l3.New(ctx, l3.Options{FirewallMode: cfg.Firewall.Mode})
	if err != nil {
		log.Fatal(err)
	}
	srv := &tsnet.Server{Hostname: cfg.Hostname, Tun: fwd.TUN()}
	defer func() {
		srv.Close() // first: the node uses the TUN until it stops
		fwd.Close(ctx)
	}()
	if _, err := srv.Up(ctx); err != nil {
		log.Fatal(err)
	}
	ip4, ip6 := srv.TailscaleIPs()
	ips := []netip.Addr{ip4, ip6}
	if err := fwd.SetTailnetIPs(ips); err != nil {
		log.Fatal(err)
	}
	mappings := []l3.Mapping{{Name: contract.StandaloneMapping, TailnetIPs: ips, Destination: *cfg.Forward}}
	if err := fwd.SetMappings(ctx, mappings); err != nil {
		log.Print(err) // also in the status, for the operator
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-fwd.Changed():
		}
		st := fwd.Status()
		st.PodUID = "the Pod's UID"
		b, _ := json.Marshal(st)
		log.Printf("write %s=%s to the state Secret", contract.StateFirewall, b)
	}
}
