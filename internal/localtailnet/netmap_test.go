package localtailnet

import (
	"context"
	"net/netip"
	"testing"

	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
)

// A new node, or a restarted one, is shown to its peers only once it has had its netmap and said where it can be
// reached: shown earlier, a peer's WireGuard handshake to it is lost and retried after 5 s.
func TestNewNodeShownWhenReachable(t *testing.T) {
	s, register := lockedServer(t)
	client, proxy := register("laptop"), register("proxy")
	client.mapped, client.homeDERP = true, 1
	shown := func() bool {
		res, _ := s.mapResponseLocked(client, nil)
		for _, p := range res.Peers {
			if p.ID == proxy.id {
				return true
			}
		}
		return false
	}
	if shown() {
		t.Error("a node that has not had its netmap is shown to its peers")
	}
	proxy.mapped = true
	if shown() {
		t.Error("a node that has not said where it can be reached is shown to its peers")
	}
	proxy.endpoints = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:41641")}
	if !shown() {
		t.Error("a reachable node is not shown to its peers")
	}
	// Restarted (a new disco key): hidden again until it has had its netmap.
	s.noteDiscoKeyLocked(proxy, key.NewDisco().Public())
	first := proxy.disco
	if shown() {
		t.Error("a restarted node is shown to its peers before it has had its netmap")
	}
	proxy.mapped = true
	s.noteDiscoKeyLocked(proxy, first)
	if !shown() {
		t.Error("a request with the same disco key hid the node")
	}
	// The new node itself sees the client at once.
	res, _ := s.mapResponseLocked(proxy, nil)
	if len(res.Peers) != 1 || res.Peers[0].ID != client.id {
		t.Errorf("the new node's peers: %v", res.Peers)
	}
}

// A restarted host of a Tailscale Service, hidden from its peers until it has had its netmap,
// hosts nothing meanwhile: the clients that pick it go to another host instead of nowhere.
func TestHiddenNodeHostsNothing(t *testing.T) {
	s, register := lockedServer(t)
	const svc = tailcfg.ServiceName("svc:web")
	s.services[svc] = &service{name: svc, addrs: []netip.Addr{netip.MustParseAddr("100.100.0.1")}}
	var replicas []*node
	for _, name := range []string{"pg-0", "pg-1"} {
		n := register(name)
		n.stream, n.mapped, n.homeDERP, n.services = make(chan struct{}, 1), true, 1, []tailcfg.ServiceName{svc}
		replicas = append(replicas, n)
	}
	if hosts := s.serviceHostsLocked()[svc]; len(hosts) != 2 {
		t.Fatalf("hosts of %s: %d, want both replicas", svc, len(hosts))
	}
	s.noteDiscoKeyLocked(replicas[1], key.NewDisco().Public())
	if hosts := s.serviceHostsLocked()[svc]; len(hosts) != 1 || hosts[0] != replicas[0] {
		t.Errorf("hosts of %s while pg-1 is hidden: %v, want pg-0 only", svc, hosts)
	}
}

// lockedServer starts a local tailnet whose server stays locked until the test ends, and a
// registrar of tagged nodes on it.
func lockedServer(t *testing.T) (*server, func(name string) *node) {
	t.Helper()
	lt, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lt.Close() })
	s := lt.srv
	s.mu.Lock()
	t.Cleanup(s.mu.Unlock) // runs before Close: cleanups run last-in first-out
	k := &authKey{tags: []string{"tag:k8s"}}
	return s, func(name string) *node {
		return s.addNodeLocked(key.NewMachine().Public(), &tailcfg.RegisterRequest{NodeKey: key.NewNode().Public(),
			Hostinfo: &tailcfg.Hostinfo{Hostname: name}}, k)
	}
}
