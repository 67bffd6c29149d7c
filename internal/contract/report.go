package contract

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// A ProxyGroup replica's report (its ProxyState) lists every service it advertises and every
// certificate it serves, so it grows with its group. It is spread over as many Secrets as the
// group has document shards: shard 0 is the state Secret, and holds the scalar keys and, when
// there is more than one shard, a ReportShards index; shard k > 0 is the Secret named
// ReportShardName(state, k). Each entry (an advertised service, a certificate, a Funnel
// status, a DNAT mapping) is in the shard of its service, ShardOf(ReportService(name), count),
// under the same keys as an unsharded report; every shard carries pod_uid, so that a shard
// left by an earlier Pod is not read as current. A report without an index is one Secret, as
// before report shards existed.

// ReportShards is the index of a sharded report, in the state Secret.
type ReportShards struct {
	Version int `json:"version"`
	// Count of Secrets holding the report, the state Secret included.
	Count int `json:"count"`
}

// Validate checks the count.
func (s *ReportShards) Validate() error {
	if s.Count < 1 || s.Count > MaxShards {
		return fmt.Errorf("report shard count %d must be from 1 to %d", s.Count, MaxShards)
	}
	return nil
}

// ReportShardIndexes stores ReportShards documents.
var ReportShardIndexes = codec[ReportShards]{
	name: "report-shards",
	encode: map[int]func(*ReportShards) ([]byte, error){
		1: jsonEncoder(1, func(s *ReportShards, v int) { s.Version = v }),
	},
	decode: map[int]func([]byte) (*ReportShards, error){
		1: jsonDecoder(1, func(s *ReportShards) int { return s.Version }, (*ReportShards).Validate),
	},
}

// ReportShardCount reads the number of shards from a state Secret's data: 1 without an index.
func ReportShardCount(state map[string][]byte) (int, error) {
	return indexCount(ReportShardIndexes, state, func(s *ReportShards) int { return s.Count })
}

// ReportShardName is the Secret holding shard k of the report kept in the state Secret state.
// No Secret of a group ends in "-report<k>": a replica's state Secret ends in its ordinal.
func ReportShardName(state string, k int) string {
	if k == 0 {
		return state
	}
	return fmt.Sprintf("%s-report%d", state, k)
}

// ReportService is the service an entry of the report belongs to: a Tailscale Service name
// ("svc:<name>") as is, a served name by its first label, as the tailnet name of service
// <name> is <name>.<tailnet domain>.
func ReportService(name string) string {
	if strings.HasPrefix(name, "svc:") {
		return name
	}
	label, _, _ := strings.Cut(name, ".")
	return "svc:" + label
}

// shardEntryKeys are the keys whose entries are spread over the shards.
var shardEntryKeys = []string{StateAdvertised, StateCertificates, StateFunnel, StateFirewall}

// SameButEntries reports whether two versions of a state Secret's data differ at most in the
// report's entries (advertised services, certificates, Funnel, DNAT rules): the replica, its
// device, its login and the config version it reads are the same.
func SameButEntries(a, b map[string][]byte) bool {
	entry := func(k string) bool { return slices.Contains(shardEntryKeys, k) }
	for k, v := range a {
		if w, ok := b[k]; !entry(k) && (!ok || !bytes.Equal(v, w)) {
			return false
		}
	}
	for k := range b {
		if _, ok := a[k]; !entry(k) && !ok {
			return false
		}
	}
	return true
}

