package localtailnet

import (
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
