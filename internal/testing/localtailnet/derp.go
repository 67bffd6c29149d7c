package localtailnet

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"tailscale.com/derp/derpserver"
	"tailscale.com/net/stunserver"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"
)

// relay is a DERP server and a STUN server on one IP, the same pair
// tstest/integration.RunDERPAndSTUN builds, but usable outside tests.
type relay struct {
	derp   *derpserver.Server
	https  *httptest.Server
	cancel context.CancelFunc
	done   chan struct{}
}

func startRelay(ip string, logf logger.Logf) (*relay, *tailcfg.DERPMap, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, nil, err
	}
	d := derpserver.New(key.NewNode(), logf)
	// httptest's self-signed certificate is enough: the DERP map marks the node
	// InsecureForTests, so clients skip verification.
	srv := httptest.NewUnstartedServer(derpserver.Handler(d))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Config.ErrorLog = logger.StdLogger(logf)
	srv.Config.TLSNextProto = make(map[string]func(*http.Server, *tls.Conn, http.Handler)) // DERP needs HTTP/1.1 upgrades
	srv.StartTLS()

	ctx, cancel := context.WithCancel(context.Background())
	stun := stunserver.New(ctx)
	if err := stun.Listen(net.JoinHostPort(ip, "0")); err != nil {
		cancel()
		srv.Close()
		_ = d.Close()
		return nil, nil, err
	}
	r := &relay{derp: d, https: srv, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		if err := stun.Serve(); err != nil {
			logf("localtailnet: STUN server: %v", err)
		}
	}()

	// The node's address in the family it has: a relay on an IPv6-only network (a kind cluster
	// of family ipv6) has no IPv4 address to give.
	ipv4, ipv6 := ip, "none"
	if a, err := netip.ParseAddr(ip); err == nil && a.Is6() {
		ipv4, ipv6 = "none", ip
	}
	dm := &tailcfg.DERPMap{
		Regions: map[int]*tailcfg.DERPRegion{
			1: {
				RegionID:   1,
				RegionCode: "local",
				RegionName: "Local",
				Nodes: []*tailcfg.DERPNode{{
					Name:             "1a",
					RegionID:         1,
					HostName:         ip,
					IPv4:             ipv4,
					IPv6:             ipv6,
					DERPPort:         ln.Addr().(*net.TCPAddr).Port,
					STUNPort:         stun.LocalAddr().(*net.UDPAddr).Port,
					STUNTestIP:       ip,
					InsecureForTests: true,
				}},
			},
		},
	}
	return r, dm, nil
}

func (r *relay) close() error {
	r.https.CloseClientConnections()
	r.https.Close()
	r.cancel()
	<-r.done
	return r.derp.Close()
}