// SplitReport spreads the state keys data (ProxyState.Data) over count shards, each rendered
// with every key it may hold, empty ones included, so that writing it replaces what it held.
// With count 1 it is data, without an index.
func SplitReport(data map[string][]byte, count int) ([]map[string][]byte, error) {
	first := maps.Clone(data)
	for _, key := range ReportShardIndexes.Keys() {
		first[key] = nil
	}
	if count <= 1 {
		return []map[string][]byte{first}, nil
	}
	st, err := ParseState(data)
	if err != nil {
		return nil, err
	}
	parts := make([]ProxyState, count)
	for k := range parts {
		parts[k].PodUID = st.PodUID
	}
	shard := func(name string) *ProxyState { return &parts[ShardOf(ReportService(name), count)] }
	for _, name := range st.Advertised {
		p := shard(name)
		p.Advertised = append(p.Advertised, name)
	}
	for name, c := range st.Certificates {
		p := shard(name)
		if p.Certificates == nil {
			p.Certificates = map[string]CertificateStatus{}
		}
		p.Certificates[name] = c
	}
	for name, f := range st.Funnel {
		p := shard(name)
		if p.Funnel == nil {
			p.Funnel = map[string]FunnelStatus{}
		}
		p.Funnel[name] = f
	}
	if fw := st.Firewall; fw != nil {
		for k := range parts {
			parts[k].Firewall = &FirewallStatus{Mode: fw.Mode, PodUID: fw.PodUID, Mappings: map[string]AppliedDNAT{}}
		}
		parts[0].Firewall.Families = fw.Families
		for name, m := range fw.Mappings {
			shard(name).Firewall.Mappings[name] = m
		}
	}
	out := make([]map[string][]byte, count)
	for k := range parts {
		d, err := parts[k].Data()
		if err != nil {
			return nil, err
		}
		if k == 0 {
			for _, key := range shardEntryKeys {
				first[key] = d[key]
			}
			idx, err := ReportShardIndexes.Encode(&ReportShards{Count: count})
			if err != nil {
				return nil, err
			}
			maps.Copy(first, idx)
			out[0] = first
			continue
		}
		out[k] = map[string][]byte{StatePodUID: d[StatePodUID]}
		for _, key := range shardEntryKeys {
			out[k][key] = d[key]
		}
	}
	return out, nil
}

// ParseReport reads a report from its shards' data, shards[0] being the state Secret's (nil for
// a shard not found): the state, with the entries of every shard written by the Pod that wrote
// shard 0. Shards beyond the count that shard 0 gives are ignored.
func ParseReport(shards []map[string][]byte) (*ProxyState, error) {
	return ReadReport(shards, func(k int) (*ProxyState, error) { return ParseState(shards[k]) })
}

// ReadReport is ParseReport with shard k's data parsed by parse(k): a reader that keeps each
// shard's parse across reports. ReadReport does not change what parse returns.
func ReadReport(shards []map[string][]byte, parse func(k int) (*ProxyState, error)) (*ProxyState, error) {
	if len(shards) == 0 {
		return nil, errors.New("no state")
	}
	first, err := parse(0)
	if err != nil {
		return nil, err
	}
	count, err := ReportShardCount(shards[0])
	if err != nil {
		return nil, err
	}
	parts := []*ProxyState{first}
	for k := 1; k < min(count, len(shards)); k++ {
		if shards[k] == nil || string(shards[k][StatePodUID]) != first.PodUID {
			continue
		}
		part, err := parse(k)
		if err != nil {
			return nil, fmt.Errorf("report shard %d of %d: %w", k, count, err)
		}
		parts = append(parts, part)
	}
	return mergeReport(parts), nil
}

// mergeReport is the state of parts[0] with the entries of every part, in new maps and slices.
func mergeReport(parts []*ProxyState) *ProxyState {
	st := *parts[0]
	st.Advertised, st.Certificates, st.Funnel = slices.Clone(st.Advertised), maps.Clone(st.Certificates), maps.Clone(st.Funnel)
	if fw := st.Firewall; fw != nil {
		st.Firewall = &FirewallStatus{Mode: fw.Mode, PodUID: fw.PodUID, Families: fw.Families, Mappings: maps.Clone(fw.Mappings)}
	}
	for _, part := range parts[1:] {
		st.Advertised = append(st.Advertised, part.Advertised...)
		st.Certificates = mergeInto(st.Certificates, part.Certificates)
		st.Funnel = mergeInto(st.Funnel, part.Funnel)
		if fw := part.Firewall; fw != nil {
			if st.Firewall == nil {
				st.Firewall = &FirewallStatus{Mode: fw.Mode, PodUID: fw.PodUID}
			}
			st.Firewall.Mappings = mergeInto(st.Firewall.Mappings, fw.Mappings)
		}
	}
	slices.Sort(st.Advertised)
	return &st
}

func mergeInto[V any](into, from map[string]V) map[string]V {
	for k, v := range from {
		if into == nil {
			into = make(map[string]V, len(from))
		}
		into[k] = v
	}
	return into
}
