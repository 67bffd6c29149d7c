package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/l3"
	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/proxy/relay"
	"github.com/tsingress/tsingress/internal/proxy/serviceconn"
)

// relayRetryDelay is how long a relay that could not listen waits before the next attempt.
const relayRetryDelay = 5 * time.Second

// relays runs the PROXY protocol relays of an L3 unit's mappings (contract.Destination's
// ProxyProtocol): a listener of the node's network stack on each relayed port, which takes the
// port's flows before they reach the TUN device, so that they are relayed rather than DNATed.
// The mapping's other ports stay DNATed.
//
// TCP to the node's own addresses (a standalone proxy) is a tsnet listener; TCP to a Tailscale
// Service's VIPs (a replica) comes through the replica's Serve config (serviceconn), which is
// how tailscaled takes a VIP's port into its network stack. UDP is a tsnet packet listener on
// each of the node's addresses; a replica relays no UDP (contract.DNATConfig refuses it), as
// it could bind a VIP only once it hosts it, after advertising.
type relays struct {
	c       *core
	conns   func() *serviceconn.Conns // a replica's; nil for a standalone proxy
	running map[relayKey]*runningRelay
	failed  map[string]error // by mapping: a relay that could not listen
	retry   wakeTimer
}

// relayKey identifies a running relay, which a change of version or backend keeps (its
// listener's port stays taken for a while once closed): a change of address or port replaces it.
type relayKey struct {
	mapping string
	addr    netip.Addr // UDP: the address listened on; TCP: zero (every address of the mapping)
	port    contract.Port
}

// relayTarget is what a relay relays to.
type relayTarget struct {
	version int
	hosts   []string
}

type runningRelay struct {
	relay  *relay.Relay
	target relayTarget
	ln     io.Closer
	cancel context.CancelFunc
	done   chan struct{}
}

func newRelays(c *core, conns func() *serviceconn.Conns) *relays {
	return &relays{c: c, conns: conns, running: map[relayKey]*runningRelay{}, failed: map[string]error{}}
}

// wantedRelays lists the relays of mappings, by key, with the target of each.
func wantedRelays(mappings []l3.Mapping) map[relayKey]relayTarget {
	out := map[relayKey]relayTarget{}
	for _, m := range mappings {
		d := m.Destination
		if d.ProxyProtocol == 0 {
			continue
		}
		target := relayTarget{version: d.ProxyProtocol, hosts: d.IPs}
		if d.DNSName != "" {
			target.hosts = []string{d.DNSName}
		}
		for _, p := range d.Ports {
			k := relayKey{mapping: m.Name, port: p}
			if p.Protocol == "TCP" {
				out[k] = target
				continue
			}
			for _, a := range m.TailnetIPs {
				k.addr = a.Unmap()
				out[k] = target
			}
		}
	}
	return out
}

// sync makes the running relays those of mappings: it stops the others, then starts the missing
// ones. A relay that cannot listen is tried again after relayRetryDelay; until then its
// mapping is not ready.
func (rs *relays) sync(ctx context.Context, mappings []l3.Mapping) {
	want := wantedRelays(mappings)
	for k, run := range rs.running {
		if _, ok := want[k]; !ok {
			rs.stop(k, run)
		}
	}
	rs.failed = map[string]error{}
	for _, k := range slices.SortedFunc(maps.Keys(want), compareRelayKeys) {
		target := want[k]
		if run := rs.running[k]; run != nil {
			if !reflect.DeepEqual(run.target, target) {
				run.relay.Set(target.version, target.hosts)
				run.target = target
				rs.c.log.Info("PROXY protocol relay changed", "mapping", k.mapping, "port", k.port.Port,
					"protocol", k.port.Protocol, "address", k.addr, "version", target.version, "backend", target.hosts)
			}
			continue
		}
		if err := rs.start(ctx, k, target); err != nil {
			rs.failed[k.mapping] = errors.Join(rs.failed[k.mapping], err)
			rs.c.log.Error("a PROXY protocol relay cannot listen; trying again", "mapping", k.mapping, "port", k.port.Port,
				"protocol", k.port.Protocol, "in", relayRetryDelay, "err", err)
			continue
		}
		rs.c.log.Info("relaying with PROXY protocol headers", "mapping", k.mapping, "port", k.port.Port,
			"protocol", k.port.Protocol, "address", k.addr, "version", target.version, "backend", target.hosts)
	}
	var next time.Time
	if len(rs.failed) > 0 {
		next = time.Now().Add(relayRetryDelay)
	}
	rs.retry.at(ctx, rs.c, next)
}

