package firewall

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

type family int

const (
	ipv4 family = iota
	ipv6
)

var families = []family{ipv4, ipv6}

func (f family) String() string {
	if f == ipv4 {
		return "ipv4"
	}
	return "ipv6"
}

func familyOf(a netip.Addr) family {
	if a.Is4() {
		return ipv4
	}
	return ipv6
}

// dnat rewrites destination address from to one of to.
type dnat struct {
	from netip.Addr
	to   []netip.Addr
}

// dnatOwner is everything one mapping wants in one family: its DNAT rules in the prerouting
// chain, and in the postrouting chain one masquerade per tailnet IP, for the connections DNATed
// from it.
type dnatOwner struct {
	name    string
	tag     string
	rules   []dnat // sorted by from
	snatTag string
}

// clampRule clamps the MSS of SYNs forwarded into (in) or out of the tunnel interface.
type clampRule struct {
	owner  string
	tag    string
	ifName string
	in     bool
}

type familyPlan struct {
	dnat  []dnatOwner // sorted by name
	clamp []clampRule // empty when dnat is
	// masq is nftables' one source NAT rule for every mapping (see snatExprs); iptables, which
	// cannot match the input interface after routing, has one per tailnet IP instead (snatWants).
	masq []want // empty when dnat is
}

func (p familyPlan) empty() bool { return len(p.dnat) == 0 }

// dnatWants is what the DNAT rules need in the prerouting chain.
func (p familyPlan) dnatWants() []want {
	w := make([]want, len(p.dnat))
	for i, o := range p.dnat {
		w[i] = want{owner: o.name, tag: o.tag, n: len(o.rules)}
	}
	return w
}

// snatWants is what iptables' source NAT needs in the postrouting chain: one rule per tailnet IP.
func (p familyPlan) snatWants() []want {
	w := make([]want, len(p.dnat))
	for i, o := range p.dnat {
		w[i] = want{owner: o.name, tag: o.snatTag, n: len(o.rules)}
	}
	return w
}

// clampWants is what the clamp rules need in the forward chain: one kernel rule each.
func (p familyPlan) clampWants() []want {
	w := make([]want, len(p.clamp))
	for i, cr := range p.clamp {
		w[i] = want{owner: cr.owner, tag: cr.tag, n: 1}
	}
	return w
}

// plan is the desired rule set, computed from mappings alone; the backends record in it what
// failed to install.
type plan struct {
	tun    string // the tunnel interface
	fams   [2]familyPlan
	status map[string]MappingStatus
	errs   []error
}

// setError records that family f of mapping name is not in place: its addresses leave the
// status, and the error joins the mapping's.
func (p *plan) setError(name string, f family, err error) {
	ms := p.status[name]
	if ms.Error != "" {
		ms.Error += "; "
	}
	ms.Error += f.String() + ": " + err.Error()
	if prev := ms.FamilyErrors[f.String()]; prev != "" {
		err = fmt.Errorf("%s; %w", prev, err)
	}
	if ms.FamilyErrors == nil {
		ms.FamilyErrors = map[string]string{}
	}
	ms.FamilyErrors[f.String()] = err.Error()
	ofF := func(a netip.Addr) bool { return familyOf(a) == f }
	ms.TailnetIPs = slices.DeleteFunc(slices.Clone(ms.TailnetIPs), ofF)
	ms.Destinations = slices.DeleteFunc(slices.Clone(ms.Destinations), ofF)
	p.status[name] = ms
}

// fail records that mapping name could not be installed in family f.
func (p *plan) fail(name string, f family, err error) {
	p.setError(name, f, err)
	p.errs = append(p.errs, fmt.Errorf("mapping %s: %s: %w", name, f, err))
}

