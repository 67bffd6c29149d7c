package localtailnet

import (
	"maps"
	"net/netip"
	"slices"

	"tailscale.com/tailcfg"
)

// NodeAttr grants node attributes to devices, as an entry of a tailnet policy file's
// "nodeAttrs" section does: every attribute in Attr to every device matched by Target, a tag
// ("tag:k8s") or "*" for all devices.
//
// The attribute that changes what the local tailnet does is "funnel" (tailcfg.NodeAttrFunnel):
// with Options.Funnel, its devices may take connections from the internet (see Options.Funnel).
// As on Tailscale, a device granted "funnel" is also told the ports Funnel takes (443, 8443 and
// 10000). Other attributes are passed on to the devices' netmaps as they are.
type NodeAttr struct {
	Target []string
	Attr   []string
}

// AppGrant grants app capabilities, as an entry of a tailnet policy file's "grants" section
// with an "app" field does: every capability in App, with its values, to connections from the
// devices matched by Src (a user's login name, a tag, or "*") to those matched by Dst (a tag, a
// Tailscale Service "svc:name", or "*"). A device asks tailscaled which capabilities a caller
// has (WhoIs); the values are passed on as they are.
type AppGrant struct {
	Src, Dst []string
	App      tailcfg.PeerCapMap
}

// SetAppGrants replaces the policy's app grants; every device's netmap follows at once.
func (lt *LocalTailnet) SetAppGrants(grants []AppGrant) {
	s := lt.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	s.appGrants = make([]AppGrant, len(grants))
	for i, g := range grants {
		s.appGrants[i] = AppGrant{Src: slices.Clone(g.Src), Dst: slices.Clone(g.Dst), App: maps.Clone(g.App)}
	}
	s.logf("localtailnet: policy app grants now %d", len(s.appGrants))
	s.changedLocked()
}

// appGrantRulesLocked are the filter rules that carry the app grants to self: for each grant
// whose destinations include self, or a Tailscale Service, the grant's capabilities from the
// addresses of the devices its sources match, to self's addresses or the service's.
func (s *server) appGrantRulesLocked(self *node) []tailcfg.FilterRule {
	var rules []tailcfg.FilterRule
	for _, g := range s.appGrants {
		var dsts []netip.Prefix
		for _, d := range g.Dst {
			if svc := s.services[tailcfg.ServiceName(d)]; svc != nil {
				for _, a := range svc.addrs {
					dsts = append(dsts, netip.PrefixFrom(a, a.BitLen()))
				}
			} else if matchesDevice(self, d) {
				dsts = append(dsts, self.addrs...)
			}
		}
		var srcs []string
		for _, n := range s.sortedNodesLocked() {
			if slices.ContainsFunc(g.Src, func(src string) bool { return matchesDevice(n, src) }) {
				for _, a := range n.addrs {
					srcs = append(srcs, a.String())
				}
			}
		}
		if len(dsts) > 0 && len(srcs) > 0 {
			rules = append(rules, tailcfg.FilterRule{SrcIPs: srcs, CapGrant: []tailcfg.CapGrant{{Dsts: dsts, CapMap: maps.Clone(g.App)}}})
		}
	}
	return rules
}

// matchesDevice reports whether a policy selector ("*", a tag, or a user's login name)
// matches n.
func matchesDevice(n *node, selector string) bool {
	return selector == "*" || slices.Contains(n.tags, selector) || (n.owner != nil && n.owner.LoginName == selector)
}

// funnelPortsAttr is the attribute Tailscale's control plane sends with "funnel": the ports
// the relays listen on.
const funnelPortsAttr = tailcfg.NodeCapability(string(tailcfg.CapabilityFunnelPorts) + "?ports=443,8443,10000")

// SetNodeAttrs replaces the policy's node attributes; every device's netmap follows at once.
func (lt *LocalTailnet) SetNodeAttrs(attrs []NodeAttr) {
	s := lt.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeAttrs = cloneNodeAttrs(attrs)
	s.logf("localtailnet: policy node attributes now %+v", s.nodeAttrs)
	s.changedLocked()
}

func cloneNodeAttrs(attrs []NodeAttr) []NodeAttr {
	out := make([]NodeAttr, len(attrs))
	for i, a := range attrs {
		out[i] = NodeAttr{Target: slices.Clone(a.Target), Attr: slices.Clone(a.Attr)}
	}
	return out
}

// attrsLocked lists the node attributes the policy grants n.
func (s *server) attrsLocked(n *node) []tailcfg.NodeCapability {
	var out []tailcfg.NodeCapability
	for _, a := range s.nodeAttrs {
		if !slices.ContainsFunc(a.Target, func(t string) bool { return t == "*" || slices.Contains(n.tags, t) }) {
			continue
		}
		for _, attr := range a.Attr {
			c := tailcfg.NodeCapability(attr)
			out = append(out, c)
			if c == tailcfg.NodeAttrFunnel {
				out = append(out, funnelPortsAttr)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// mayFunnelLocked reports whether the policy lets n take Funnel traffic: the attribute, and
// HTTPS, which Funnel needs for its certificates.
func (s *server) mayFunnelLocked(n *node) bool {
	return s.https && !n.funnelRelay && slices.Contains(s.attrsLocked(n), tailcfg.NodeAttrFunnel)
}
