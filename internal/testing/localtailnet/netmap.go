package localtailnet

import (
	"encoding/json"
	"net/netip"
	"slices"

	"tailscale.com/net/tsaddr"
	"tailscale.com/tailcfg"
	"tailscale.com/types/opt"
)

// mapResponseLocked builds the full netmap for self. prev holds the peers of the previous
// response on the same poll: when none are left, the removals must be spelled out, since an
// empty Peers list means "no change" on the wire.
func (s *server) mapResponseLocked(self *node, prev map[tailcfg.NodeID]bool) (*tailcfg.MapResponse, map[tailcfg.NodeID]bool) {
	hosts := s.serviceHostsLocked()
	selfNode := s.tailcfgNodeLocked(self)
	for _, attr := range s.attrsLocked(self) {
		selfNode.CapMap[attr] = nil
	}
	mapping := tailcfg.ServiceIPMappings{}
	if len(self.tags) > 0 {
		for name := range self.approved {
			if svc := s.services[name]; svc != nil {
				mapping[name] = svc.addrs
			}
		}
	}
	if len(mapping) > 0 {
		raw, err := json.Marshal(mapping)
		if err != nil {
			panic(err) // names and addresses always marshal
		}
		selfNode.CapMap[tailcfg.NodeAttrServiceHost] = []tailcfg.RawMessage{tailcfg.RawMessage(raw)}
	}

	res := &tailcfg.MapResponse{
		Node:            selfNode,
		DERPMap:         s.derpMap,
		Domain:          s.domain,
		DNSConfig:       s.dnsConfigLocked(self),
		PacketFilter:    s.packetFilterLocked(self),
		UserProfiles:    s.userProfilesLocked(),
		CollectServices: opt.False,
	}
	sent := make(map[tailcfg.NodeID]bool)
	for _, p := range s.sortedNodesLocked() {
		if p == self || !p.reachable() || (p.funnelRelay && !s.mayFunnelLocked(self)) {
			continue
		}
		tn := s.tailcfgNodeLocked(p)
		for name, hs := range hosts {
			if host := routeLocked(hs, self, name); host == p {
				for _, a := range s.services[name].addrs {
					tn.AllowedIPs = append(tn.AllowedIPs, netip.PrefixFrom(a, a.BitLen()))
				}
			}
		}
		res.Peers = append(res.Peers, tn)
		sent[p.id] = true
	}
	if len(res.Peers) == 0 {
		for id := range prev {
			res.PeersRemoved = append(res.PeersRemoved, id)
		}
		slices.Sort(res.PeersRemoved)
	}
	return res, sent
}

// packetFilterLocked lets every device reach every other on every port. A device that may take
// Funnel traffic also has the relay among its peers, which may reach nothing (tailscaled
// ignores a filter that lets such a peer in, so the sources are the devices' addresses rather
// than "*") but is granted the ingress capability: the right to hand over connections through
// the device's peer API, as Tailscale's control plane grants its funnel ingress nodes.
// The policy's app grants follow (see AppGrant).
func (s *server) packetFilterLocked(self *node) []tailcfg.FilterRule {
	return append(s.reachFilterLocked(self), s.appGrantRulesLocked(self)...)
}

func (s *server) reachFilterLocked(self *node) []tailcfg.FilterRule {
	if !s.mayFunnelLocked(self) || s.funnel == nil {
		return slices.Clone(tailcfg.FilterAllowAll)
	}
	devices := []string{nodePrefix.String(), netip.PrefixFrom(tsaddr.Tailscale4To6(nodePrefix.Addr()), 112).String()}
	var relays []string
	for _, n := range s.sortedNodesLocked() {
		if n.funnelRelay {
			for _, a := range n.addrs {
				relays = append(relays, a.String())
			}
		}
	}
	rules := []tailcfg.FilterRule{{SrcIPs: devices, DstPorts: []tailcfg.NetPortRange{{IP: "*", Ports: tailcfg.PortRangeAny}}}}
	if len(relays) > 0 {
		rules = append(rules, tailcfg.FilterRule{SrcIPs: relays, CapGrant: []tailcfg.CapGrant{{
			Dsts:   slices.Clone(self.addrs),
			CapMap: tailcfg.PeerCapMap{tailcfg.PeerCapabilityIngress: nil},
		}}})
	}
	return rules
}

