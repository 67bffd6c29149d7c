package firewall

import (
	"encoding/json"
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
)

// FuzzPlan plans the rules of the mappings a DNAT document (as a replica reads it) asks for. The
// plan must give every mapping a status, install each tailnet IP for one mapping only, never
// report an address the mapping did not ask for, and name its tags so that tagOwner reads them
// back.
func FuzzPlan(f *testing.F) {
	f.Add([]byte(`{"version":1,"services":{"svc:db":{"vips":["100.100.0.1","fd7a:115c:a1e0::1"],"destination":{"ips":["10.96.0.5","fd00::5"]}}}}`))
	f.Add([]byte(`{"version":1,"services":{"svc:a":{"vips":["100.100.0.1"],"destination":{"ips":["10.0.0.1"]}},"svc:b":{"vips":["100.100.0.1"],"destination":{"ips":["10.0.0.2"]}}}}`))
	f.Add([]byte(`{"version":1,"services":{"svc:x":{"vips":["::ffff:1.2.3.4","fe80::1%eth0"],"destination":{"ips":["0.0.0.0","ff02::1"]}}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		doc, _, err := contract.DNATConfigs.Decode(map[string][]byte{"dnat-config.v1.json": raw})
		if err != nil {
			return
		}
		var mappings []Mapping
		for _, name := range slices.Sorted(maps.Keys(doc.Services)) {
			svc := doc.Services[name]
			m := Mapping{Name: name}
			for _, v := range svc.VIPs {
				m.TailnetIPs = append(m.TailnetIPs, netip.MustParseAddr(v).Unmap())
			}
			for _, d := range svc.Destination.IPs {
				m.Destinations = append(m.Destinations, netip.MustParseAddr(d).Unmap())
			}
			mappings = append(mappings, m)
		}
		p := buildPlan(mappings, "ts0")
		owner := map[netip.Addr]string{}
		for _, fp := range p.fams {
			for _, o := range fp.dnat {
				if got, ok := tagOwner(o.tag); !ok || got != o.name {
					t.Fatalf("tag %q reads back as %q, %v", o.tag, got, ok)
				}
				for _, r := range o.rules {
					if prev, dup := owner[r.from]; dup {
						t.Fatalf("tailnet IP %s installed for %s and %s", r.from, prev, o.name)
					}
					owner[r.from] = o.name
				}
			}
		}
		for _, m := range mappings {
			st, ok := p.status[m.Name]
			if !ok {
				t.Fatalf("mapping %s has no status", m.Name)
			}
			for _, a := range st.TailnetIPs {
				if !slices.Contains(m.TailnetIPs, a) {
					t.Fatalf("mapping %s reports tailnet IP %s it did not ask for", m.Name, a)
				}
			}
			for _, a := range st.Destinations {
				if !slices.Contains(m.Destinations, a) {
					t.Fatalf("mapping %s reports destination %s it did not ask for", m.Name, a)
				}
			}
			if st.Error == "" && len(st.TailnetIPs) == 0 {
				t.Fatalf("mapping %s installs nothing and reports no error", m.Name)
			}
		}
		if _, err := json.Marshal(p.status); err != nil {
			t.Fatal(err)
		}
	})
}
