// Package relay forwards an L3 proxy's connections in userspace, each opened to the backend
// with a PROXY protocol header (v1 or v2) that names the client's tailnet address and the
// address it connected to, so that a backend behind the proxy (a database, a mail server) sees
// who connected. DNAT cannot add the header: the proxy relays the ports a Service asks it for,
// and DNATs the rest.
//
// TCP: one backend connection per client connection, the header first, then both directions
// copied until each side has closed its half. UDP (v2 only: v1 has no UDP form): one backend
// socket per client address, each datagram to the backend prefixed with the header, the
// backend's datagrams sent back to the client as they are; a flow idle for UDPIdleTimeout ends.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pires/go-proxyproto"
)

const (
	// UDPIdleTimeout ends a UDP flow that carried nothing either way for this long, as
	// conntrack's default for an unreplied UDP flow's successor does.
	UDPIdleTimeout = 2 * time.Minute
	dialTimeout    = 10 * time.Second
	maxDatagram    = 64 << 10
)

// Relay relays the connections of listeners to one backend host (an IP of each family, or a
// DNS name) on the port each listener listens on.
type Relay struct {
	// Dial opens backend connections; nil means a net.Dialer's.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	Log  *slog.Logger

	mu      sync.Mutex
	version int      // of the PROXY protocol: 1 or 2
	hosts   []string // the backend's addresses; host picks the one of the client's family
}

// New returns a relay of PROXY protocol version (1 or 2) to hosts.
func New(version int, hosts []string, dial func(ctx context.Context, network, address string) (net.Conn, error), log *slog.Logger) *Relay {
	return &Relay{Dial: dial, Log: log, version: version, hosts: hosts}
}

// Set changes the version and the hosts for the connections and flows that start from now on,
// so that a change needs no new listener (a closed listener's port stays taken while its
// connections linger in TIME_WAIT).
func (r *Relay) Set(version int, hosts []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.version, r.hosts = version, hosts
}

// target returns the version and the backend host:port for a flow to dst.
func (r *Relay) target(dst netip.AddrPort) (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version, net.JoinHostPort(host(r.hosts, dst.Addr()), fmt.Sprint(dst.Port()))
}

// Header returns the PROXY protocol header of a flow from src to dst of network ("tcp" or
// "udp") in version v.
func Header(v int, network string, src, dst netip.AddrPort) ([]byte, error) {
	if v != 1 && v != 2 {
		return nil, fmt.Errorf("PROXY protocol version %d", v)
	}
	src, dst = unmap(src), unmap(dst)
	var s, d net.Addr
	switch network {
	case "tcp":
		s, d = net.TCPAddrFromAddrPort(src), net.TCPAddrFromAddrPort(dst)
	case "udp":
		if v == 1 {
			return nil, errors.New("PROXY protocol v1 has no UDP form")
		}
		s, d = net.UDPAddrFromAddrPort(src), net.UDPAddrFromAddrPort(dst)
	default:
		return nil, fmt.Errorf("network %q", network)
	}
	if src.Addr().Is4() != dst.Addr().Is4() {
		return nil, fmt.Errorf("%v and %v are of different families", src, dst)
	}
	return proxyproto.HeaderProxyFromAddrs(byte(v), s, d).Format()
}

func unmap(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

// host returns the backend host for a client that connected to an address of dst's family: a
// backend address of that family, else the first one (a DNS name, or a Service of one family).
func host(hosts []string, dst netip.Addr) string {
	for _, h := range hosts {
		if a, err := netip.ParseAddr(h); err == nil && a.Unmap().Is4() == dst.Unmap().Is4() {
			return h
		}
	}
	if len(hosts) == 0 {
		return ""
	}
	return hosts[0]
}

func (r *Relay) dial(ctx context.Context, network, address string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if r.Dial != nil {
		return r.Dial(ctx, network, address)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, address)
}

// ServeTCP relays each connection ln accepts until ln is closed or ctx is done.
func (r *Relay) ServeTCP(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("relay: accept on %v: %w", ln.Addr(), err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.relayTCP(ctx, c)
		}()
	}
}