// failFamily records that nothing could be installed in family f.
func (p *plan) failFamily(f family, err error) {
	for _, o := range p.fams[f].dnat {
		p.setError(o.name, f, err)
	}
	p.errs = append(p.errs, fmt.Errorf("%s: %w", f, err))
}

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9:._-]{0,99}$`)

const tagPrefix = "tsingress/"

// makeTag names owner in a rule comment, with a hash of the rule content so that a changed
// rule is told apart from an installed one without decoding kernel state.
func makeTag(owner, content string) string {
	sum := sha256.Sum256([]byte("v1\n" + content))
	return tagPrefix + owner + "/" + hex.EncodeToString(sum[:4])
}

// tagOwner returns the owner of a tag made by makeTag.
func tagOwner(tag string) (string, bool) {
	rest, ok := strings.CutPrefix(tag, tagPrefix)
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '/')
	if i < 1 || len(rest)-i-1 != 8 {
		return "", false
	}
	return rest[:i], true
}

func buildPlan(mappings []Mapping, tun string) plan {
	p := plan{tun: tun, status: map[string]MappingStatus{}}
	usedFrom := map[netip.Addr]string{}
	for _, m := range mappings {
		if _, dup := p.status[m.Name]; dup {
			p.errs = append(p.errs, fmt.Errorf("mapping %s: duplicate name, ignored", m.Name))
			continue
		}
		rules, ms, err := planMapping(m, usedFrom)
		if err != nil {
			ms.Error = err.Error()
			p.errs = append(p.errs, fmt.Errorf("mapping %s: %w", m.Name, err))
		}
		p.status[m.Name] = ms
		for _, r := range rules {
			usedFrom[r.from] = m.Name
			f := familyOf(r.from)
			fp := &p.fams[f]
			if i := len(fp.dnat) - 1; i >= 0 && fp.dnat[i].name == m.Name {
				fp.dnat[i].rules = append(fp.dnat[i].rules, r)
			} else {
				fp.dnat = append(fp.dnat, dnatOwner{name: m.Name, rules: []dnat{r}})
			}
		}
	}
	for f := range p.fams {
		fp := &p.fams[f]
		slices.SortFunc(fp.dnat, func(a, b dnatOwner) int { return strings.Compare(a.name, b.name) })
		for i := range fp.dnat {
			var b, snat strings.Builder
			fmt.Fprintf(&snat, "masquerade dnat not out %s\n", tun)
			for _, r := range fp.dnat[i].rules {
				fmt.Fprintf(&b, "dnat %s %v\n", r.from, r.to)
				fmt.Fprintf(&snat, "from %s\n", r.from)
			}
			fp.dnat[i].tag = makeTag(fp.dnat[i].name, b.String())
			fp.dnat[i].snatTag = makeTag(fp.dnat[i].name, snat.String())
		}
		if !fp.empty() {
			for _, in := range []bool{true, false} {
				owner := "mss-clamp-out"
				if in {
					owner = "mss-clamp-in"
				}
				fp.clamp = append(fp.clamp, clampRule{owner: owner, tag: makeTag(owner, "clamp "+tun), ifName: tun, in: in})
			}
			fp.masq = []want{{owner: "masquerade", tag: makeTag("masquerade", "dnat from "+tun), n: 1}}
		}
	}
	return p
}

// planMapping validates m and returns its DNAT rules, sorted by tailnet IP. A tailnet IP that
// another mapping already uses is an error.
func planMapping(m Mapping, usedFrom map[netip.Addr]string) ([]dnat, MappingStatus, error) {
	var ms MappingStatus
	if !validName.MatchString(m.Name) {
		return nil, ms, fmt.Errorf("name %q: want letters, digits and \":._-\", at most 100", m.Name)
	}
	froms, err := cleanAddrs(m.TailnetIPs)
	if err != nil {
		return nil, ms, fmt.Errorf("tailnet IPs: %w", err)
	}
	tos, err := cleanAddrs(m.Destinations)
	if err != nil {
		return nil, ms, fmt.Errorf("destinations: %w", err)
	}
	for _, a := range froms {
		if other, ok := usedFrom[a]; ok {
			return nil, ms, fmt.Errorf("tailnet IP %s is already used by mapping %s", a, other)
		}
	}
	var rules []dnat
	for _, f := range families {
		from := slices.DeleteFunc(slices.Clone(froms), func(a netip.Addr) bool { return familyOf(a) != f })
		to := slices.DeleteFunc(slices.Clone(tos), func(a netip.Addr) bool { return familyOf(a) != f })
		if len(from) == 0 || len(to) == 0 {
			continue
		}
		for _, a := range from {
			rules = append(rules, dnat{from: a, to: to})
		}
		ms.TailnetIPs = append(ms.TailnetIPs, from...)
		ms.Destinations = append(ms.Destinations, to...)
	}
	if len(rules) == 0 {
		return nil, ms, errors.New("no tailnet IP has a destination of its address family")
	}
	return rules, ms, nil
}

// cleanAddrs checks addrs and returns them sorted without duplicates, so that DNS answers in a
// new order do not rewrite rules.
func cleanAddrs(addrs []netip.Addr) ([]netip.Addr, error) {
	if len(addrs) == 0 {
		return nil, errors.New("none given")
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" || a.Is4In6() {
			return nil, fmt.Errorf("%v is not a usable unicast address", a)
		}
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// found is a rule listed from one of our chains: id is an nftables handle or an iptables
// rule number, tag its comment ("" when it has none).
type found struct {
	id  uint64
	tag string
}

// want is what one owner needs in a chain: n kernel rules, each commented tag.
type want struct {
	owner string
	tag   string
	n     int
}

// chainDiff is how to turn a chain's rules into the wanted ones.
type chainDiff struct {
	// install lists the indexes of wants whose rules are missing or differ.
	install []int
	// replaced holds, per install index, the ids of that owner's current rules, to delete once
	// the new ones are in.
	replaced map[int][]uint64
	// stale lists rules of no wanted owner, or without a tag of ours.
	stale []uint64
}

func diffChain(rules []found, wants []want) chainDiff {
	byOwner := map[string][]found{}
	var d chainDiff
	d.replaced = map[int][]uint64{}
	for _, r := range rules {
		owner, ok := tagOwner(r.tag)
		if !ok {
			d.stale = append(d.stale, r.id)
			continue
		}
		byOwner[owner] = append(byOwner[owner], r)
	}
	for i, w := range wants {
		cur := byOwner[w.owner]
		delete(byOwner, w.owner)
		if len(cur) == w.n && !slices.ContainsFunc(cur, func(r found) bool { return r.tag != w.tag }) {
			continue
		}
		d.install = append(d.install, i)
		for _, r := range cur {
			d.replaced[i] = append(d.replaced[i], r.id)
		}
	}
	for _, rs := range byOwner {
		for _, r := range rs {
			d.stale = append(d.stale, r.id)
		}
	}
	slices.Sort(d.stale)
	return d
}
