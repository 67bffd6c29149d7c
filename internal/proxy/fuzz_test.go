package proxy

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/l3"
	"github.com/tsingress/tsingress/internal/proxy/web"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// FuzzGroupDocuments reads a ProxyGroup ConfigMap's data as a replica does (any keys, any
// values: the ConfigMap may be edited by hand) and turns what it accepts into what the replica
// serves: routers for the Serve config, forwarder mappings for the DNAT config. Nothing may
// panic, and whatever is accepted must be usable.
func FuzzGroupDocuments(f *testing.F) {
	serve, err := contract.ServeConfigs.Encode(&contract.ServeConfig{Services: map[string]contract.WebService{
		"svc:web": {HTTP: contract.HTTPRedirect, Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix,
			Backend: contract.Backend{URL: "http://10.96.0.1:80", Endpoints: []string{"10.244.0.1:8080"}}}},
			TLS: contract.WebTLS{Certificates: []contract.CertificateRef{{SecretName: "c", Hosts: []string{"a.example.com"}}}}},
	}})
	if err != nil {
		f.Fatal(err)
	}
	dnat, err := contract.DNATConfigs.Encode(&contract.DNATConfig{Services: map[string]contract.DNATService{
		"svc:db": {VIPs: []string{"100.100.0.1", "fd7a:115c:a1e0::1"}, Destination: contract.Destination{IPs: []string{"10.96.0.5"}}},
	}})
	if err != nil {
		f.Fatal(err)
	}
	add := func(data map[string][]byte) {
		strs := map[string]string{}
		for k, v := range data {
			strs[k] = string(v)
		}
		b, err := json.Marshal(strs)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	both := map[string][]byte{}
	for _, m := range []map[string][]byte{serve, dnat} {
		for k, v := range m {
			both[k] = v
		}
	}
	add(both)
	add(map[string][]byte{"serve-config.v9.json": []byte(`{"version":9}`), "dnat-config.v1.json": []byte(`{"version":1,"services":{"svc:x":{"vips":["::ffff:100.64.0.1"],"destination":{"dnsName":"x.example.com"}}}}`)})
	add(map[string][]byte{"serve-config.v1.json": []byte(`garbage`), "owners": []byte(`{}`)})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var strs map[string]string
		if json.Unmarshal(raw, &strs) != nil {
			return
		}
		data := map[string][]byte{}
		for k, v := range strs {
			data[k] = []byte(v)
		}
		docs := contract.MergeShards([]map[string][]byte{data})
		if doc, err := docs.Serve, docs.ServeErr; err == nil {
			for name, ws := range doc.Services {
				rt := web.NewRouter(ws.Routes)
				for _, r := range ws.Routes {
					if _, ok := rt.Match(proxytest.RequestFor(r.Host, r)); !ok && !contract.IsWildcard(r.Host) {
						t.Errorf("%s: route %+v does not serve its own path", name, r)
					}
				}
				for _, n := range byoNames(ws) {
					if n == "" {
						t.Errorf("%s: a certificate Secret without a name", name)
					}
				}
			}
		} else if doc != nil {
			t.Fatalf("a Serve document and an error: %v", err)
		}
		doc, err := docs.DNAT, docs.DNATErr
		if err != nil {
			return
		}
		mappings := dnatMappings(*doc)
		if len(mappings) != len(doc.Services) {
			t.Fatalf("%d mappings of %d services", len(mappings), len(doc.Services))
		}
		for _, m := range mappings {
			svc := doc.Services[m.Name]
			if len(m.TailnetIPs) != len(svc.VIPs) || len(m.TailnetIPs) == 0 {
				t.Fatalf("mapping %s has tailnet IPs %v for VIPs %v", m.Name, m.TailnetIPs, svc.VIPs)
			}
			for i, ip := range m.TailnetIPs {
				if want := netip.MustParseAddr(svc.VIPs[i]); ip != want {
					t.Fatalf("mapping %s: VIP %s became %s", m.Name, svc.VIPs[i], ip)
				}
			}
		}
		if !slices.IsSortedFunc(mappings, func(a, b l3.Mapping) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatalf("mappings out of order")
		}
	})
}
