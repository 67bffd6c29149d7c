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
	const svc = tailcfg.ServiceName("svc:web")
	s, register := lockedServer(t)
	replicas := hostsOf(s, register, svc, "pg-0", "pg-1")
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

// A client moved off a host that went away stays on its new host when the old one comes back
// (moving it would reset its connections in flight); a client with no route yet is spread.
func TestRoutesStickToTheirHost(t *testing.T) {
	const svc = tailcfg.ServiceName("svc:web")
	s, register := lockedServer(t)
	replicas := hostsOf(s, register, svc, "pg-0", "pg-1")
	clients := []*node{register("client-a"), register("client-b")}
	route := func(c *node) *node { return routeLocked(s.serviceHostsLocked()[svc], c, svc) }
	first := map[*node]*node{}
	for _, c := range clients {
		first[c] = route(c)
	}
	if first[clients[0]] == first[clients[1]] {
		t.Fatalf("both clients sent to %s: not spread", first[clients[0]].label)
	}
	moved := clients[0]
	gone := first[moved]
	gone.services = nil // the host withdraws
	if got := route(moved); got == gone || got == nil {
		t.Fatalf("with %s withdrawn the client is sent to %v", gone.label, got)
	}
	gone.services = []tailcfg.ServiceName{svc} // it comes back
	for _, c := range clients {
		if got := route(c); got == gone && c == moved {
			t.Errorf("%s was moved back to %s when it returned", c.label, gone.label)
		} else if c != moved && got != first[c] {
			t.Errorf("%s moved from %s to %s", c.label, first[c].label, got.label)
		}
	}
	if got := route(register("client-c")); got == nil {
		t.Error("a new client gets no host")
	}
	if got := route(replicas[0]); got != nil {
		t.Errorf("a host is routed to %s for its own service", got.label)
	}
}

// hostsOf makes Tailscale Service svc and registers connected, reachable nodes named names
// that advertise it.
func hostsOf(s *server, register func(string) *node, svc tailcfg.ServiceName, names ...string) []*node {
	s.services[svc] = &service{name: svc, addrs: []netip.Addr{netip.MustParseAddr("100.100.0.1")}}
	var hosts []*node
	for _, name := range names {
		n := register(name)
		n.stream, n.mapped, n.homeDERP, n.services = make(chan struct{}, 1), true, 1, []tailcfg.ServiceName{svc}
		hosts = append(hosts, n)
	}
	return hosts
}
