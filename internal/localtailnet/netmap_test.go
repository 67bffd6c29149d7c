package localtailnet

import (
	"context"
	"net/netip"
	"testing"

	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
)

// A new node is shown to its peers only once it has had its netmap and said where it can be
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
	// The new node itself sees the client at once.
	res, _ := s.mapResponseLocked(proxy, nil)
	if len(res.Peers) != 1 || res.Peers[0].ID != client.id {
		t.Errorf("the new node's peers: %v", res.Peers)
	}
}

// A node that comes back online (a proxy's new Pod, with its old keys) is hidden from its peers
// again until it has had its netmap: the new process knows no peer before.
func TestReturningNodeShownWhenMapped(t *testing.T) {
	lt, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer lt.Close()
	s := lt.srv
	k := &authKey{tags: []string{"tag:k8s"}}
	s.mu.Lock()
	defer s.mu.Unlock()
	client := s.addNodeLocked(key.NewMachine().Public(), &tailcfg.RegisterRequest{NodeKey: key.NewNode().Public(),
		Hostinfo: &tailcfg.Hostinfo{Hostname: "laptop"}}, k)
	proxy := s.addNodeLocked(key.NewMachine().Public(), &tailcfg.RegisterRequest{NodeKey: key.NewNode().Public(),
		Hostinfo: &tailcfg.Hostinfo{Hostname: "proxy"}}, k)
	client.mapped, client.homeDERP = true, 1
	proxy.mapped, proxy.endpoints = true, []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:41641")}
	shown := func() bool {
		res, _ := s.mapResponseLocked(client, nil)
		for _, p := range res.Peers {
			if p.ID == proxy.id {
				return true
			}
		}
		return false
	}
	s.startStreamLocked(proxy)
	proxy.mapped = true // as the poll does once it has sent the netmap
	if !shown() {
		t.Fatal("a reachable node is not shown")
	}
	// A second poll of the same process replaces the first: still known, still shown.
	s.startStreamLocked(proxy)
	if !shown() {
		t.Error("a node whose poll was replaced is hidden")
	}
	proxy.stream = nil // the Pod is gone
	s.startStreamLocked(proxy)
	if shown() {
		t.Error("a node back online is shown before it has had its netmap")
	}
	proxy.mapped = true
	if !shown() {
		t.Error("a node back online is not shown once it has had its netmap")
	}
}
