package contract

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// reportOf is a replica's state with n Ingress services (advertised, with a certificate, every
// third with Funnel) and n L3 services (advertised, with a DNAT mapping).
func reportOf(n int) *ProxyState {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	st := &ProxyState{DeviceID: "n1", FQDN: "pg-0.tailnet.test", TailnetIPs: []string{"100.64.0.1"}, ConfigVersion: 3, PodUID: "pod-1",
		ProxyVersion: "v1", Firewall: &FirewallStatus{Mode: FirewallNFTables, PodUID: "pod-1",
			Families: map[string]FamilyProblem{FamilyIPv6: {Reason: FamilyDisabled, Message: "m"}}}}
	for i := range n {
		web, l3 := fmt.Sprintf("web-%05d", i), fmt.Sprintf("db-%05d", i)
		st.Advertised = append(st.Advertised, "svc:"+web, "svc:"+l3)
		st.Certificates = mergeInto(st.Certificates, map[string]CertificateStatus{web + ".tailnet.test": {Source: CertSourceACME,
			Serial: fmt.Sprintf("%040x", i), NotBefore: now, NotAfter: now.Add(90 * 24 * time.Hour)}})
		if i%3 == 0 {
			st.Funnel = mergeInto(st.Funnel, map[string]FunnelStatus{web + ".tailnet.test": {Public: true}})
		}
		st.Firewall.Mappings = mergeInto(st.Firewall.Mappings, map[string]AppliedDNAT{"svc:" + l3: {
			TailnetIPs: []string{"100.100.0.1", "fd7a:115c:a1e0::1"}, Destinations: []string{"10.96.0.1"}}})
	}
	slices.Sort(st.Advertised)
	return st
}

func mustData(t *testing.T, st *ProxyState) map[string][]byte {
	t.Helper()
	d, err := st.Data()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSplitReport(t *testing.T) {
	byo := reportOf(3)
	byo.Certificates["shop.example.com"] = CertificateStatus{Reason: CertReasonSecretInvalid, Message: "m"}
	noFirewall := reportOf(4)
	noFirewall.Firewall = nil
	for _, tc := range []struct {
		name  string
		state *ProxyState
		count int
	}{
		{"one shard", reportOf(20), 1},
		{"two shards", reportOf(20), 2},
		{"a count that is not a power of two", reportOf(20), 3},
		{"more shards than services", reportOf(2), 16},
		{"the most shards", reportOf(200), MaxShards},
		{"a bring-your-own host", byo, 4},
		{"no firewall", noFirewall, 4},
		{"nothing to report yet", &ProxyState{PodUID: "pod-1"}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := mustData(t, tc.state)
			orig := maps.Clone(data)
			shards, err := SplitReport(data, tc.count)
			if err != nil {
				t.Fatal(err)
			}
			if !equalData(data, orig) {
				t.Error("SplitReport changed its argument")
			}
			if len(shards) != tc.count {
				t.Fatalf("%d shards; want %d", len(shards), tc.count)
			}
			if n, err := ReportShardCount(shards[0]); n != tc.count || err != nil {
				t.Errorf("the index says %d, %v; want %d", n, err, tc.count)
			}
			for k, sh := range shards[1:] {
				if got := slices.Sorted(maps.Keys(sh)); !slices.Equal(got, slices.Sorted(slices.Values(append([]string{StatePodUID}, shardEntryKeys...)))) {
					t.Errorf("shard %d holds keys %v: not every key it may hold, nor only those", k+1, got)
				}
			}
			// Every entry is in the shard of its service, and the shards say what the state does.
			for k, sh := range shards {
				part, err := ParseState(sh)
				if err != nil {
					t.Fatal(err)
				}
				for _, name := range part.Advertised {
					if ShardOf(ReportService(name), tc.count) != k {
						t.Errorf("%s is in shard %d", name, k)
					}
				}
				for name := range part.Certificates {
					if ShardOf(ReportService(name), tc.count) != k {
						t.Errorf("certificate of %s is in shard %d", name, k)
					}
				}
			}
			got, err := ParseReport(shards)
			if err != nil {
				t.Fatal(err)
			}
			if want := mustData(t, tc.state); !equalData(mustData(t, got), want) && !emptyMappingsOnly(t, got, tc.state) {
				t.Errorf("merged report differs:\n got %q\nwant %q", mustData(t, got), want)
			}
		})
	}
}

