package l3

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/firewall"
)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func TestResolutionNext(t *testing.T) {
	timeout := errors.New("i/o timeout")
	nxdomain := errors.New("no such host")
	ab := resolution{addrs: addrs("10.0.0.1", "fd00::1")}
	for _, tc := range []struct {
		name        string
		prev        resolution
		answer      []netip.Addr
		err         error
		want        resolution
		wantChanged bool
	}{
		{name: "first answer", answer: addrs("fd00::1", "10.0.0.1"), want: ab, wantChanged: true},
		{name: "same set in another order, duplicated, IPv4-mapped", prev: ab,
			answer: addrs("fd00::1", "::ffff:10.0.0.1", "10.0.0.1"), want: ab},
		{name: "one address more", prev: ab, answer: addrs("10.0.0.1", "10.0.0.2", "fd00::1"),
			want: resolution{addrs: addrs("10.0.0.1", "10.0.0.2", "fd00::1")}, wantChanged: true},
		{name: "one address less", prev: ab, answer: addrs("10.0.0.1"),
			want: resolution{addrs: addrs("10.0.0.1")}, wantChanged: true},
		{name: "failure keeps the previous answer", prev: ab, err: timeout,
			want: resolution{addrs: ab.addrs, err: timeout}},
		{name: "first failure", err: nxdomain, want: resolution{err: nxdomain}, wantChanged: true},
		{name: "same failure again", prev: resolution{err: nxdomain}, err: errors.New("no such host"),
			want: resolution{err: nxdomain}},
		{name: "another failure", prev: resolution{err: nxdomain}, err: timeout,
			want: resolution{err: timeout}, wantChanged: true},
		{name: "success after failure", prev: resolution{err: nxdomain}, answer: addrs("10.0.0.1", "fd00::1"),
			want: ab, wantChanged: true},
		{name: "success after failure with kept answer", prev: resolution{addrs: ab.addrs, err: timeout},
			answer: addrs("10.0.0.1", "fd00::1"), want: ab},
		{name: "only unusable addresses", prev: ab, answer: addrs("0.0.0.0", "ff02::1"),
			want: resolution{addrs: ab.addrs, err: errors.New("no usable address in the answer")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := tc.prev.next(tc.answer, tc.err)
			if !slices.Equal(got.addrs, tc.want.addrs) || errText(got.err) != errText(tc.want.err) || changed != tc.wantChanged {
				t.Errorf("next = %v, %v, changed %v; want %v, %v, changed %v",
					got.addrs, got.err, changed, tc.want.addrs, tc.want.err, tc.wantChanged)
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestDNSNames(t *testing.T) {
	ms := []Mapping{
		{Name: "a", Destination: contract.Destination{DNSName: "DB.example.com."}},
		{Name: "b", Destination: contract.Destination{DNSName: "db.example.com"}},
		{Name: "c", Destination: contract.Destination{IPs: []string{"10.0.0.1"}}},
		{Name: "d", Destination: contract.Destination{DNSName: "api.example.com"}},
	}
	if got, want := dnsNames(ms), []string{"api.example.com", "db.example.com"}; !slices.Equal(got, want) {
		t.Errorf("dnsNames = %v, want %v", got, want)
	}
}

func TestFirewallMappings(t *testing.T) {
	tailnet := addrs("100.64.0.5", "fd7a:115c:a1e0::5")
	resolved := map[string]resolution{
		"db.example.com":   {addrs: addrs("10.0.0.7", "fd00::7")},
		"gone.example.com": {err: errors.New("no such host")},
	}
	ms := []Mapping{
		{Name: "ips", TailnetIPs: append(addrs("::ffff:100.64.0.5"), tailnet[1]),
			Destination: contract.Destination{IPs: []string{"10.96.0.1", "::ffff:10.96.0.2", "fd00:96::1"}}},
		{Name: "v4only", TailnetIPs: addrs("100.64.0.6"), Destination: contract.Destination{IPs: []string{"10.96.0.3"}}},
		{Name: "dns", TailnetIPs: addrs("100.64.0.7"), Destination: contract.Destination{DNSName: "DB.example.com."}},
		{Name: "unresolved", TailnetIPs: tailnet, Destination: contract.Destination{DNSName: "gone.example.com"}},
		{Name: "pending", TailnetIPs: tailnet, Destination: contract.Destination{DNSName: "new.example.com"}},
		{Name: "invalid", TailnetIPs: tailnet, Destination: contract.Destination{IPs: []string{"10.0.0.1"}, DNSName: "x.example.com"}},
		{Name: "bad-ip", TailnetIPs: tailnet, Destination: contract.Destination{IPs: []string{"10.0.0.300"}}},
		{Name: "none", TailnetIPs: tailnet},
	}
	got, errs := firewallMappings(ms, resolved)
	want := []firewall.Mapping{
		{Name: "ips", TailnetIPs: tailnet, Destinations: addrs("10.96.0.1", "10.96.0.2", "fd00:96::1")},
		{Name: "v4only", TailnetIPs: addrs("100.64.0.6"), Destinations: addrs("10.96.0.3")},
		{Name: "dns", TailnetIPs: addrs("100.64.0.7"), Destinations: addrs("10.0.0.7", "fd00::7")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("firewall mappings\n got %+v\nwant %+v", got, want)
	}
	wantErrs := map[string]string{
		"unresolved": "resolve gone.example.com: no such host",
		"pending":    "not resolved yet",
		"invalid":    "both IPs and a DNS name",
		"bad-ip":     "10.0.0.300",
		"none":       "no destination",
	}
	if len(errs) != len(wantErrs) {
		t.Errorf("errors %v, want one for each of %v", errs, wantErrs)
	}
	for name, frag := range wantErrs {
		if err := errs[name]; err == nil || !strings.Contains(err.Error(), frag) {
			t.Errorf("error of %s = %v, want one containing %q", name, err, frag)
		}
	}
}

func TestContractStatus(t *testing.T) {
	ms := []Mapping{{Name: "standalone"}, {Name: "svc:a"}, {Name: "svc:b"}}
	st := firewall.Status{Mode: firewall.ModeIPTables, Mappings: map[string]firewall.MappingStatus{
		"standalone": {TailnetIPs: addrs("100.64.0.5"), Destinations: addrs("10.96.0.1")},
		"svc:a":      {Error: "ipv6: no such table"},
	}}
	got := contractStatus(firewall.ModeIPTables, ms, map[string]error{"svc:b": errors.New("resolve b: no such host")}, nil, st)
	want := contract.FirewallStatus{Mode: contract.FirewallIPTables, Mappings: map[string]contract.AppliedDNAT{
		"standalone": {TailnetIPs: []string{"100.64.0.5"}, Destinations: []string{"10.96.0.1"}},
		"svc:a":      {Error: "ipv6: no such table"},
		"svc:b":      {Error: "resolve b: no such host"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("status\n got %+v\nwant %+v", got, want)
	}

	// Families that could not be forwarded join the firewall's own errors.
	st.Mappings["svc:a"] = firewall.MappingStatus{TailnetIPs: addrs("100.100.0.1"), Destinations: addrs("10.96.0.2"),
		Error: "ipv4: no such table", FamilyErrors: map[string]string{"ipv4": "no such table"}}
	famErrs := map[string]map[string]string{"svc:a": {"ipv6": "disabled"}, "svc:b": {"ipv6": "disabled"}}
	got = contractStatus(firewall.ModeIPTables, ms, map[string]error{"svc:b": errors.New("ipv6: disabled")}, famErrs, st)
	want.Mappings["svc:a"] = contract.AppliedDNAT{TailnetIPs: []string{"100.100.0.1"}, Destinations: []string{"10.96.0.2"},
		Error: "ipv4: no such table; ipv6: disabled", FamilyErrors: map[string]string{"ipv4": "no such table", "ipv6": "disabled"}}
	want.Mappings["svc:b"] = contract.AppliedDNAT{Error: "ipv6: disabled", FamilyErrors: map[string]string{"ipv6": "disabled"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("status with family errors\n got %+v\nwant %+v", got, want)
	}
}

func TestWithoutFamilies(t *testing.T) {
	ms := []firewall.Mapping{
		{Name: "dual", TailnetIPs: addrs("100.64.0.1", "fd7a:115c:a1e0::1"), Destinations: addrs("10.96.0.1", "fd00:96::1")},
		// Its IPv6 tailnet IP has no IPv6 destination: IPv6 being off does not concern it.
		{Name: "v4", TailnetIPs: addrs("100.64.0.2", "fd7a:115c:a1e0::2"), Destinations: addrs("10.96.0.2")},
		{Name: "v6", TailnetIPs: addrs("fd7a:115c:a1e0::3"), Destinations: addrs("fd00:96::3")},
	}
	problems := map[string]contract.FamilyProblem{"ipv6": {Reason: contract.FamilyDisabled, Message: "IPv6 is disabled"}}
	errs := map[string]error{}
	got, famErrs := withoutFamilies(ms, problems, errs)
	want := []firewall.Mapping{
		{Name: "dual", TailnetIPs: addrs("100.64.0.1"), Destinations: addrs("10.96.0.1", "fd00:96::1")},
		ms[1],
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mappings\n got %+v\nwant %+v", got, want)
	}
	wantFam := map[string]map[string]string{"dual": {"ipv6": "IPv6 is disabled"}, "v6": {"ipv6": "IPv6 is disabled"}}
	if !reflect.DeepEqual(famErrs, wantFam) {
		t.Errorf("family errors %v, want %v", famErrs, wantFam)
	}
	if err := errs["v6"]; err == nil || err.Error() != "ipv6: IPv6 is disabled" || len(errs) != 1 {
		t.Errorf("errors %v, want only v6's", errs)
	}
	if !slices.Equal(ms[0].TailnetIPs, addrs("100.64.0.1", "fd7a:115c:a1e0::1")) {
		t.Error("the caller's mapping was changed")
	}
	if got, fe := withoutFamilies(ms, nil, errs); !reflect.DeepEqual(got, ms) || fe != nil {
		t.Error("without problems the mappings change")
	}
}
