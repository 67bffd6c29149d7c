package contract

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestDestinationProxyProtocolValidation(t *testing.T) {
	tcp := func(p uint16) Port { return Port{Port: p, Protocol: "TCP"} }
	udp := func(p uint16) Port { return Port{Port: p, Protocol: "UDP"} }
	for name, tc := range map[string]struct {
		version int
		ports   []Port
		wantErr string
	}{
		"none":                {0, nil, ""},
		"v1 TCP":              {1, []Port{tcp(5432)}, ""},
		"v2 TCP and UDP":      {2, []Port{tcp(53), udp(53)}, ""},
		"ports without relay": {0, []Port{tcp(80)}, "only with a PROXY protocol version"},
		"version 3":           {3, []Port{tcp(80)}, "must be 1 or 2"},
		"no ports":            {2, nil, "needs ports"},
		"v1 UDP":              {1, []Port{udp(53)}, "v1 has no UDP form"},
		"SCTP":                {2, []Port{{Port: 9, Protocol: "SCTP"}}, "must be TCP or UDP"},
		"port 0":              {2, []Port{tcp(0)}, "port 0"},
		"twice":               {2, []Port{tcp(80), tcp(80)}, "twice"},
	} {
		t.Run(name, func(t *testing.T) {
			d := Destination{IPs: []string{"10.96.0.5"}, ProxyProtocol: tc.version, Ports: tc.ports}
			err := d.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// A relay is written only in the versions that know it: an older proxy would DNAT the
// connections without the header their backend expects, so it must fail to read the document.
func TestProxyProtocolOnlyInNewestVersions(t *testing.T) {
	relay := Destination{IPs: []string{"10.96.0.5"}, ProxyProtocol: 2, Ports: []Port{{Port: 5432, Protocol: "TCP"}}}
	cfg := &ProxyConfig{Kind: KindService, Hostname: "db", StateSecret: "db", Forward: &relay}
	data, err := ProxyConfigs.Encode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values([]string{"proxy-config.v7.json", ProxyConfigs.key(newestProxyConfig)}))
	if got := slices.Sorted(maps.Keys(data)); !slices.Equal(got, want) {
		t.Errorf("a relaying service proxy's config written as %v, want %v", got, want)
	}
	if _, _, err := readerUpTo(6).Decode(data); !errors.Is(err, ErrNoSupportedVersion) {
		t.Errorf("a v6 reader: err = %v, want ErrNoSupportedVersion", err)
	}
	got, _, err := ProxyConfigs.Decode(data)
	if err != nil || got.Forward.ProxyProtocol != 2 || !slices.Equal(got.Forward.Ports, relay.Ports) {
		t.Errorf("round trip: %+v %v", got, err)
	}
	cfg.Forward = &Destination{IPs: []string{"10.96.0.5"}}
	if data, err = ProxyConfigs.Encode(cfg); err != nil || len(data) != 2 || data["proxy-config.v1.json"] == nil {
		t.Errorf("a plain service proxy's config written as %v (%v), want v1 and v7", slices.Sorted(maps.Keys(data)), err)
	}

	dnat := &DNATConfig{Services: map[string]DNATService{
		"svc:plain": {VIPs: []string{"100.100.0.1"}, Destination: Destination{IPs: []string{"10.96.0.6"}}},
	}}
	if data, err = DNATConfigs.Encode(dnat); err != nil || len(data) != 2 {
		t.Errorf("a DNAT document without a relay written as %v (%v), want v1 and v2", slices.Sorted(maps.Keys(data)), err)
	}
	dnat.Services["svc:db"] = DNATService{VIPs: []string{"100.100.0.2"}, Destination: relay}
	data, err = DNATConfigs.Encode(dnat)
	if got := slices.Sorted(maps.Keys(data)); err != nil || !slices.Equal(got, []string{"dnat-config.v2.json"}) {
		t.Errorf("a DNAT document with a relay written as %v (%v), want v2 alone", got, err)
	}
	gotD, v, err := DNATConfigs.Decode(data)
	if err != nil || v != 2 || gotD.Services["svc:db"].Destination.ProxyProtocol != 2 {
		t.Errorf("round trip: v%d %+v %v", v, gotD, err)
	}
	udp := relay
	udp.Ports = []Port{{Port: 53, Protocol: "UDP"}}
	dnat.Services["svc:dns"] = DNATService{VIPs: []string{"100.100.0.3"}, Destination: udp}
	if err := dnat.Validate(); err == nil || !strings.Contains(err.Error(), "TCP ports only") {
		t.Errorf("a DNAT document relaying UDP: %v, want refused", err)
	}
}