func compareRelayKeys(a, b relayKey) int {
	return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
}

// dial opens a backend connection in the data path's network namespace (a test's; in a Pod,
// the process's own).
func (rs *relays) dial(ctx context.Context, network, address string) (c net.Conn, err error) {
	var d net.Dialer
	err = netnamespace.Run(rs.c.opts.NetNS, func() (err error) {
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	return c, err
}

func (rs *relays) start(ctx context.Context, k relayKey, target relayTarget) error {
	r := relay.New(target.version, target.hosts, rs.dial,
		rs.c.log.With("mapping", k.mapping, "port", k.port.Port, "protocol", k.port.Protocol))
	ctx, cancel := context.WithCancel(ctx)
	run := &runningRelay{relay: r, target: target, cancel: cancel, done: make(chan struct{})}
	var serve func() error
	switch k.port.Protocol {
	case "UDP":
		local := netip.AddrPortFrom(k.addr, k.port.Port)
		pc, err := rs.c.node.ListenPacket("udp", local.String())
		if err != nil {
			cancel()
			return fmt.Errorf("listening on %v/udp: %w", local, err)
		}
		run.ln = pc
		serve = func() error { return r.ServeUDP(ctx, pc, local) }
	default:
		var ln net.Listener
		if rs.conns != nil {
			ln = rs.conns().Listen(k.mapping, k.port.Port)
		} else {
			var err error
			if ln, err = rs.c.node.Listen("tcp", fmt.Sprintf(":%d", k.port.Port)); err != nil {
				cancel()
				return fmt.Errorf("listening on port %d/tcp: %w", k.port.Port, err)
			}
		}
		run.ln = ln
		serve = func() error { return r.ServeTCP(ctx, ln) }
	}
	go func() {
		defer close(run.done)
		if err := serve(); err != nil {
			rs.c.log.Error("a PROXY protocol relay stopped", "mapping", k.mapping, "port", k.port.Port, "err", err)
		}
	}()
	rs.running[k] = run
	return nil
}

func (rs *relays) stop(k relayKey, run *runningRelay) {
	run.cancel()
	_ = run.ln.Close()
	<-run.done
	delete(rs.running, k)
	rs.c.log.Info("stopped a PROXY protocol relay", "mapping", k.mapping, "port", k.port.Port, "protocol", k.port.Protocol, "address", k.addr)
}

// ready says why the relays of mapping m are not all listening; "" when they are (or it has
// none). A replica's TCP relays also need their ports named in the Serve config.
func (rs *relays) ready(m l3.Mapping) string {
	if err := rs.failed[m.Name]; err != nil {
		return "the PROXY protocol relays cannot listen: " + err.Error()
	}
	for k := range wantedRelays([]l3.Mapping{m}) {
		if rs.running[k] == nil {
			return "starting the PROXY protocol relays"
		}
		if k.port.Protocol == "TCP" && rs.conns != nil && !rs.conns().Named(m.Name) {
			return "naming the relayed ports in the Serve config"
		}
	}
	return ""
}

// close stops every relay.
func (rs *relays) close() {
	rs.retry.stop()
	for k, run := range rs.running {
		rs.stop(k, run)
	}
}
