package localtailnet

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"tailscale.com/net/tsaddr"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
	"tailscale.com/util/dnsname"
)

// node is a device of the tailnet.
type node struct {
	id        tailcfg.NodeID
	stableID  tailcfg.StableNodeID
	machine   key.MachinePublic
	nodeKey   key.NodePublic
	disco     key.DiscoPublic
	hostinfo  *tailcfg.Hostinfo // replaced, never mutated, so views of it stay valid
	label     string            // MagicDNS label, unique in the tailnet
	tags      []string
	owner     *tailcfg.UserProfile // nil: a tagged device
	ephemeral bool
	addrs     []netip.Prefix
	endpoints []netip.AddrPort
	homeDERP  int
	capVer    tailcfg.CapabilityVersion
	created   time.Time
	lastSeen  time.Time

	// stream wakes the node's streaming map poll; nil while the node is not connected.
	stream chan struct{}
	// mapped says the node has been sent its netmap at least once, so that it knows its peers.
	mapped bool
	// pings wait for the stream to carry them (c2n requests).
	pings []*tailcfg.PingRequest

	// services the node advertises, as last fetched over c2n, and the hash they had.
	services []tailcfg.ServiceName
	// approved are the services the node has advertised at least once: advertising is approval
	// here, and approval outlives advertising, as on Tailscale, where a host that stops
	// advertising (a replica draining) keeps the addresses of the services it is approved for
	// and answers the clients that still route to it until their netmaps move them.
	approved     map[tailcfg.ServiceName]bool
	servicesHash string
	// servicesAsked is the hash a c2n fetch is in flight for.
	servicesAsked string
	// routes are the hosts this node was last sent each Tailscale Service's traffic to.
	routes map[tailcfg.ServiceName]tailcfg.NodeID

	// funnelRelay marks the local tailnet's own Funnel relay node: no device of the tailnet, it
	// is a peer only of the devices that may take Funnel traffic, and reaches nothing but their
	// peer API.
	funnelRelay bool
}

// authKey is a minted auth key. Whether it is pre-authorized does not matter: the local
// tailnet has no device approval.
type authKey struct {
	id, secret  string
	tags        []string
	reusable    bool
	ephemeral   bool
	description string
	created     time.Time
	expires     time.Time
	used        bool
	revoked     time.Time // zero while it is not
	// owner is the person whose devices log in with the key; nil for tagged devices.
	owner *tailcfg.UserProfile
	// funnelRelay is set on the key of the Funnel relay node.
	funnelRelay bool
}

// service is a Tailscale Service (VIP service).
type service struct {
	name        tailcfg.ServiceName
	addrs       []netip.Addr
	ports       []string
	tags        []string
	comment     string
	annotations map[string]string
}

// The single user that owns tagged devices, as on Tailscale; every device here is tagged
// because OAuth clients can only mint tagged keys.
const taggedUserID tailcfg.UserID = 1

var (
	taggedUser    = tailcfg.User{ID: taggedUserID, DisplayName: "tagged-devices"}
	taggedLogin   = tailcfg.Login{ID: 1, Provider: "localtailnet", LoginName: "tagged-devices", DisplayName: "tagged-devices"}
	taggedProfile = tailcfg.UserProfile{ID: taggedUserID, LoginName: "tagged-devices", DisplayName: "tagged-devices"}
)

// vipPrefix is where Tailscale Services get their IPv4 addresses; devices get 100.64.x.y
// (nodePrefix), the Funnel relay 100.96.x.y (relayPrefix).
var (
	vipPrefix   = netip.MustParsePrefix("100.80.0.0/16")
	nodePrefix  = netip.MustParsePrefix("100.64.0.0/16")
	relayPrefix = netip.MustParsePrefix("100.96.0.0/16")
)

func (n *node) fqdn(domain string) string { return n.label + "." + domain }

// randomText returns a random string of base32 characters (lowercase), n ≤ 26.
func randomText(n int) string { return strings.ToLower(rand.Text()[:n]) }

// nodeByKeyLocked finds the node that holds nodeKey.
func (s *server) nodeByKeyLocked(k key.NodePublic) *node {
	for _, n := range s.nodes {
		if n.nodeKey == k {
			return n
		}
	}
	return nil
}

// nodeByIDLocked finds a node by its stable ID or by its numeric (legacy API) ID.
func (s *server) nodeByIDLocked(id string) *node {
	for _, n := range s.nodes {
		if string(n.stableID) == id || fmt.Sprint(n.id) == id {
			return n
		}
	}
	return nil
}

