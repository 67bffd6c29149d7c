package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"

	"k8s.io/client-go/kubernetes"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/l3"
)

// service is a standalone L3 proxy's unit: the kernel DNATs the node's own tailnet addresses to
// the config's destination.
type service struct {
	*core
	l3     *dnat   // nil until prepared
	relays *relays // the ports relayed with PROXY protocol headers; nil until started
}

func newService(c *core, _ kubernetes.Interface) (unit, error) { return &service{core: c}, nil }

func (p *service) prepare(ctx context.Context, node *tsnet.Server) (err error) {
	if p.l3, err = newDNAT(ctx, p.core); err != nil {
		return fmt.Errorf("setting up the L3 data path: %w", err)
	}
	node.Tun = p.l3.fwd.TUN()
	return nil
}

func (p *service) start(ctx context.Context) error {
	p.l3.watch(ctx)
	p.relays = newRelays(p.core, nil)
	return nil
}

func (p *service) restartReason(old, cfg *contract.ProxyConfig) string {
	return firewallRestart(old, cfg)
}

func (p *service) configure(context.Context, *contract.ProxyConfig) error { return nil }

// onStatus leaves the rules in place when the node logs out: the device may come back, and they
// forward nothing meanwhile.
func (p *service) onStatus(context.Context) error { return nil }

// mapping is what the forwarder is to install: the node's addresses to the config's
// destination.
func (p *service) mapping() l3.Mapping {
	m := l3.Mapping{Name: contract.StandaloneMapping, Destination: *p.cfg.cfg.Forward}
	for _, s := range p.status.ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			m.TailnetIPs = append(m.TailnetIPs, ip)
		}
	}
	return m
}

// reconcile gives the forwarder the node's addresses and the destination when either changed,
// or when a failed attempt is due again.
func (p *service) reconcile(ctx context.Context) error {
	want := p.mapping()
	if !p.status.running {
		return nil
	}
	p.relays.sync(ctx, []l3.Mapping{want})
	if !p.l3.needed([]l3.Mapping{want}) {
		return nil
	}
	// A family the TUN cannot take (IPv6 disabled, say) fails alone: the other is forwarded,
	// and SetMappings reports the failed one in the status and its error.
	var linkErr error
	if p.l3.applied == nil || !slices.Equal(p.l3.applied[0].TailnetIPs, want.TailnetIPs) {
		linkErr = p.l3.fwd.SetTailnetIPs(want.TailnetIPs)
	}
	if p.l3.install(ctx, []l3.Mapping{want}, linkErr) == nil {
		m := p.l3.fwd.Status().Mappings[contract.StandaloneMapping]
		p.log.Info("forwarding", "tailnetIPs", m.TailnetIPs, "destinations", m.Destinations, "destination", want.Destination)
	}
	return nil
}

// report adds the forwarder's status. The proxy is ready once the node's addresses, of one
// family at least, are DNATed to the current destination: a family that cannot be forwarded is
// reported in the status, not by taking the Pod out of service.
func (p *service) report(st *contract.ProxyState) string {
	if p.l3 == nil {
		return "" // the first report, before the node starts: the core says it waits for the login
	}
	fs := p.l3.fwd.Status()
	fs.PodUID = p.opts.PodUID
	st.Firewall = &fs
	m, ok := fs.Mappings[contract.StandaloneMapping]
	switch {
	case p.l3.applied != nil && reflect.DeepEqual(p.l3.applied, []l3.Mapping{p.mapping()}) && ok && len(m.TailnetIPs) > 0:
		if p.relays != nil {
			return p.relays.ready(p.mapping())
		}
		return ""
	case p.l3.err != nil:
		return "installing the DNAT rules failed: " + p.l3.err.Error()
	case ok && m.Error != "":
		return "the DNAT rules are not in place: " + m.Error
	}
	return "installing the DNAT rules"
}

func (p *service) drain() {}

func (p *service) close() error {
	if p.relays != nil {
		p.relays.close()
	}
	return p.l3.close()
}
