package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"

	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/ipn/ipnstate"
	"tailscale.com/tsnet"
)

// funnelPort is the port Funnel serves the tailnet names on: HTTPS's.
const funnelPort = 443

// funnelAccess says why the tailnet does not let the node use Funnel on port 443 ("" when it
// does): the policy's "funnel" node attribute, its ports and HTTPS, as tailscaled checks them.
func funnelAccess(self *ipnstate.PeerStatus) string {
	if self == nil {
		return "not logged in"
	}
	if err := ipn.CheckFunnelAccess(funnelPort, self); err != nil {
		return err.Error()
	}
	return ""
}

// funnel takes the node's Funnel connections and hands each to the listener of the name it is
// for. tsnet's ListenFunnel (Funnel only) gets them from tailscaled, which takes them from
// Tailscale's relays once the Serve config allows Funnel for <name>:443; funnel keeps that
// list (AllowFunnel) to the names it has listeners for. Its methods are called from one
// goroutine.
type funnel struct {
	lc  *local.Client
	ln  net.Listener
	log *slog.Logger

	mu      sync.Mutex
	names   map[string]*connQueue // by lowercase name
	allowed []string              // the AllowFunnel host:ports last set, sorted
}

// openFunnel starts taking the node's Funnel connections. It fails when the tailnet does not
// let the node use Funnel.
func openFunnel(node *tsnet.Server, lc *local.Client, log *slog.Logger) (*funnel, error) {
	ln, err := node.ListenFunnel("tcp", fmt.Sprintf(":%d", funnelPort), tsnet.FunnelOnly())
	if err != nil {
		return nil, err
	}
	f := &funnel{lc: lc, ln: ln, log: log, names: map[string]*connQueue{}}
	go f.accept()
	return f, nil
}

func (f *funnel) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		// ListenFunnel wraps the connection in TLS of its own, not started yet; the name's web
		// server does TLS with its certificates instead.
		fc, ok := c.(*tls.Conn).NetConn().(*ipn.FunnelConn)
		if !ok {
			c.Close()
			continue
		}
		host, _, _ := net.SplitHostPort(string(fc.Target))
		f.mu.Lock()
		q := f.names[strings.ToLower(host)]
		f.mu.Unlock()
		go func() {
			if q == nil || !q.push(&publicConn{FunnelConn: fc}) {
				f.log.Debug("a Funnel connection for a name not served over Funnel", "target", fc.Target)
				fc.Close()
			}
		}()
	}
}

// listen returns the listener of name's Funnel connections, replacing any earlier one.
func (f *funnel) listen(name string) net.Listener {
	q := newConnQueue(f.ln.Addr())
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.names[name]; old != nil {
		old.Close()
	}
	f.names[name] = q
	return q
}

// only closes the listeners of the names keep does not list.
func (f *funnel) only(keep []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, q := range f.names {
		if !slices.Contains(keep, name) {
			q.Close()
			delete(f.names, name)
		}
	}
}

// allow makes the Serve config allow Funnel for exactly the names with listeners.
func (f *funnel) allow(ctx context.Context) error {
	f.mu.Lock()
	want := make([]string, 0, len(f.names))
	for name := range f.names {
		want = append(want, fmt.Sprintf("%s:%d", name, funnelPort))
	}
	f.mu.Unlock()
	slices.Sort(want)
	if slices.Equal(want, f.allowed) && f.allowed != nil {
		return nil
	}
	sc, err := f.lc.GetServeConfig(ctx)
	if err != nil {
		return err
	}
	if sc == nil {
		sc = &ipn.ServeConfig{}
	}
	allow := map[ipn.HostPort]bool{}
	for _, hp := range want {
		allow[ipn.HostPort(hp)] = true
	}
	if !maps.Equal(sc.AllowFunnel, allow) {
		sc.AllowFunnel = allow
		if len(allow) == 0 {
			sc.AllowFunnel = nil
		}
		if err := f.lc.SetServeConfig(ctx, sc); err != nil {
			return err
		}
		f.log.Info("Funnel allowed", "names", want)
	}
	f.allowed = want
	return nil
}

// close stops taking Funnel connections: no name is allowed any more, every listener closes.
func (f *funnel) close(ctx context.Context) {
	f.only(nil)
	if err := f.allow(ctx); err != nil {
		f.log.Warn("removing the names allowed over Funnel from the Serve config", "err", err)
	}
	f.ln.Close()
}

// publicConn is a Funnel connection that names the client on the internet as its remote
// address, not the relay that carried it.
type publicConn struct{ *ipn.FunnelConn }

func (c *publicConn) RemoteAddr() net.Addr { return net.TCPAddrFromAddrPort(c.Src) }

// connQueue is a listener fed with connections from elsewhere.
type connQueue struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

// push hands c to Accept; false if the listener is closed.
func (q *connQueue) push(c net.Conn) bool {
	select {
	case q.conns <- c:
		return true
	case <-q.closed:
		return false
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.closed:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.closed) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }
