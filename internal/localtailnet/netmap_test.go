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
	lt, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer lt.Close()
	s := lt.srv
	k := &authKey{tags: []string{"tag:k8s"}}
	register := func(name string) *node {
		return s.addNodeLocked(key.NewMachine().Public(), &tailcfg.RegisterRequest{NodeKey: key.NewNode().Public(),
			Hostinfo: &tailcfg.Hostinfo{Hostname: name}}, k)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
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
