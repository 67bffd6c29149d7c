package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// The decoders read what another process wrote, possibly a broken or hostile writer (a hand
// edit, an older or newer build). For any input they must return a document or an error, never
// panic, and a document they accept must survive the writer: encoding it and reading it back
// gives the same document.
// `go test` runs the seeds below and testdata/fuzz; `make fuzz` explores further.

func FuzzProxyConfigs(f *testing.F) {
	for _, cfg := range []*ProxyConfig{
		validIngressConfig(),
		{Kind: KindService, Hostname: "db", StateSecret: "s", Forward: &Destination{IPs: []string{"10.96.0.10", "fd00::10"}}},
		{Kind: KindService, Hostname: "ext", StateSecret: "s", Forward: &Destination{DNSName: "db.example.com."}},
		{Kind: KindProxyGroup, Hostname: "pg-1", StateSecret: "pg-1", TLS: TLSConfig{CertShareMode: CertReader}, AdvertiseServices: []string{"svc:web"}},
		{Kind: KindIngress, Hostname: "w", StateSecret: "s", Serve: &WebService{Routes: []Route{
			{Host: "*.example.com", Path: "/", PathType: PathPrefix, Backend: Backend{URL: "https://[fd00::1]:443", Endpoints: []string{"[fd00::2]:8443"}}},
		}, TLS: WebTLS{Certificates: []CertificateRef{{SecretName: "c", Hosts: []string{"*.example.com"}}}}}},
	} {
		data, err := ProxyConfigs.Encode(cfg)
		if err != nil {
			f.Fatal(err)
		}
		for k, v := range data {
			f.Add(versionOf(f, k), v)
		}
	}
	f.Add(9, []byte(`{"version":9,"kind":"ingress"}`))
	f.Add(1, []byte(`{"version":1,"kind":"service","hostname":"a","stateSecret":"s","forward":{"ips":["1.2.3.4"],"dnsName":"x"}}`))
	f.Fuzz(func(t *testing.T, version int, doc []byte) {
		cfg := fuzzRoundTrip(t, ProxyConfigs, "proxy-config", version, doc)
		if cfg == nil {
			return
		}
		if cfg.AuthKey != "" {
			// The key must not shape what a logger prints, whatever else the document holds.
			other := *cfg
			other.AuthKey = cfg.AuthKey + "x"
			if cfg.String() != other.String() || fmt.Sprintf("%v", cfg.Redacted()) != fmt.Sprintf("%v", other.Redacted()) {
				t.Errorf("the auth key shows in the printed config: %s", cfg)
			}
		}
	})
}

func FuzzServeConfigs(f *testing.F) {
	for _, doc := range []*ServeConfig{
		{Services: map[string]WebService{"svc:web": validIngressConfig().Serve.withHold()}},
		{Services: map[string]WebService{"svc:wild": {HTTP: HTTPServe, Routes: []Route{
			{Host: "*.example.com", Path: "/a", PathType: PathExact, Backend: Backend{URL: "http://10.0.0.1:80"}},
		}}}},
		{Services: map[string]WebService{}},
	} {
		data, err := ServeConfigs.Encode(doc)
		if err != nil {
			f.Fatal(err)
		}
		for k, v := range data {
			f.Add(versionOf(f, k), v)
		}
	}
	f.Add(2, []byte(`{"version":2,"services":{"svc:a":{"routes":[{"path":"/","pathType":"Prefix","backend":{"url":"http://h:1"}}],"tls":{"hold":{"reason":"r","until":"2026-01-01T00:00:00+01:00"}}}}}`))
	f.Add(1, []byte(`{"version":1,"services":{"svc:a":{"routes":[{"path":"/","pathType":"Prefix","backend":{"url":"http://[::1%25eth0]:80"}}]}}}`))
	f.Fuzz(func(t *testing.T, version int, doc []byte) {
		fuzzRoundTrip(t, ServeConfigs, "serve-config", version, doc)
	})
}

