package l3

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/firewall"
)

// Mapping is one exposed destination: traffic to each of TailnetIPs, all protocols and ports,
// goes to the destination addresses of the same family.
type Mapping struct {
	// Name identifies the mapping in rules and status: contract.StandaloneMapping, or a
	// Tailscale Service name such as "svc:web".
	Name string
	// TailnetIPs are the node's own addresses (standalone) or a Tailscale Service's VIPs.
	TailnetIPs  []netip.Addr
	Destination contract.Destination
}

// resolution is what a DNS-name destination resolved to.
type resolution struct {
	addrs []netip.Addr // usable addresses, sorted, without duplicates; nil before any answer
	err   error        // the last lookup's failure, nil after a success
}

// next is the resolution after a lookup that answered answer or failed with err. A failed
// lookup keeps the previous addresses, so a DNS outage does not cut traffic that flows.
// changed says whether the rules need rewriting: the addresses differ, or there are none and
// the failure reads differently.
func (r resolution) next(answer []netip.Addr, err error) (n resolution, changed bool) {
	if err == nil {
		if answer = usableAddrs(answer); len(answer) == 0 {
			err = errors.New("no usable address in the answer")
		}
	}
	if err != nil {
		n = resolution{addrs: r.addrs, err: err}
		return n, len(r.addrs) == 0 && (r.err == nil || r.err.Error() != err.Error())
	}
	return resolution{addrs: answer}, !slices.Equal(r.addrs, answer)
}

// usableAddrs returns the unicast addresses of addrs, unmapped, sorted and without duplicates,
// so that an answer in another order compares equal.
func usableAddrs(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if a.IsValid() && !a.IsUnspecified() && !a.IsMulticast() {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// nameKey is how a DNS name is looked up and remembered: case and a final dot do not matter.
func nameKey(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// dnsNames lists the distinct DNS names that mappings point at.
func dnsNames(mappings []Mapping) []string {
	var names []string
	for _, m := range mappings {
		if m.Destination.DNSName != "" {
			names = append(names, nameKey(m.Destination.DNSName))
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// firewallMappings turns mappings into what the firewall installs, with DNS names replaced by
// their resolved addresses. A mapping that cannot be turned (invalid address, name not
// resolved) is left out, so its rules go, and its error is returned by name.
func firewallMappings(mappings []Mapping, resolved map[string]resolution) ([]firewall.Mapping, map[string]error) {
	var out []firewall.Mapping
	errs := map[string]error{}
	for _, m := range mappings {
		dst, err := destinationAddrs(m.Destination, resolved)
		if err != nil {
			errs[m.Name] = err
			continue
		}
		tailnetIPs := make([]netip.Addr, len(m.TailnetIPs))
		for i, a := range m.TailnetIPs {
			tailnetIPs[i] = a.Unmap()
		}
		out = append(out, firewall.Mapping{Name: m.Name, TailnetIPs: tailnetIPs, Destinations: dst})
	}
	return out, errs
}

func destinationAddrs(d contract.Destination, resolved map[string]resolution) ([]netip.Addr, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if d.DNSName != "" {
		r := resolved[nameKey(d.DNSName)]
		if len(r.addrs) > 0 {
			return r.addrs, nil
		}
		if r.err == nil {
			return nil, fmt.Errorf("%s is not resolved yet", d.DNSName)
		}
		return nil, fmt.Errorf("resolve %s: %w", d.DNSName, r.err)
	}
	addrs := make([]netip.Addr, len(d.IPs))
	for i, s := range d.IPs {
		addrs[i] = netip.MustParseAddr(s).Unmap() // Validate parsed it
	}
	return addrs, nil
}

// withoutFamilies drops from mappings the tailnet IPs of the families that cannot be forwarded
// (problems, by family name), and returns per mapping and family the problem that applies: to
// a family the mapping needs, with a tailnet IP and a destination of it. A mapping left without
// tailnet IPs is left out, with its error added to errs.
func withoutFamilies(mappings []firewall.Mapping, problems map[string]contract.FamilyProblem, errs map[string]error) ([]firewall.Mapping, map[string]map[string]string) {
	if len(problems) == 0 {
		return mappings, nil
	}
	famErrs := map[string]map[string]string{}
	var out []firewall.Mapping
	for _, m := range mappings {
		for i, name := range familyNames {
			p, ok := problems[name]
			of := func(a netip.Addr) bool { return familyIndex(a) == i }
			if !ok || !slices.ContainsFunc(m.TailnetIPs, of) || !slices.ContainsFunc(m.Destinations, of) {
				continue
			}
			m.TailnetIPs = slices.DeleteFunc(slices.Clone(m.TailnetIPs), of)
			if famErrs[m.Name] == nil {
				famErrs[m.Name] = map[string]string{}
			}
			famErrs[m.Name][name] = p.Message
		}
		if len(m.TailnetIPs) == 0 {
			errs[m.Name] = errors.New(familyErrorText(famErrs[m.Name]))
			continue
		}
		out = append(out, m)
	}
	return out, famErrs
}

// familyErrorText joins per-family errors as the firewall does: "ipv4: ...; ipv6: ...".
func familyErrorText(errs map[string]string) string {
	var parts []string
	for _, name := range familyNames {
		if e, ok := errs[name]; ok {
			parts = append(parts, name+": "+e)
		}
	}
	return strings.Join(parts, "; ")
}

// contractStatus reports every mapping: as the firewall installed it, or with the error that
// kept it out, and the families that could not be forwarded (famErrs).
func contractStatus(mode firewall.Mode, mappings []Mapping, errs map[string]error, famErrs map[string]map[string]string, st firewall.Status) contract.FirewallStatus {
	out := contract.FirewallStatus{Mode: contract.FirewallMode(mode), Mappings: map[string]contract.AppliedDNAT{}}
	for _, m := range mappings {
		if err, ok := errs[m.Name]; ok {
			out.Mappings[m.Name] = contract.AppliedDNAT{Error: err.Error(), FamilyErrors: maps.Clone(famErrs[m.Name])}
			continue
		}
		ms := st.Mappings[m.Name]
		fe := maps.Clone(ms.FamilyErrors)
		if extra := famErrs[m.Name]; len(extra) > 0 {
			if fe == nil {
				fe = map[string]string{}
			}
			maps.Copy(fe, extra)
			if ms.Error != "" {
				ms.Error += "; "
			}
			ms.Error += familyErrorText(extra)
		}
		out.Mappings[m.Name] = contract.AppliedDNAT{
			TailnetIPs:   addrStrings(ms.TailnetIPs),
			Destinations: addrStrings(ms.Destinations),
			Error:        ms.Error,
			FamilyErrors: fe,
		}
	}
	return out
}

// addrStrings renders addrs; none is nil, so that every mapping without addresses reads alike.
func addrStrings(addrs []netip.Addr) []string {
	if len(addrs) == 0 {
		return nil
	}
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}