// reachable reports whether a node may be shown to its peers: it knows them (it has had its
// netmap) and has said where it can be reached (endpoints or a home DERP region). A peer shown
// earlier is sent a WireGuard handshake that goes nowhere, or that the node drops as from an
// unknown peer, and WireGuard tries again only after 5 s (REKEY_TIMEOUT): a client's first
// requests to a new proxy hung for 5 s that way.
func (n *node) reachable() bool {
	return n.mapped && (len(n.endpoints) > 0 || n.homeDERP != 0)
}

// serviceHostsLocked returns, per service, the connected, reachable nodes that advertise it, by
// node ID.
// Advertising is approval enough here: the local tailnet has no policy file.
func (s *server) serviceHostsLocked() map[tailcfg.ServiceName][]*node {
	hosts := make(map[tailcfg.ServiceName][]*node)
	for _, n := range s.sortedNodesLocked() {
		// A node its peers are not shown (a restarted replica before its netmap) hosts nothing:
		// the clients that would pick it would have no route to the service.
		if n.stream == nil || len(n.tags) == 0 || !n.reachable() {
			continue
		}
		for _, name := range n.services {
			if s.services[name] != nil {
				hosts[name] = append(hosts[name], n)
			}
		}
	}
	return hosts
}

// routeLocked chooses which host of a service a client sends the service's traffic to, and
// records it: a client that hosts the service itself keeps it local; a client stays with the
// host it was given while that host remains one; others are spread over the hosts by node ID.
// Moving a client cuts its connections in flight (the new host resets them), so a host that
// comes back (a restarted replica) takes only clients that had none.
func routeLocked(hosts []*node, client *node, name tailcfg.ServiceName) *node {
	if len(hosts) == 0 || slices.Contains(hosts, client) {
		delete(client.routes, name)
		return nil
	}
	if id, ok := client.routes[name]; ok {
		if i := slices.IndexFunc(hosts, func(h *node) bool { return h.id == id }); i >= 0 {
			return hosts[i]
		}
	}
	host := hosts[int(client.id)%len(hosts)]
	if client.routes == nil {
		client.routes = make(map[tailcfg.ServiceName]tailcfg.NodeID)
	}
	client.routes[name] = host.id
	return host
}

func (s *server) tailcfgNodeLocked(n *node) *tailcfg.Node {
	online := n.stream != nil
	tn := &tailcfg.Node{
		ID:                n.id,
		StableID:          n.stableID,
		Name:              n.fqdn(s.domain) + ".",
		User:              n.userID(),
		Key:               n.nodeKey,
		Machine:           n.machine,
		DiscoKey:          n.disco,
		Addresses:         slices.Clone(n.addrs),
		AllowedIPs:        slices.Clone(n.addrs),
		Endpoints:         n.endpoints,
		HomeDERP:          n.homeDERP,
		Hostinfo:          n.hostinfo.View(),
		Created:           n.created,
		Cap:               n.capVer,
		Tags:              n.tags,
		MachineAuthorized: true,
		Online:            &online,
		CapMap:            tailcfg.NodeCapMap{},
	}
	if !online {
		lastSeen := n.lastSeen
		tn.LastSeen = &lastSeen
	}
	if s.https {
		tn.CapMap[tailcfg.CapabilityHTTPS] = nil
	}
	// A relay is no device: it carries no tailnet lock signature and gets no network access.
	tn.UnsignedPeerAPIOnly = n.funnelRelay
	return tn
}

// dnsConfigLocked turns MagicDNS on and names every Tailscale Service <label>.<domain>.
func (s *server) dnsConfigLocked(self *node) *tailcfg.DNSConfig {
	cfg := &tailcfg.DNSConfig{Proxied: true, Domains: []string{s.domain}, CertDomains: s.certDomainsLocked(self)}
	names := make([]tailcfg.ServiceName, 0, len(s.services))
	for name := range s.services {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, a := range s.services[name].addrs {
			cfg.ExtraRecords = append(cfg.ExtraRecords, tailcfg.DNSRecord{
				Name:  name.WithoutPrefix() + "." + s.domain + ".",
				Value: a.String(),
			})
		}
	}
	return cfg
}