func FuzzDNATConfigs(f *testing.F) {
	data, err := DNATConfigs.Encode(&DNATConfig{Services: map[string]DNATService{
		"svc:db":  {VIPs: []string{"100.100.0.1", "fd7a:115c:a1e0::1"}, Destination: Destination{IPs: []string{"10.96.0.5"}}},
		"svc:ext": {VIPs: []string{"100.100.0.2"}, Destination: Destination{DNSName: "db.example.com"}},
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(1, data["dnat-config.v1.json"])
	f.Add(1, []byte(`{"version":1,"services":{"svc:x":{"vips":["::ffff:1.2.3.4","fe80::1%eth0"],"destination":{"ips":["0.0.0.0"]}}}}`))
	f.Add(2, []byte(`{"version":2,"services":null}`))
	f.Fuzz(func(t *testing.T, version int, doc []byte) {
		fuzzRoundTrip(t, DNATConfigs, "dnat-config", version, doc)
	})
}

// FuzzParseState reads a state Secret, which the proxy writes and the operator reads; the bytes
// are a JSON object of key → value as strings.
func FuzzParseState(f *testing.F) {
	st := &ProxyState{DeviceID: "n1", FQDN: "web.tailnet.test.", TailnetIPs: []string{"100.64.0.1"}, ConfigVersion: 3,
		Firewall:     &FirewallStatus{Mode: FirewallNFTables, Mappings: map[string]AppliedDNAT{StandaloneMapping: {Error: "e"}}},
		Certificates: map[string]CertificateStatus{"a": {Serial: "0a", Reason: CertReasonIssuanceHeld}}}
	data, err := st.Data()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(stateJSON(f, data))
	f.Add([]byte(`{"config_version":"-1","device_ips":"null","firewall_status":"{}","certificates":"{\"x\":{\"notAfter\":\"2026-01-01T00:00:00+05:00\"}}"}`))
	f.Add([]byte(`{"device_fqdn":"..","advertised_services":"[\"\"]"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		data, ok := secretData(raw)
		if !ok {
			return
		}
		st, err := ParseState(data)
		if err != nil {
			return
		}
		// What the operator read, written back by a proxy, reads the same.
		once := mustStateData(t, st)
		again, err := ParseState(once)
		if err != nil {
			t.Fatalf("state written from a parsed state does not parse: %v\n%q", err, once)
		}
		if twice := mustStateData(t, again); !equalData(once, twice) {
			t.Errorf("state changes on a second round trip:\n%q\n%q", once, twice)
		}
	})
}

// fuzzRoundTrip decodes doc stored as version, and for a document the decoder accepts checks
// that encoding it and decoding the result give it back. It returns the document, if any.
func fuzzRoundTrip[T any](t *testing.T, c codec[T], name string, version int, doc []byte) *T {
	if version < 1 || version > 999 {
		return nil
	}
	data := map[string][]byte{fmt.Sprintf("%s.v%d.json", name, version): doc}
	got, v, err := c.Decode(data)
	if err != nil {
		if got != nil {
			t.Fatalf("Decode returned a document and an error: %v", err)
		}
		if !errors.Is(err, ErrNoSupportedVersion) && v != version {
			t.Fatalf("error for version %d names version %d: %v", version, v, err)
		}
		return nil
	}
	encoded, err := c.Encode(got)
	if err != nil {
		t.Fatalf("a document the decoder accepted cannot be encoded: %v", err)
	}
	back, _, err := c.Decode(encoded)
	if err != nil {
		t.Fatalf("the encoded document does not decode: %v\n%s", err, encoded)
	}
	// Compared as JSON, without the version field, which Encode sets: times read from JSON
	// differ in their location pointers only.
	if a, b := jsonWithoutVersion(t, got), jsonWithoutVersion(t, back); !bytes.Equal(a, b) {
		t.Errorf("round trip changed the document:\n got %s\nwant %s", b, a)
	}
	// Every version written must be understood by this build, and say the same.
	for k, b := range encoded {
		one, _, err := c.Decode(map[string][]byte{k: b})
		if err != nil {
			t.Fatalf("written key %s alone does not decode: %v", k, err)
		}
		if a, b := jsonWithoutVersion(t, got), jsonWithoutVersion(t, one); !bytes.Equal(a, b) {
			t.Errorf("key %s says something else:\n got %s\nwant %s", k, b, a)
		}
	}
	return got
}

func jsonWithoutVersion(t *testing.T, doc any) []byte {
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "version")
	// Nor a replica's list of services, which v4 does not write: its replicas advertise their
	// group's documents (TestGroupConfigV4AdvertisesDocuments).
	if m["kind"] == string(KindProxyGroup) {
		delete(m, "advertiseServices")
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func versionOf(f *testing.F, key string) int {
	var v int
	if _, err := fmt.Sscanf(key[strings.LastIndex(key, ".v")+2:], "%d.json", &v); err != nil {
		f.Fatalf("key %s: %v", key, err)
	}
	return v
}

// secretData reads a fuzzed Secret's data: a JSON object of key → value as strings.
func secretData(raw []byte) (map[string][]byte, bool) {
	var strs map[string]string
	if json.Unmarshal(raw, &strs) != nil {
		return nil, false
	}
	data := map[string][]byte{}
	for k, v := range strs {
		data[k] = []byte(v)
	}
	return data, true
}

func stateJSON(f *testing.F, data map[string][]byte) []byte {
	strs := map[string]string{}
	for k, v := range data {
		strs[k] = string(v)
	}
	b, err := json.Marshal(strs)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

func mustStateData(t *testing.T, st *ProxyState) map[string][]byte {
	d, err := st.Data()
	if err != nil {
		t.Fatalf("Data of a parsed state: %v", err)
	}
	return d
}

func equalData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

func (w *WebService) withHold() WebService {
	cp := *w
	cp.TLS.Hold = &IssuanceHold{Reason: "DuplicateCertificateLimit", Message: "m"}
	return cp
}

// FuzzParseReport reads a report of two shards, which a replica writes and the operator
// reads; each is a JSON object of key → value as strings.
func FuzzParseReport(f *testing.F) {
	st := &ProxyState{PodUID: "p", Advertised: []string{"svc:a", "svc:b"},
		Firewall:     &FirewallStatus{Mode: FirewallNFTables, PodUID: "p", Mappings: map[string]AppliedDNAT{"svc:b": {Error: "e"}}},
		Certificates: map[string]CertificateStatus{"a.t.test": {Serial: "0a"}}}
	data, err := st.Data()
	if err != nil {
		f.Fatal(err)
	}
	shards, err := SplitReport(data, 2)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(stateJSON(f, shards[0]), stateJSON(f, shards[1]))
	f.Add([]byte(`{"pod_uid":"p","report-shards.v1.json":"{\"version\":1,\"count\":2}"}`), []byte(`{"pod_uid":"p","firewall_status":"{\"mappings\":null}","funnel":"{\"x\":{}}"}`))
	f.Add([]byte(`{"report-shards.v1.json":"{\"version\":1,\"count\":0}"}`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, raw0, raw1 []byte) {
		var shards []map[string][]byte
		for _, raw := range [][]byte{raw0, raw1} {
			data, ok := secretData(raw)
			if !ok {
				return
			}
			shards = append(shards, data)
		}
		st, err := ParseReport(shards)
		if err != nil {
			return
		}
		// What the operator read, written back by a replica over any count, reads the same.
		resplit := func(st *ProxyState, count int) *ProxyState {
			s, err := SplitReport(mustStateData(t, st), count)
			if err != nil {
				t.Fatalf("a parsed report does not split: %v", err)
			}
			back, err := ParseReport(s)
			if err != nil {
				t.Fatalf("a split report does not parse: %v\n%q", err, s)
			}
			return back
		}
		once := resplit(st, 2)
		for _, count := range []int{1, 2, 5} {
			if a, b := mustStateData(t, once), mustStateData(t, resplit(once, count)); !equalData(a, b) {
				t.Errorf("report changes when split over %d:\n%q\n%q", count, a, b)
			}
		}
	})
}