func (s *server) sortedNodesLocked() []*node {
	out := make([]*node, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// addNodeLocked creates the node that registered with k.
func (s *server) addNodeLocked(mkey key.MachinePublic, req *tailcfg.RegisterRequest, k *authKey) *node {
	s.lastNodeID++
	id := s.lastNodeID
	prefix := nodePrefix.Addr().As4()
	if k.funnelRelay {
		prefix = relayPrefix.Addr().As4()
	}
	v4 := netip.AddrFrom4([4]byte{prefix[0], prefix[1], byte(id >> 8), byte(id)})
	hi := req.Hostinfo
	if hi == nil {
		hi = new(tailcfg.Hostinfo)
	}
	now := time.Now()
	n := &node{
		id:        id,
		stableID:  tailcfg.StableNodeID("n" + randomText(10) + "CNTRL"),
		machine:   mkey,
		nodeKey:   req.NodeKey,
		hostinfo:  hi,
		label:     s.uniqueLabelLocked(hi.Hostname),
		tags:      slices.Clone(k.tags),
		owner:     k.owner,
		ephemeral: k.ephemeral || req.Ephemeral,
		addrs:     []netip.Prefix{netip.PrefixFrom(v4, 32), netip.PrefixFrom(tsaddr.Tailscale4To6(v4), 128)},
		created:   now,
		lastSeen:  now,
	}
	n.funnelRelay = k.funnelRelay
	s.nodes[id] = n
	s.changedLocked()
	return n
}

// uniqueLabelLocked turns a hostname into a MagicDNS label no other node uses, adding -1, -2, …
// on collisions as Tailscale does; the operator relies on that to spot stale devices.
func (s *server) uniqueLabelLocked(hostname string) string {
	base := dnsname.SanitizeHostname(hostname)
	if base == "" {
		base = "node"
	}
	taken := func(l string) bool {
		for _, n := range s.nodes {
			if n.label == l {
				return true
			}
		}
		return false
	}
	label := base
	for i := 1; taken(label); i++ {
		label = fmt.Sprintf("%s-%d", base, i)
	}
	return label
}

func (s *server) deleteNodeLocked(n *node, why string) {
	delete(s.nodes, n.id)
	wake(n.stream) // its poll notices it is gone and ends
	s.logf("localtailnet: node %d (%s, %s) removed: %s", n.id, n.stableID, n.label, why)
	s.changedLocked()
}

// changedLocked wakes every streaming map poll to send a fresh netmap.
func (s *server) changedLocked() {
	for _, n := range s.nodes {
		wake(n.stream)
	}
}

func wake(ch chan struct{}) {
	if ch == nil {
		return
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// noteDiscoKeyLocked records the disco key a node's request carries. tailscaled makes one per
// start, so a new one is a new process: like a new node, it is hidden from its peers until it
// has had its netmap, or their handshakes to it are dropped and retried only after 5 s (a
// restarted replica's clients stalled that way).
func (s *server) noteDiscoKeyLocked(n *node, disco key.DiscoPublic) {
	if disco.IsZero() || disco == n.disco {
		return
	}
	n.disco, n.mapped = disco, false
	s.changedLocked()
}

// applyUpdateLocked records what a node reports about itself in a non-streaming map request.
func (s *server) applyUpdateLocked(n *node, req *tailcfg.MapRequest) {
	n.endpoints = req.Endpoints
	n.capVer = req.Version
	if req.Hostinfo != nil {
		n.hostinfo = req.Hostinfo
		if ni := req.Hostinfo.NetInfo; ni != nil && ni.PreferredDERP != 0 {
			n.homeDERP = ni.PreferredDERP
		}
		s.syncServicesLocked(n)
	}
	s.changedLocked()
}

// syncServicesLocked asks the node, over c2n, which services it advertises when its
// Hostinfo.ServicesHash says the list changed: the hash is all Hostinfo carries.
func (s *server) syncServicesLocked(n *node) {
	hash := n.hostinfo.ServicesHash
	if hash == "" {
		// Nothing advertised, nothing to ask; a fetch in flight is answered by a stale list.
		n.services, n.servicesHash, n.servicesAsked = nil, "", ""
		return
	}
	if hash == n.servicesHash || hash == n.servicesAsked {
		return
	}
	req, err := http.NewRequest(http.MethodGet, "/vip-services", nil)
	if err != nil {
		panic(err) // constant request
	}
	var payload bytes.Buffer
	if err := req.Write(&payload); err != nil {
		panic(err) // writes to memory
	}
	token := randomText(20)
	s.c2n[token] = n.id
	n.servicesAsked = hash
	n.pings = append(n.pings, &tailcfg.PingRequest{
		URL:     "https://unused/c2n/" + token, // answered over the Noise channel; the host is not used
		Types:   "c2n",
		Payload: payload.Bytes(),
	})
	wake(n.stream)
}

// setServicesLocked records the services a node reported over c2n.
func (s *server) setServicesLocked(n *node, res *tailcfg.C2NVIPServicesResponse) {
	n.services = nil
	for _, v := range res.VIPServices {
		if v.Active {
			n.services = append(n.services, v.Name)
			if n.approved == nil {
				n.approved = map[tailcfg.ServiceName]bool{}
			}
			n.approved[v.Name] = true
		}
	}
	n.servicesHash, n.servicesAsked = res.ServicesHash, ""
	s.syncServicesLocked(n) // in case the node changed its mind meanwhile
	s.changedLocked()
}

// allocVIPLocked returns a free service address of each family that services get.
func (s *server) allocVIPLocked() ([]netip.Addr, error) {
	pair, err := s.freeVIPPairLocked()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(pair, func(a netip.Addr) bool {
		return (a.Is4() && s.noServiceIPv4) || (a.Is6() && s.noServiceIPv6)
	}), nil
}

// freeVIPPairLocked returns the next IPv4 service address and its IPv6 counterpart, neither of
// them in use.
func (s *server) freeVIPPairLocked() ([]netip.Addr, error) {
	used := make(map[netip.Addr]bool)
	for _, svc := range s.services {
		for _, a := range svc.addrs {
			used[a] = true
		}
	}
	for a := vipPrefix.Addr().Next(); vipPrefix.Contains(a); a = a.Next() {
		if a6 := tsaddr.Tailscale4To6(a); !used[a] && !used[a6] {
			return []netip.Addr{a, a6}, nil
		}
	}
	return nil, fmt.Errorf("no free address in %v", vipPrefix)
}

// setServiceFamiliesLocked makes every service's addresses those of the families services get:
// a family turned off loses its address, one turned on gets a new one.
func (s *server) setServiceFamiliesLocked(ipv4, ipv6 bool) error {
	s.noServiceIPv4, s.noServiceIPv6 = !ipv4, !ipv6
	names := slices.Sorted(maps.Keys(s.services))
	for _, name := range names {
		svc := s.services[name]
		svc.addrs = slices.DeleteFunc(svc.addrs, func(a netip.Addr) bool { return (a.Is4() && !ipv4) || (a.Is6() && !ipv6) })
		has4 := slices.ContainsFunc(svc.addrs, netip.Addr.Is4)
		has6 := slices.ContainsFunc(svc.addrs, netip.Addr.Is6)
		if (!ipv4 || has4) && (!ipv6 || has6) {
			continue
		}
		pair, err := s.freeVIPPairLocked()
		if err != nil {
			return err
		}
		if ipv4 && !has4 {
			svc.addrs = append(svc.addrs, pair[0])
		}
		if ipv6 && !has6 {
			svc.addrs = append(svc.addrs, pair[1])
		}
		slices.SortFunc(svc.addrs, func(a, b netip.Addr) int { return a.BitLen() - b.BitLen() }) // IPv4 first
		s.logf("localtailnet: service %s now has addresses %v", name, svc.addrs)
	}
	s.changedLocked()
	return nil
}

// userID is the user a node belongs to: its owner, or the owner of all tagged devices.
func (n *node) userID() tailcfg.UserID {
	if n.owner != nil {
		return n.owner.ID
	}
	return taggedUserID
}

// userProfilesLocked lists the users of every node, for netmaps: peers need them to tell who
// is calling (WhoIs).
func (s *server) userProfilesLocked() []tailcfg.UserProfile {
	profiles := []tailcfg.UserProfile{taggedProfile}
	seen := map[tailcfg.UserID]bool{taggedUserID: true}
	for _, n := range s.sortedNodesLocked() {
		if n.owner != nil && !seen[n.owner.ID] {
			seen[n.owner.ID] = true
			profiles = append(profiles, *n.owner)
		}
	}
	return profiles
}