// emptyMappingsOnly reports whether got and want differ only in a firewall status without
// mappings being read back with an empty rather than a nil map.
func emptyMappingsOnly(t *testing.T, got, want *ProxyState) bool {
	if got.Firewall == nil || want.Firewall == nil || len(want.Firewall.Mappings) > 0 || len(got.Firewall.Mappings) > 0 {
		return false
	}
	g := *got.Firewall
	g.Mappings = nil
	cp := *got
	cp.Firewall = &g
	return equalData(mustData(t, &cp), mustData(t, want))
}

func TestSplitReportBounded(t *testing.T) {
	// 5,000 Ingress and 5,000 L3 services in one Secret pass the 1 MiB Secret limit; spread over
	// the 32 shards their documents take, no shard comes near 256 KiB.
	data := mustData(t, reportOf(5000))
	if size := dataBytes(data); size < 1<<20 {
		t.Fatalf("the unsharded report of 10,000 services is %d bytes; the test wants one over 1 MiB", size)
	}
	shards, err := SplitReport(data, 32)
	if err != nil {
		t.Fatal(err)
	}
	for k, sh := range shards {
		if size := dataBytes(sh); size > 64<<10 {
			t.Errorf("shard %d holds %d bytes", k, size)
		}
	}
}

func dataBytes(data map[string][]byte) int {
	n := 0
	for k, v := range data {
		n += len(k) + len(v)
	}
	return n
}