func (r *Relay) relayTCP(ctx context.Context, c net.Conn) {
	defer c.Close()
	src, dst, err := addrPorts(c.RemoteAddr(), c.LocalAddr())
	if err != nil {
		r.Log.Warn("relay: a connection without addresses", "err", err)
		return
	}
	version, backend := r.target(dst)
	hdr, err := Header(version, "tcp", src, dst)
	if err != nil {
		r.Log.Warn("relay: no PROXY header for a connection", "client", src, "to", dst, "err", err)
		return
	}
	b, err := r.dial(ctx, "tcp", backend)
	if err != nil {
		r.Log.Warn("relay: dialing the backend failed", "client", src, "backend", backend, "err", err)
		return
	}
	defer b.Close()
	if _, err := b.Write(hdr); err != nil {
		r.Log.Warn("relay: writing the PROXY header failed", "client", src, "backend", backend, "err", err)
		return
	}
	stop := context.AfterFunc(ctx, func() { c.Close(); b.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		copyHalf(b, c)
		close(done)
	}()
	copyHalf(c, b)
	<-done
}

// copyHalf copies from src to dst until src's end, then closes dst's writing half (or dst, if
// it has no halves), so that each direction ends on its own.
func copyHalf(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = dst.Close()
}

func addrPorts(remote, local net.Addr) (src, dst netip.AddrPort, err error) {
	if src, err = netip.ParseAddrPort(remote.String()); err != nil {
		return src, dst, err
	}
	dst, err = netip.ParseAddrPort(local.String())
	return src, dst, err
}

// ServeUDP relays the datagrams pc receives, addressed to local, until pc is closed or ctx is
// done.
func (r *Relay) ServeUDP(ctx context.Context, pc net.PacketConn, local netip.AddrPort) error {
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	var (
		mu    sync.Mutex
		flows = map[netip.AddrPort]*udpFlow{}
		wg    sync.WaitGroup
	)
	defer func() {
		mu.Lock()
		for _, f := range flows {
			f.backend.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("relay: read on %v: %w", local, err)
		}
		src, err := netip.ParseAddrPort(from.String())
		if err != nil {
			continue
		}
		src = unmap(src)
		mu.Lock()
		f := flows[src]
		mu.Unlock()
		if f == nil {
			if f, err = r.openUDP(ctx, src, local); err != nil {
				r.Log.Warn("relay: opening a UDP flow failed", "client", src, "to", local, "err", err)
				continue
			}
			mu.Lock()
			flows[src] = f
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.answer(pc, from)
				mu.Lock()
				delete(flows, src)
				mu.Unlock()
			}()
		}
		f.send(buf[:n])
	}
}

// udpFlow is one client's flow: a connected socket to the backend.
type udpFlow struct {
	hdr     []byte
	backend net.Conn
	out     []byte       // header and datagram, reused: send is called from the reading loop only
	active  atomic.Int64 // when a datagram last went either way, in Unix nanoseconds
}

func (r *Relay) openUDP(ctx context.Context, src, local netip.AddrPort) (*udpFlow, error) {
	version, backend := r.target(local)
	hdr, err := Header(version, "udp", src, local)
	if err != nil {
		return nil, err
	}
	b, err := r.dial(ctx, "udp", backend)
	if err != nil {
		return nil, err
	}
	f := &udpFlow{hdr: hdr, backend: b}
	f.active.Store(time.Now().UnixNano())
	return f, nil
}

func (f *udpFlow) send(datagram []byte) {
	f.active.Store(time.Now().UnixNano())
	f.out = append(append(f.out[:0], f.hdr...), datagram...)
	_, _ = f.backend.Write(f.out) // UDP: a lost datagram is the application's to retry
}

// answer sends the backend's datagrams back to the client until the flow has been idle both
// ways for UDPIdleTimeout or its socket is closed, then closes it.
func (f *udpFlow) answer(pc net.PacketConn, client net.Addr) {
	defer f.backend.Close()
	buf := make([]byte, maxDatagram)
	for {
		idleUntil := time.Unix(0, f.active.Load()).Add(UDPIdleTimeout)
		if !time.Now().Before(idleUntil) {
			return
		}
		_ = f.backend.SetReadDeadline(idleUntil)
		n, err := f.backend.Read(buf)
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			continue // idle unless the client sent meanwhile
		case errors.Is(err, net.ErrClosed):
			return
		case err != nil:
			continue // an ICMP error from the backend: the flow stays, as with DNAT
		}
		f.active.Store(time.Now().UnixNano())
		if _, err := pc.WriteTo(buf[:n], client); err != nil {
			return
		}
	}
}
