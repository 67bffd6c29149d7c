package proxytest

import (
	"net/netip"
	"testing"

	"github.com/tsingress/tsingress/internal/testing/netnstest"
	"github.com/tsingress/tsingress/internal/testing/proxyprotoecho"
)

// AddProxyProtocolBackend answers on the topology backend's ClusterIP a, which AddBackend gave
// it, at port for TCP and UDP, what the PROXY protocol header of each connection or datagram
// says (package proxyprotoecho).
func AddProxyProtocolBackend(t testing.TB, top netnstest.Topology, a netip.Addr, port uint16) {
	t.Helper()
	ln, pc := listenInBackend(t, top, netip.AddrPortFrom(a, port), netip.AddrPortFrom(a, port))
	go proxyprotoecho.ServeTCP(ln)
	go proxyprotoecho.ServeUDP(pc)
}