func TestParseReport(t *testing.T) {
	st := reportOf(30)
	shards, err := SplitReport(mustData(t, st), 4)
	if err != nil {
		t.Fatal(err)
	}
	full := len(st.Advertised)
	advertised := func(shards []map[string][]byte) int {
		t.Helper()
		got, err := ParseReport(shards)
		if err != nil {
			t.Fatal(err)
		}
		return len(got.Advertised)
	}
	inShard := func(k int) int {
		part, err := ParseState(shards[k])
		if err != nil {
			t.Fatal(err)
		}
		return len(part.Advertised)
	}
	stale := slices.Clone(shards)
	stale[2] = maps.Clone(shards[2])
	stale[2][StatePodUID] = []byte("pod-0")
	missing := slices.Clone(shards)
	missing[3] = nil
	for _, tc := range []struct {
		name   string
		shards []map[string][]byte
		want   int
	}{
		{"every shard", shards, full},
		{"a shard left by an earlier Pod is not read", stale, full - inShard(2)},
		{"a shard not found", missing, full - inShard(3)},
		{"fewer shards given than counted", shards[:2], inShard(0) + inShard(1)},
		{"an unsharded report (no index) reads shard 0 only", append([]map[string][]byte{withoutIndex(shards[0])}, shards[1:]...), inShard(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := advertised(tc.shards); got != tc.want {
				t.Errorf("%d advertised; want %d", got, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name  string
		edit  func([]map[string][]byte)
		error string
	}{
		{"an index of a newer version only", func(s []map[string][]byte) {
			s[0] = withoutIndex(s[0])
			s[0]["report-shards.v2.json"] = []byte(`{"version":2,"count":4}`)
		}, "no supported schema version"},
		{"a count out of range", func(s []map[string][]byte) { s[0]["report-shards.v1.json"] = []byte(`{"version":1,"count":65}`) }, "from 1 to 64"},
		{"a broken shard", func(s []map[string][]byte) { s[1][StateCertificates] = []byte("{") }, "report shard 1 of 4: state key certificates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := make([]map[string][]byte, len(shards))
			for k := range shards {
				broken[k] = maps.Clone(shards[k])
			}
			tc.edit(broken)
			if _, err := ParseReport(broken); err == nil || !strings.Contains(err.Error(), tc.error) {
				t.Errorf("error %v; want one saying %q", err, tc.error)
			}
		})
	}
	if ReportShardName("pg-0", 0) != "pg-0" || ReportShardName("pg-0", 3) != "pg-0-report3" {
		t.Error("report shard names")
	}
	if ReportService("svc:web") != "svc:web" || ReportService("web.tailnet.test") != "svc:web" || ReportService("*.example.com") != "svc:*" {
		t.Error("services of report entries")
	}
}

func withoutIndex(data map[string][]byte) map[string][]byte {
	out := maps.Clone(data)
	for _, k := range ReportShardIndexes.Keys() {
		delete(out, k)
	}
	return out
}

// A reader that keeps each shard's parse hands the same parts to every report it reads: a
// report must not change them.
func TestReadReportLeavesPartsAlone(t *testing.T) {
	shards, err := SplitReport(mustData(t, reportOf(30)), 3)
	if err != nil {
		t.Fatal(err)
	}
	parts := make([]*ProxyState, len(shards))
	for k := range shards {
		if parts[k], err = ParseState(shards[k]); err != nil {
			t.Fatal(err)
		}
	}
	before := make([]string, len(parts))
	for k, p := range parts {
		before[k] = fmt.Sprintf("%+v %+v", *p, p.Firewall)
	}
	kept := func(k int) (*ProxyState, error) { return parts[k], nil }
	first, err := ReadReport(shards, kept)
	if err != nil {
		t.Fatal(err)
	}
	second, err := ReadReport(shards, kept)
	if err != nil {
		t.Fatal(err)
	}
	for k, p := range parts {
		if got := fmt.Sprintf("%+v %+v", *p, p.Firewall); got != before[k] {
			t.Errorf("part %d changed by reading the report:\n%s\nwas\n%s", k, got, before[k])
		}
	}
	if !reflect.DeepEqual(first, second) || len(first.Advertised) != len(reportOf(30).Advertised) {
		t.Errorf("two reads of the same parts differ or miss entries: %d and %d advertised", len(first.Advertised), len(second.Advertised))
	}
	if want, err := ParseReport(shards); err != nil || !reflect.DeepEqual(first, want) {
		t.Errorf("ReadReport differs from ParseReport (%v)", err)
	}
}

func TestSameButEntries(t *testing.T) {
	base := func() map[string][]byte {
		return map[string][]byte{StatePodUID: []byte("pod"), StateDeviceFQDN: []byte("pg-0.tailnet.test"),
			StateAdvertised: []byte(`["svc:a"]`), StateCertificates: []byte(`{}`)}
	}
	for name, c := range map[string]struct {
		change func(map[string][]byte)
		same   bool
	}{
		"nothing":                {func(map[string][]byte) {}, true},
		"advertised":             {func(d map[string][]byte) { d[StateAdvertised] = []byte(`["svc:a","svc:b"]`) }, true},
		"every entry key gone":   {func(d map[string][]byte) { delete(d, StateAdvertised); delete(d, StateCertificates) }, true},
		"a DNAT rule, new key":   {func(d map[string][]byte) { d[StateFirewall] = []byte(`{}`) }, true},
		"the Pod":                {func(d map[string][]byte) { d[StatePodUID] = []byte("other") }, false},
		"a key added":            {func(d map[string][]byte) { d["_current-profile"] = []byte("p") }, false},
		"a key removed":          {func(d map[string][]byte) { delete(d, StateDeviceFQDN) }, false},
		"the Pod and the report": {func(d map[string][]byte) { d[StatePodUID], d[StateAdvertised] = []byte("x"), nil }, false},
	} {
		t.Run(name, func(t *testing.T) {
			b := base()
			c.change(b)
			if got := SameButEntries(base(), b); got != c.same {
				t.Errorf("SameButEntries = %v, want %v", got, c.same)
			}
			if got := SameButEntries(b, base()); got != c.same {
				t.Errorf("SameButEntries, the other way = %v, want %v", got, c.same)
			}
		})
	}
}
