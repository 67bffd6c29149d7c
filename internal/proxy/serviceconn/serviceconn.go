// Package serviceconn hands a ProxyGroup replica's L7 services the connections made to their
// Tailscale Services' VIPs, straight from tsnet's network stack.
package serviceconn

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/tailcfg"
	"tailscale.com/tsnet"
)

// Conns hands a node's services the connections made to their VIPs, straight from tsnet's
// network stack. The node's Serve config names each service port with no handler:
// tailscaled then takes the port's connections into its network stack but serves none of them,
// and tsnet passes them to a fallback handler, which gives each to the listener of its service
// (found by the VIP it was made to) and port. The connection's remote address is the client's
// tailnet address, which the identity headers need.
//
// tsnet's ListenService instead forwards every connection through a loopback socket with a
// PROXY header: a second TCP connection and two more copies of every byte, which cost a
// client's keep-alive requests some 10% of their rate (docs/performance.md).
//
// Its methods are safe for concurrent use but Sync and Named: the caller makes every change to
// the node's Serve config from one goroutine, and calls them from it.
type Conns struct {
	node *tsnet.Server
	lc   *local.Client
	log  *slog.Logger

	readMu   sync.Mutex // one read of the VIPs at a time
	vipsRead time.Time  // when the last read started; guarded by readMu

	mu      sync.Mutex
	queues  map[servicePort]*Queue
	ports   map[uint16]int                     // how many services listen on each port
	vips    map[netip.Addr]tailcfg.ServiceName // from the node's service-host capability
	written map[tailcfg.ServiceName][]uint16   // the ports last written to the Serve config; Sync's and Named's
}

type servicePort struct {
	name tailcfg.ServiceName
	port uint16
}

// New takes the fallback TCP flows of node, whose local client lc is.
func New(node *tsnet.Server, lc *local.Client, log *slog.Logger) *Conns {
	s := &Conns{node: node, lc: lc, log: log, queues: map[servicePort]*Queue{}, ports: map[uint16]int{}}
	// For the node's life.
	node.RegisterFallbackTCPHandler(s.flow)
	return s
}

// Listen returns the listener of a service's port. The Serve config names the port from the
// next Sync on.
func (s *Conns) Listen(name string, port uint16) net.Listener {
	key := servicePort{tailcfg.ServiceName(name), port}
	q := NewQueue(&net.TCPAddr{Port: int(port)})
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.queues[key]; old != nil {
		_ = old.Close()
	} else {
		s.ports[port]++
	}
	s.queues[key] = q
	return &serviceListener{Queue: q, conns: s, key: key}
}

// serviceListener leaves its service's port when closed.
type serviceListener struct {
	*Queue
	conns *Conns
	key   servicePort
}

func (l *serviceListener) Close() error {
	l.conns.mu.Lock()
	if l.conns.queues[l.key] == l.Queue {
		delete(l.conns.queues, l.key)
		if l.conns.ports[l.key.port]--; l.conns.ports[l.key.port] == 0 {
			delete(l.conns.ports, l.key.port)
		}
	}
	l.conns.mu.Unlock()
	return l.Queue.Close()
}

// flow is tsnet's fallback TCP handler: it takes the flows to the ports services listen on.
func (s *Conns) flow(_, dst netip.AddrPort) (func(net.Conn), bool) {
	s.mu.Lock()
	listened := s.ports[dst.Port()] > 0
	s.mu.Unlock()
	if !listened {
		return nil, false
	}
	return func(c net.Conn) {
		if q := s.queueFor(dst); q == nil || !q.Push(c) {
			c.Close()
		}
	}, true
}

// queueFor returns the listener of the service whose VIP and port dst is. An address not among
// the VIPs read so far is either the node's own, which no service has, or a service's the node
// was given since (tailscaled takes no other address's flows into its network stack): the VIPs
// are then read again, once for all the connections that missed meanwhile.
func (s *Conns) queueFor(dst netip.AddrPort) *Queue {
	missed := time.Now()
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		name, ok := s.vips[dst.Addr()]
		q := s.queues[servicePort{name, dst.Port()}]
		s.mu.Unlock()
		if ok || attempt > 0 {
			return q
		}
		if ip4, ip6 := s.node.TailscaleIPs(); dst.Addr() == ip4 || dst.Addr() == ip6 {
			return nil
		}
		s.readMu.Lock()
		if s.vipsRead.Before(missed) {
			s.readVIPs()
		}
		s.readMu.Unlock()
	}
}

// readVIPs reads the addresses of the services the node may host from its capabilities; the
// caller holds readMu.
func (s *Conns) readVIPs() {
	s.vipsRead = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.lc.StatusWithoutPeers(ctx)
	if err != nil || st.Self == nil {
		s.log.Warn("reading the services' addresses failed", "err", err)
		return
	}
	mappings, err := tailcfg.UnmarshalNodeCapJSON[tailcfg.ServiceIPMappings](st.Self.CapMap, tailcfg.NodeAttrServiceHost)
	if err != nil {
		s.log.Warn("reading the services' addresses failed", "err", err)
		return
	}
	vips := map[netip.Addr]tailcfg.ServiceName{}
	for _, m := range mappings {
		for name, addrs := range m {
			for _, a := range addrs {
				vips[a] = name
			}
		}
	}
	s.mu.Lock()
	s.vips = vips
	s.mu.Unlock()
}

// Sync makes the node's Serve config name exactly the listened service ports, each with no
// handler, and keeps the rest of it.
func (s *Conns) Sync(ctx context.Context) error {
	s.mu.Lock()
	want := map[tailcfg.ServiceName][]uint16{}
	for k := range s.queues {
		want[k.name] = append(want[k.name], k.port)
	}
	s.mu.Unlock()
	for _, ports := range want {
		slices.Sort(ports)
	}
	if s.written != nil && maps.EqualFunc(want, s.written, slices.Equal) {
		return nil
	}
	sc, err := s.lc.GetServeConfig(ctx)
	if err != nil {
		return err
	}
	if sc == nil {
		sc = &ipn.ServeConfig{}
	}
	sc.Services = nil
	for name, ports := range want {
		svc := &ipn.ServiceConfig{TCP: map[uint16]*ipn.TCPPortHandler{}}
		for _, p := range ports {
			svc.TCP[p] = &ipn.TCPPortHandler{}
		}
		if sc.Services == nil {
			sc.Services = map[tailcfg.ServiceName]*ipn.ServiceConfig{}
		}
		sc.Services[name] = svc
	}
	if err := s.lc.SetServeConfig(ctx, sc); err != nil {
		return err
	}
	s.written = want
	// A new service's VIP is read before its first connection needs it, where the node has it.
	s.readMu.Lock()
	s.readVIPs()
	s.readMu.Unlock()
	return nil
}

// Named reports whether the Serve config as last written names a port of the service.
func (s *Conns) Named(name string) bool {
	return s != nil && len(s.written[tailcfg.ServiceName(name)]) > 0
}

// Queue is a listener fed with connections from elsewhere.
type Queue struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

// NewQueue returns an open Queue whose Addr is addr.
func NewQueue(addr net.Addr) *Queue {
	return &Queue{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

// Push hands c to Accept; false if the listener is closed.
func (q *Queue) Push(c net.Conn) bool {
	select {
	case q.conns <- c:
		return true
	case <-q.closed:
		return false
	}
}

func (q *Queue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.closed:
		return nil, net.ErrClosed
	}
}

func (q *Queue) Close() error {
	q.once.Do(func() { close(q.closed) })
	return nil
}

func (q *Queue) Addr() net.Addr { return q.addr }
