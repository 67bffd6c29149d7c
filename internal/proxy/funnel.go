package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pires/go-proxyproto"
	"tailscale.com/client/local"
	"tailscale.com/ipn"
	"tailscale.com/ipn/ipnstate"
	"tailscale.com/tsnet"
	"tailscale.com/util/mak"

	"github.com/tsingress/tsingress/internal/clienthello"
	"github.com/tsingress/tsingress/internal/proxy/serviceconn"
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
// for. They come from Tailscale's relays through tailscaled, once the Serve config allows
// Funnel for <name>:443 (AllowFunnel, which funnel keeps to the names it has listeners for),
// by one of two paths:
//   - tsnet's ListenFunnel (Funnel only), for a node without a TUN device (standalone proxies);
//   - with a TUN, tsnet's listeners take connections from its own network stack and never
//     those tsnet is handed for Funnel, so the node's Serve config forwards port 443 to a
//     loopback listener instead, with a PROXY header naming the client, as `tailscale funnel
//     --tcp` does; the name comes from the TLS ClientHello (ProxyGroup replicas, which serve
//     nothing else on the node's own address).
//
// Its methods are called from one goroutine.
type funnel struct {
	lc      *local.Client
	ln      net.Listener
	forward string // the loopback address port 443 is forwarded to; "" with ListenFunnel
	log     *slog.Logger

	mu      sync.Mutex
	names   map[string]*serviceconn.Queue // by lowercase name
	allowed []string                      // the AllowFunnel host:ports last set, sorted; nil before
}

// openFunnel starts taking the node's Funnel connections through tsnet's ListenFunnel. It
// fails when the tailnet does not let the node use Funnel.
func openFunnel(node *tsnet.Server, lc *local.Client, log *slog.Logger) (*funnel, error) {
	ln, err := node.ListenFunnel("tcp", fmt.Sprintf(":%d", funnelPort), tsnet.FunnelOnly())
	if err != nil {
		return nil, err
	}
	f := &funnel{lc: lc, ln: ln, log: log, names: map[string]*serviceconn.Queue{}}
	go f.accept(f.fromTSNet)
	return f, nil
}

// openFunnelForward starts taking the node's Funnel connections through a loopback listener
// its Serve config forwards port 443 to (see allow).
func openFunnelForward(lc *local.Client, log *slog.Logger) (*funnel, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &funnel{lc: lc, ln: &proxyproto.Listener{Listener: ln, ConnPolicy: requireHeader}, forward: ln.Addr().String(),
		log: log, names: map[string]*serviceconn.Queue{}}
	go f.accept(f.fromForward)
	return f, nil
}

// accept hands each connection to the listener of its name, as route finds it.
func (f *funnel) accept(route func(net.Conn) (string, net.Conn, error)) {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			name, pc, err := route(c)
			if err != nil {
				f.log.Debug("a Funnel connection without a name", "err", err)
				c.Close()
				return
			}
			f.mu.Lock()
			q := f.names[name]
			f.mu.Unlock()
			if q == nil || !q.Push(pc) {
				f.log.Debug("a Funnel connection for a name not served over Funnel", "name", name)
				c.Close()
			}
		}()
	}
}

// fromTSNet unwraps a connection from ListenFunnel: it wraps it in TLS of its own, not started
// yet; the name's web server does TLS with its certificates instead.
func (f *funnel) fromTSNet(c net.Conn) (string, net.Conn, error) {
	fc, ok := c.(*tls.Conn).NetConn().(*ipn.FunnelConn)
	if !ok {
		return "", nil, fmt.Errorf("a %T from ListenFunnel", c.(*tls.Conn).NetConn())
	}
	host, _, _ := net.SplitHostPort(string(fc.Target))
	return strings.ToLower(host), &publicConn{FunnelConn: fc}, nil
}

// fromForward reads the name from the ClientHello of a forwarded connection; its remote
// address is the client's, from the PROXY header.
func (f *funnel) fromForward(c net.Conn) (string, net.Conn, error) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // fails only on a closed conn: the read fails then
	name, hello, err := clienthello.ServerName(c)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return "", nil, err
	}
	return name, clienthello.Replay(c, hello), nil
}

// listen returns the listener of name's Funnel connections, replacing any earlier one.
func (f *funnel) listen(name string) net.Listener {
	q := serviceconn.NewQueue(f.ln.Addr())
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.names[name]; old != nil {
		_ = old.Close()
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
			_ = q.Close()
			delete(f.names, name)
		}
	}
}

// allow makes the Serve config allow Funnel for exactly the names with listeners, and forward
// port 443 to the loopback listener while there are any, in that mode.
func (f *funnel) allow(ctx context.Context) error {
	f.mu.Lock()
	want := make([]string, 0, len(f.names))
	for name := range f.names {
		want = append(want, fmt.Sprintf("%s:%d", name, funnelPort))
	}
	f.mu.Unlock()
	slices.Sort(want)
	if f.allowed != nil && slices.Equal(want, f.allowed) {
		return nil
	}
	sc, err := f.lc.GetServeConfig(ctx)
	if err != nil {
		return err
	}
	if sc == nil {
		sc = &ipn.ServeConfig{}
	}
	before := sc.Clone()
	sc.AllowFunnel = nil
	for _, hp := range want {
		mak.Set(&sc.AllowFunnel, ipn.HostPort(hp), true)
	}
	if f.forward != "" {
		delete(sc.TCP, funnelPort)
		if len(want) > 0 {
			sc.SetTCPForwarding(funnelPort, f.forward, false, 2, "")
		}
		if len(sc.TCP) == 0 {
			sc.TCP = nil
		}
	}
	if !reflect.DeepEqual(before, sc) {
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
