package groupstore

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// An entry removed from one document keeps its owner while the other document has it.
func TestGroupContentOwners(t *testing.T) {
	g := decodeGroup(&corev1.ConfigMap{})
	ws := &contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://a:80"}}}}
	m := &contract.DNATService{VIPs: []string{"100.100.0.1"}, Destination: contract.Destination{IPs: []string{"10.0.0.1"}}}
	g.setServe("svc:a", ws, "Ingress/ns/a")
	g.setDNAT("svc:a", m, "Ingress/ns/a")
	g.setServe("svc:a", nil, "")
	if g.owners["svc:a"] != "Ingress/ns/a" || !g.has("svc:a") {
		t.Errorf("after removing the Serve entry: owner %q, has %t", g.owners["svc:a"], g.has("svc:a"))
	}
	g.setDNAT("svc:a", nil, "")
	if _, ok := g.owners["svc:a"]; ok || g.has("svc:a") {
		t.Errorf("after removing both: owners %v", g.owners)
	}

	// What encode writes decodes to the same content, and a clone is independent.
	g.setServe("svc:b", ws, "Ingress/ns/b")
	data, _, err := g.encode()
	if err != nil {
		t.Fatal(err)
	}
	back := decodeGroup(&corev1.ConfigMap{Data: data})
	if !back.has("svc:b") || back.owners["svc:b"] != "Ingress/ns/b" {
		t.Errorf("round trip lost svc:b: %+v", back)
	}
	c := back.clone()
	c.setServe("svc:c", ws, "Ingress/ns/c")
	if back.has("svc:c") {
		t.Error("a change of a clone reached the original")
	}
}

func TestChangedServices(t *testing.T) {
	secret := func(st contract.ProxyState) *corev1.Secret {
		data, err := st.Data()
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.Secret{Data: data}
	}
	now := time.Now().UTC().Truncate(time.Second)
	base := contract.ProxyState{DeviceID: "n1", FQDN: "pg-0.tailnet.test", PodUID: "u1", Advertised: []string{"svc:a", "svc:b"},
		Certificates: map[string]contract.CertificateStatus{"a.tailnet.test": {Source: "acme", Serial: "01", NotBefore: now, NotAfter: now.Add(time.Hour)}}}
	changed := base
	changed.Advertised = []string{"svc:b", "svc:c"}
	changed.Certificates = map[string]contract.CertificateStatus{"a.tailnet.test": {Source: "acme", Serial: "02", NotBefore: now, NotAfter: now.Add(time.Hour)}}
	names, all := changedServices(&proxies.Reports{}, secret(base), secret(changed), true)
	if all || len(names) != 2 || names[0] != "svc:a" || names[1] != "svc:c" {
		t.Errorf("changed services = %v (all %t), want [svc:a svc:c]", names, all)
	}
	if names, all := changedServices(&proxies.Reports{}, secret(base), secret(base), true); all || len(names) != 0 {
		t.Errorf("same report: %v (all %t), want none", names, all)
	}
	funnel := base
	funnel.Funnel = map[string]contract.FunnelStatus{"b.tailnet.test": {Public: true}}
	if names, all := changedServices(&proxies.Reports{}, secret(base), secret(funnel), true); all || !slices.Equal(names, []string{"svc:b"}) {
		t.Errorf("Funnel on for b: %v (all %t), want [svc:b]", names, all)
	}
	restarted := base
	restarted.PodUID = "u2"
	if _, all := changedServices(&proxies.Reports{}, secret(base), secret(restarted), true); !all {
		t.Error("a new Pod's report must concern every object")
	}
	// Another shard of the report: a new Pod's first write concerns the entries it changed.
	restarted.Advertised = []string{"svc:a"}
	if names, all := changedServices(&proxies.Reports{}, secret(base), secret(restarted), false); all || !slices.Equal(names, []string{"svc:b"}) {
		t.Errorf("a report shard written by a new Pod: %v (all %t), want [svc:b]", names, all)
	}
}

// A group ConfigMap changed by anyone but the writer concerns the owners of the entries that
// changed, in either version: garbage in a document brings back every owner of its entries.
func TestEntriesChanged(t *testing.T) {
	ws := func(url string) *contract.WebService {
		return &contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: url}}}}
	}
	m := &contract.DNATService{VIPs: []string{"100.100.0.1"}, Destination: contract.Destination{IPs: []string{"10.0.0.1"}}}
	base := decodeGroup(&corev1.ConfigMap{})
	base.setServe("svc:a", ws("http://a:80"), "Ingress/ns/a")
	base.setServe("svc:b", ws("http://b:80"), "Ingress/ns/b")
	base.setDNAT("svc:d", m, "Service/ns/d")
	data, _, err := base.encode()
	if err != nil {
		t.Fatal(err)
	}
	garbled := map[string]string{}
	for k, v := range data {
		garbled[k] = v
	}
	for _, k := range contract.ServeConfigs.Keys() {
		if _, ok := garbled[k]; ok {
			garbled[k] = "garbage"
		}
	}
	edited := base.clone()
	edited.setServe("svc:b", ws("http://elsewhere:80"), "Ingress/ns/b")
	for name, tc := range map[string]struct {
		cur  *groupContent
		kind string
		want []string
	}{
		"same":               {base.clone(), "Ingress", nil},
		"serve garbage":      {decodeGroup(&corev1.ConfigMap{Data: garbled}), "Ingress", []string{"ns/a", "ns/b"}},
		"serve garbage, L3":  {decodeGroup(&corev1.ConfigMap{Data: garbled}), "Service", nil},
		"one entry edited":   {edited, "Ingress", []string{"ns/b"}},
		"everything dropped": {decodeGroup(&corev1.ConfigMap{}), "Service", []string{"ns/d"}},
	} {
		var got []string
		for _, r := range (groupEvents{Kind: tc.kind}).entriesChanged(base, tc.cur) {
			got = append(got, r.String())
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

// A group document edited into garbage does not make the replicas withdraw what it served: the
// owner index stands in for it until it is written again.
func TestGroupServicesUnreadableDocument(t *testing.T) {
	g := decodeGroup(&corev1.ConfigMap{})
	g.setServe("svc:web", &contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix,
		Backend: contract.Backend{URL: "http://web:80"}}}}, "Ingress/ns/web")
	g.setDNAT("svc:db", &contract.DNATService{VIPs: []string{"100.100.0.1"}, Destination: contract.Destination{IPs: []string{"10.0.0.1"}}}, "Service/ns/db")
	data, _, err := g.encode()
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{Data: data}
	if got := groupServices([]map[string][]byte{contract.ConfigMapBytes(cm.Data)}); !slices.Equal(got, []string{"svc:db", "svc:web"}) {
		t.Fatalf("readable documents: %v", got)
	}
	for _, k := range contract.ServeConfigs.Keys() {
		if _, ok := cm.Data[k]; ok {
			cm.Data[k] = "garbage"
		}
	}
	if got := groupServices([]map[string][]byte{contract.ConfigMapBytes(cm.Data)}); !slices.Equal(got, []string{"svc:db", "svc:web"}) {
		t.Errorf("Serve config overwritten with garbage: %v, want both services kept", got)
	}
}
