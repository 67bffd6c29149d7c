package proxytest

import (
	"net"
	"net/netip"
	"testing"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/proxyprotoecho"
)

// AddProxyProtocolBackend answers on the topology backend's ClusterIP a, which AddBackend gave
// it, at port for TCP and UDP, what the PROXY protocol header of each connection or datagram
// says (package proxyprotoecho).
func AddProxyProtocolBackend(t testing.TB, top netnstest.Topology, a netip.Addr, port uint16) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	err := netnamespace.Run(top.Backend.Path, func() (err error) {
		if ln, err = net.Listen("tcp", netip.AddrPortFrom(a, port).String()); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, port).String())
		return err
	})
	if err != nil {
		t.Fatalf("PROXY protocol backend listening on %s: %v", a, err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go proxyprotoecho.ServeTCP(ln)
	go proxyprotoecho.ServeUDP(pc)
}
