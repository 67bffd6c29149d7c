package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// newestProxyConfig is the newest proxy config version this build writes.
const newestProxyConfig = 10

func TestNewest(t *testing.T) {
	if v := ProxyConfigs.Newest(); v != newestProxyConfig {
		t.Errorf("ProxyConfigs.Newest() = %d, want %d", v, newestProxyConfig)
	}
}

// testCAPEM is a CA certificate, for backend CA bundles (only parsed, never used to verify).
const testCAPEM = `-----BEGIN CERTIFICATE-----
MIIBijCCATGgAwIBAgIUeSDwFviJU5pRNrwzP3y7zGDNRd4wCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQY29udHJhY3QgdGVzdCBDQTAeFw0yNjEyMDYyMjQ3NDBaFw0y
NjEyMDcyMjQ3NDBaMBsxGTAXBgNVBAMMEGNvbnRyYWN0IHRlc3QgQ0EwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAATptcaszoLob6Vg3wYqQarPN4tO6KfTA+UW5Wlx
y3GlO7sPRWicqzKVXCGj4TU4pB5/BG8hAK6D+dqdIH+C8Zwso1MwUTAdBgNVHQ4E
FgQUFKKYIRn8KWgQDOFtyeVhulpxw6owHwYDVR0jBBgwFoAUFKKYIRn8KWgQDOFt
yeVhulpxw6owDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiBiLXPg
7vZIXzzjCWqbSeO3eP0FT5WD1l8zS/JLmeVW8QIgGjjtkBwClgS27wSLhlEnpxPj
MAgKBY72TG5wvwMYuo4=
-----END CERTIFICATE-----
`

func validIngressConfig() *ProxyConfig {
	return &ProxyConfig{
		Kind:        KindIngress,
		Hostname:    "web",
		Tags:        []string{"tag:k8s"},
		ControlURL:  "http://127.0.0.1:1234",
		AuthKey:     "tskey-auth-secret",
		StateSecret: "ts-web-0",
		TLS:         TLSConfig{ACMEDirectoryURL: "https://acme.test/dir"},
		Serve: &WebService{HTTP: HTTPRedirect, Routes: []Route{
			{Path: "/", PathType: PathPrefix, Backend: Backend{URL: "http://10.0.0.1:80"}},
			{Path: "/metrics", PathType: PathExact, Backend: Backend{URL: "https://10.0.0.2:443", InsecureSkipVerify: true}},
		}},
	}
}

func TestProxyConfigRoundTrip(t *testing.T) {
	cases := map[string]*ProxyConfig{
		"ingress": validIngressConfig(),
		"service": {Kind: KindService, Hostname: "db", StateSecret: "ts-db-0",
			Firewall: FirewallConfig{Mode: FirewallNFTables},
			Forward:  &Destination{IPs: []string{"10.96.0.10", "fd00::10"}}},
		"externalname": {Kind: KindService, Hostname: "ext", StateSecret: "s", Forward: &Destination{DNSName: "db.example.com"}},
		"proxygroup": {Kind: KindProxyGroup, Hostname: "pg-1", StateSecret: "pg-1",
			TLS: TLSConfig{CertShareMode: CertReader}, AdvertiseServices: []string{"svc:web", "svc:db"}},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			data, err := ProxyConfigs.Encode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := data["proxy-config.v1.json"]; !ok {
				t.Fatalf("encoded keys %v lack proxy-config.v1.json", keys(data))
			}
			got, v, err := ProxyConfigs.Decode(data)
			if err != nil {
				t.Fatal(err)
			}
			if v != newestProxyConfig || got.Version != newestProxyConfig {
				t.Errorf("version = %d / %d, want the newest, %d", v, got.Version, newestProxyConfig)
			}
			want := *cfg
			want.Version = newestProxyConfig
			if cfg.Kind == KindProxyGroup {
				want.AdvertiseServices = nil // v4 replicas advertise their group's documents
			}
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("round trip changed the config:\n got %+v\nwant %+v", *got, want)
			}
		})
	}
}

func TestEncodeDoesNotMutateInput(t *testing.T) {
	cfg := validIngressConfig()
	if _, err := ProxyConfigs.Encode(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Version != 0 {
		t.Errorf("Encode set Version on its input to %d", cfg.Version)
	}
}

// A newer operator writes the newest version and one this proxy has never heard of: the proxy
// reads the newest it knows.
func TestOlderReaderTakesNewestVersionItUnderstands(t *testing.T) {
	data, err := ProxyConfigs.Encode(validIngressConfig())
	if err != nil {
		t.Fatal(err)
	}
	data[ProxyConfigs.key(newestProxyConfig+1)] = []byte(`{"version":6,"listeners":[{"totally":"different"}]}`)
	data[ProxyConfigs.key(newestProxyConfig+2)] = []byte(`not even json`)
	got, v, err := ProxyConfigs.Decode(data)
	if err != nil {
		t.Fatalf("older reader failed on a newer writer's output: %v", err)
	}
	if v != newestProxyConfig || got.Hostname != "web" {
		t.Errorf("got version %d hostname %q, want v%d web", v, got.Hostname, newestProxyConfig)
	}
}

// A replica's config lists the services it may advertise up to v3; from v4 it advertises its
// group's documents and the list, which grows with the group, is not written. Once the replica
// reports that it reads v4, the operator writes v4 (and the newest) alone.
func TestGroupConfigV4AdvertisesDocuments(t *testing.T) {
	cfg := &ProxyConfig{Kind: KindProxyGroup, Hostname: "pg-1", StateSecret: "pg-1",
		TLS: TLSConfig{CertShareMode: CertReader}, AdvertiseServices: []string{"svc:web", "svc:db"}}
	data, err := ProxyConfigs.Encode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for v := 1; v <= newestProxyConfig; v++ {
		reader := codec[ProxyConfig]{name: "proxy-config", decode: map[int]func([]byte) (*ProxyConfig, error){}}
		for w := 1; w <= v; w++ {
			reader.decode[w] = ProxyConfigs.decode[w]
		}
		got, gotV, err := reader.Decode(data)
		if err != nil {
			t.Fatalf("v%d reader: %v", v, err)
		}
		// The oldest and the newest are written: a reader between them reads the oldest.
		wantV, wantList := 1, cfg.AdvertiseServices
		if v == newestProxyConfig {
			wantV, wantList = v, nil
		}
		if gotV != wantV || !reflect.DeepEqual(got.AdvertiseServices, wantList) || got.AdvertisesDocuments() != (wantV >= 4) {
			t.Errorf("v%d reader: read v%d, list %v, documents %v; want v%d, list %v", v, gotV, got.AdvertiseServices,
				got.AdvertisesDocuments(), wantV, wantList)
		}
	}
	from4, err := ProxyConfigs.EncodeFrom(cfg, 4)
	if err != nil {
		t.Fatal(err)
	}
	newest := ProxyConfigs.key(newestProxyConfig)
	if want := slices.Sorted(slices.Values([]string{"proxy-config.v4.json", newest})); !reflect.DeepEqual(keys(from4), want) {
		t.Errorf("EncodeFrom(4) wrote %v, want %v", keys(from4), want)
	}
	if got, v, err := ProxyConfigs.Decode(map[string][]byte{"proxy-config.v4.json": from4["proxy-config.v4.json"]}); err != nil ||
		v != 4 || got.AdvertiseServices != nil || !got.AdvertisesDocuments() {
		t.Errorf("v4 of EncodeFrom(4): v%d %v %+v, want a v4 without a list", v, err, got)
	}
	from3, err := ProxyConfigs.EncodeFrom(cfg, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Sorted(slices.Values([]string{"proxy-config.v3.json", newest})); !reflect.DeepEqual(keys(from3), want) {
		t.Errorf("EncodeFrom(3) wrote %v, want %v", keys(from3), want)
	}
	listed := []byte(`{"version":4,"kind":"proxygroup","hostname":"pg-1","stateSecret":"pg-1","tls":{"certShareMode":"reader"},"advertiseServices":["svc:web"]}`)
	if _, _, err := ProxyConfigs.Decode(map[string][]byte{"proxy-config.v4.json": listed}); err == nil || !strings.Contains(err.Error(), "advertiseServices") {
		t.Errorf("a v4 config with a list: err = %v, want one naming advertiseServices", err)
	}
}

// An older version is written only while it can express the document: a proxy that reads only
// v1 serves a plain Serve config, one that reads up to v2 a config without wildcard hosts, and
// each fails clearly on a config that needs more instead of ignoring it. Of the versions that
// can express it, the oldest and the newest are written, which serves every reader.
func TestOlderVersionOnlyWhenExpressible(t *testing.T) {
	plain := validIngressConfig()
	data, err := ProxyConfigs.Encode(plain)
	if err != nil {
		t.Fatal(err)
	}
	if got, v, err := readerUpTo(1).Decode(data); err != nil || v != 1 || got.Hostname != "web" {
		t.Fatalf("v1 reader on a plain config: v%d %v", v, err)
	}

	for name, tc := range map[string]struct {
		change func(*WebService)
		oldest int // the oldest version written
	}{
		"hold": {func(w *WebService) { w.TLS.Hold = &IssuanceHold{Reason: "CertificateRateLimited"} }, 2},
		"byo": {func(w *WebService) {
			w.TLS.Certificates = []CertificateRef{{SecretName: "app-tls", Hosts: []string{"app.example.com"}}}
		}, 2},
		"route host":     {func(w *WebService) { w.Routes[0].Host = "app.example.com" }, 2},
		"wildcard route": {func(w *WebService) { w.Routes[0].Host = "*.example.com" }, 3},
		"wildcard certificate": {func(w *WebService) {
			w.TLS.Certificates = []CertificateRef{{SecretName: "wild-tls", Hosts: []string{"*.example.com"}}}
		}, 3},
		// Endpoints are optional: every version carries them, and a reader that does not know
		// them reaches the ClusterIP.
		"endpoints": {func(w *WebService) { w.Routes[0].Backend.Endpoints = []string{"10.1.0.5:8080", "[fd00::5]:8080"} }, 1},
		// So is Funnel: a reader that does not know it serves the tailnet only, the safe side.
		"funnel": {func(w *WebService) { w.Funnel = true }, 1},
		// App capabilities are not: a reader without them would pass a backend none.
		"app capabilities": {func(w *WebService) { w.AcceptAppCaps = []string{"example.com/cap/admin"} }, 5},
		// Nor is an h2c backend: a reader without it would speak HTTP/1.1 to an HTTP/2 server.
		"h2c backend": {func(w *WebService) { w.Routes[0].Backend.Protocol = BackendH2C }, 5},
		// Nor a backend CA: a reader without it would verify against the system's roots.
		"backend CA": {func(w *WebService) {
			w.Routes[1].Backend = Backend{URL: "https://10.0.0.2:443", CABundle: testCAPEM, ServerName: "metrics.monitoring.svc"}
		}, 6},
		"backend server name": {func(w *WebService) {
			w.Routes[1].Backend = Backend{URL: "https://10.0.0.2:443", ServerName: "metrics.monitoring.svc"}
		}, 6},
		// Nor matches and header edits: a reader without them would send every request to the route.
		"method match": {func(w *WebService) { w.Routes[0].Method = "POST" }, 8},
		"header match": {func(w *WebService) { w.Routes[0].Headers = []NameValue{{Name: "X-Env", Value: "canary"}} }, 8},
		"query match":  {func(w *WebService) { w.Routes[0].Query = []NameValue{{Name: "v", Value: "2"}} }, 8},
		"request header edits": {func(w *WebService) {
			w.Routes[0].RequestHeaders = &HeaderEdits{Set: []NameValue{{Name: "X-A", Value: "1"}}, Remove: []string{"X-B"}}
		}, 8},
		"redirect": {func(w *WebService) {
			w.Routes[0] = Route{Path: "/old", PathType: PathPrefix, Redirect: &Redirect{Scheme: "https", Port: 8443, StatusCode: 301,
				Path: &PathChange{Type: PathChangePrefix, Value: "/new"}}}
		}, 8},
		// Nor ports: a reader without them would serve port 443 only, with no routes.
		"ports": {func(w *WebService) {
			w.Ports = []WebPort{{Port: 80, Routes: w.Routes}, {Port: 8443, TLS: true, Routes: w.Routes[:1]}}
			w.Routes, w.HTTP = nil, HTTPOff
		}, 10},
		"rewrite": {func(w *WebService) {
			w.Routes[0].Rewrite = &Rewrite{Hostname: "internal.example.com", Path: &PathChange{Type: PathChangeFull, Value: "/"}}
		}, 8},
		"split": {func(w *WebService) {
			w.Routes[0].Backends = []WeightedBackend{{Backend: w.Routes[0].Backend, Weight: 90}, {Backend: w.Routes[1].Backend, Weight: 10}}
			w.Routes[0].Backend = Backend{}
		}, 8},
		"timeout":                 {func(w *WebService) { w.Routes[0].TimeoutMillis = 1500 }, 8},
		"fixed status":            {func(w *WebService) { w.Routes[0].Backend = Backend{Status: 500} }, 9},
		"regular expression path": {func(w *WebService) { w.Routes[0].PathType, w.Routes[0].Path = PathRegularExpression, "/api/v[0-9]+" }, 9},
		"regular expression query": {func(w *WebService) {
			w.Routes[0].Query = []NameValue{{Name: "v", Value: "[0-9]+", Type: MatchRegularExpression}}
		}, 9},
		"fixed status in a split": {func(w *WebService) {
			w.Routes[0].Backends = []WeightedBackend{{Backend: w.Routes[0].Backend, Weight: 1}, {Backend: Backend{Status: 503}, Weight: 1}}
			w.Routes[0].Backend = Backend{}
		}, 9},
		"response header edits": {func(w *WebService) {
			w.Routes[0].ResponseHeaders = &HeaderEdits{Add: []NameValue{{Name: "X-C", Value: "2"}}}
		}, 8},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := validIngressConfig()
			tc.change(cfg.Serve)
			data, err := ProxyConfigs.Encode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for v := 1; v <= newestProxyConfig; v++ {
				// The oldest version that can express it and the newest are written; a reader
				// that stops between them reads the oldest.
				_, written := data[ProxyConfigs.key(v)]
				if written != (v == tc.oldest || v == newestProxyConfig) {
					t.Errorf("v%d written = %v, want v%d and v%d", v, written, tc.oldest, newestProxyConfig)
				}
				got, gotV, err := readerUpTo(v).Decode(data)
				if v < tc.oldest {
					if !errors.Is(err, ErrNoSupportedVersion) {
						t.Errorf("v%d reader: err = %v, want ErrNoSupportedVersion", v, err)
					}
					continue
				}
				wantV := tc.oldest
				if v == newestProxyConfig {
					wantV = v
				}
				if err != nil || gotV != wantV {
					t.Fatalf("v%d reader: v%d %v, want v%d", v, gotV, err, wantV)
				}
				want := *cfg
				want.Version = wantV
				if !reflect.DeepEqual(*got, want) {
					t.Errorf("v%d round trip changed the config:\n got %+v\nwant %+v", v, got.Serve, want.Serve)
				}
			}
		})
	}
}

// A v1 document from a newer writer may carry fields added later: v1 readers ignore them.
// readerUpTo is a proxy-config reader of an older build, which reads versions 1 to n.
func readerUpTo(n int) codec[ProxyConfig] {
	r := codec[ProxyConfig]{name: "proxy-config", decode: map[int]func([]byte) (*ProxyConfig, error){}}
	for v := 1; v <= n; v++ {
		r.decode[v] = ProxyConfigs.decode[v]
	}
	return r
}

func TestUnknownFieldsInKnownVersionAreIgnored(t *testing.T) {
	b, _ := json.Marshal(map[string]any{
		"version": 1, "kind": "service", "hostname": "db", "stateSecret": "s",
		"forward":      map[string]any{"ips": []string{"10.0.0.1"}, "weights": []int{1}},
		"futureOption": true,
	})
	got, _, err := ProxyConfigs.Decode(map[string][]byte{"proxy-config.v1.json": b})
	if err != nil {
		t.Fatal(err)
	}
	if got.Forward.IPs[0] != "10.0.0.1" {
		t.Errorf("forward = %+v", got.Forward)
	}
}

func TestNoSupportedVersion(t *testing.T) {
	cases := map[string]map[string][]byte{
		"only newer":   {ProxyConfigs.key(newestProxyConfig + 1): []byte(fmt.Sprintf(`{"version":%d}`, newestProxyConfig+1))},
		"nothing":      {"unrelated": []byte("x")},
		"wrong prefix": {"proxy-config.v1.yaml": []byte("x")},
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := ProxyConfigs.Decode(data)
			if !errors.Is(err, ErrNoSupportedVersion) {
				t.Fatalf("err = %v, want ErrNoSupportedVersion", err)
			}
			if !strings.Contains(err.Error(), "this build reads v10, v9, v8, v7, v6, v5, v4, v3, v2, v1") {
				t.Errorf("error %q does not say which versions this build reads", err)
			}
			// Absent, it may be written yet; only a version this build cannot read is final.
			if absent := name != "only newer"; errors.Is(err, ErrNoDocument) != absent {
				t.Errorf("errors.Is(%v, ErrNoDocument) = %t, want %t", err, !absent, absent)
			}
		})
	}
}

// A broken newest document is an error, not a silent fall back to an older version.
func TestBrokenUnderstoodVersionIsAnError(t *testing.T) {
	writer := codec[ProxyConfig]{name: "proxy-config", decode: map[int]func([]byte) (*ProxyConfig, error){
		1: ProxyConfigs.decode[1],
		2: jsonDecoder(2, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
	}}
	data, _ := ProxyConfigs.Encode(validIngressConfig())
	data["proxy-config.v2.json"] = []byte(`{"version":2,"kind":"ingress"}`)
	_, v, err := writer.Decode(data)
	if err == nil || v != 2 || !strings.Contains(err.Error(), "proxy-config.v2.json") {
		t.Fatalf("Decode = v%d, %v; want an error about proxy-config.v2.json", v, err)
	}
}

// The codec writes every version in its encode set; a reader of each version gets its own.
func TestWriterEmitsEverySupportedVersion(t *testing.T) {
	type doc struct {
		Version int    `json:"version"`
		Name    string `json:"name"`
	}
	setV := func(d *doc, v int) { d.Version = v }
	getV := func(d *doc) int { return d.Version }
	ok := func(*doc) error { return nil }
	w := codec[doc]{name: "d",
		encode: map[int]func(*doc) ([]byte, error){1: jsonEncoder(1, setV), 2: jsonEncoder(2, setV)},
	}
	data, err := w.Encode(&doc{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Keys(); !reflect.DeepEqual(got, []string{"d.v2.json", "d.v1.json"}) {
		t.Errorf("Keys = %v", got)
	}
	for _, v := range []int{1, 2} {
		r := codec[doc]{name: "d", decode: map[int]func([]byte) (*doc, error){v: jsonDecoder(v, getV, ok)}}
		got, gotV, err := r.Decode(data)
		if err != nil || gotV != v || got.Name != "x" {
			t.Errorf("reader of v%d: %+v v%d %v", v, got, gotV, err)
		}
	}
}

func TestDecodeDir(t *testing.T) {
	dir := t.TempDir()
	data, _ := ProxyConfigs.Encode(validIngressConfig())
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Kubernetes volumes hold "..data" links and other keys: they are skipped.
	if err := os.WriteFile(filepath.Join(dir, "device_id"), []byte("n123"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, _, err := ProxyConfigs.DecodeDir(dir)
	if err != nil || got.Hostname != "web" {
		t.Fatalf("DecodeDir = %+v, %v", got, err)
	}
	if _, _, err := ProxyConfigs.DecodeDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("DecodeDir of a missing directory succeeded")
	}
}

func TestProxyConfigValidation(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*ProxyConfig)
		want   string
	}{
		{"bad hostname", func(c *ProxyConfig) { c.Hostname = "Not_A_Label" }, "hostname"},
		{"bad tag", func(c *ProxyConfig) { c.Tags = []string{"k8s"} }, "tag"},
		{"no state secret", func(c *ProxyConfig) { c.StateSecret = "" }, "stateSecret"},
		{"firewall mode", func(c *ProxyConfig) { c.Firewall.Mode = "ebpf" }, "firewall mode"},
		{"share mode", func(c *ProxyConfig) { c.TLS.CertShareMode = "rw" }, "certShareMode"},
		{"kind", func(c *ProxyConfig) { c.Kind = "egress" }, "kind"},
		{"no serve", func(c *ProxyConfig) { c.Serve = nil }, "needs serve"},
		{"no routes", func(c *ProxyConfig) { c.Serve.Routes = nil }, "no routes"},
		{"relative path", func(c *ProxyConfig) { c.Serve.Routes[0].Path = "api" }, "must start with /"},
		{"path type", func(c *ProxyConfig) { c.Serve.Routes[0].PathType = "ImplementationSpecific" }, "Exact, Prefix or RegularExpression"},
		{"backend scheme", func(c *ProxyConfig) { c.Serve.Routes[0].Backend.URL = "ftp://10.0.0.1" }, "backend URL"},
		{"backend path", func(c *ProxyConfig) { c.Serve.Routes[0].Backend.URL = "http://10.0.0.1/x" }, "backend URL"},
		{"duplicate route", func(c *ProxyConfig) { c.Serve.Routes[1] = c.Serve.Routes[0] }, "twice"},
		{"route host", func(c *ProxyConfig) { c.Serve.Routes[0].Host = "a..b" }, "not a DNS name"},
		{"wildcard in the middle", func(c *ProxyConfig) { c.Serve.Routes[0].Host = "a.*.example.com" }, "not a DNS name"},
		{"wildcard of a TLD", func(c *ProxyConfig) { c.Serve.Routes[0].Host = "*.com" }, "not a DNS name"},
		{"certificate host", func(c *ProxyConfig) {
			c.Serve.TLS.Certificates = []CertificateRef{{SecretName: "s", Hosts: []string{"**.example.com"}}}
		}, "not a DNS name"},
		{"endpoint without port", func(c *ProxyConfig) { c.Serve.Routes[0].Backend.Endpoints = []string{"10.1.0.5"} }, "ip:port"},
		{"endpoint name", func(c *ProxyConfig) { c.Serve.Routes[0].Backend.Endpoints = []string{"pod-a:8080"} }, "ip:port"},
		{"http mode", func(c *ProxyConfig) { c.Serve.HTTP = "always" }, "http mode"},
		{"ports and routes", func(c *ProxyConfig) { c.Serve.Ports = []WebPort{{Port: 80, Routes: c.Serve.Routes}} }, "no routes or http mode of its own"},
		{"port out of range", func(c *ProxyConfig) {
			c.Serve.Ports, c.Serve.Routes = []WebPort{{Port: 65536, Routes: c.Serve.Routes}}, nil
		}, "not a port"},
		{"port twice", func(c *ProxyConfig) {
			c.Serve.Ports, c.Serve.Routes = []WebPort{{Port: 80, Routes: c.Serve.Routes}, {Port: 80, TLS: true, Routes: c.Serve.Routes}}, nil
		}, "given twice"},
		{"port without routes", func(c *ProxyConfig) { c.Serve.Ports, c.Serve.Routes = []WebPort{{Port: 80}}, nil }, "port 80: no routes"},
		{"bad route of a port", func(c *ProxyConfig) {
			c.Serve.Routes[0].Path = "api"
			c.Serve.Ports, c.Serve.Routes = []WebPort{{Port: 8080, Routes: c.Serve.Routes}}, nil
		}, "port 8080: route path"},
		{"funnel without HTTPS on 443", func(c *ProxyConfig) {
			c.Serve.Ports, c.Serve.Routes, c.Serve.Funnel = []WebPort{{Port: 8443, TLS: true, Routes: c.Serve.Routes}}, nil, true
		}, "funnel needs HTTPS on port 443"},
		{"unknown backend protocol", func(c *ProxyConfig) { c.Serve.Routes[0].Backend.Protocol = "h3" }, "backend protocol"},
		{"h2c to an https backend", func(c *ProxyConfig) { c.Serve.Routes[1].Backend.Protocol = BackendH2C }, "backend protocol"},
		{"CA of an http backend", func(c *ProxyConfig) { c.Serve.Routes[0].Backend.CABundle = testCAPEM }, "verified https backend"},
		{"CA of an unverified backend", func(c *ProxyConfig) { c.Serve.Routes[1].Backend.CABundle = testCAPEM }, "verified https backend"},
		{"CA without a certificate", func(c *ProxyConfig) {
			c.Serve.Routes[1].Backend = Backend{URL: "https://10.0.0.2:443", CABundle: "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"}
		}, "no PEM certificate"},
		{"server name", func(c *ProxyConfig) {
			c.Serve.Routes[1].Backend = Backend{URL: "https://10.0.0.2:443", ServerName: "metrics..svc"}
		}, "not a DNS name"},
		{"method", func(c *ProxyConfig) { c.Serve.Routes[0].Method = "GET /" }, "not a token"},
		{"header match name", func(c *ProxyConfig) { c.Serve.Routes[0].Headers = []NameValue{{Name: "X Env", Value: "a"}} }, "header match"},
		{"header match value", func(c *ProxyConfig) { c.Serve.Routes[0].Headers = []NameValue{{Name: "X-Env", Value: "a\nb"}} }, "header match"},
		{"header match twice", func(c *ProxyConfig) {
			c.Serve.Routes[0].Headers = []NameValue{{Name: "X-Env", Value: "a"}, {Name: "x-env", Value: "b"}}
		}, "twice"},
		{"query match twice", func(c *ProxyConfig) {
			c.Serve.Routes[0].Query = []NameValue{{Name: "v", Value: "1"}, {Name: "v", Value: "2"}}
		}, "twice"},
		{"query match without a name", func(c *ProxyConfig) { c.Serve.Routes[0].Query = []NameValue{{Value: "2"}} }, "query match"},
		{"header edit", func(c *ProxyConfig) {
			c.Serve.Routes[0].ResponseHeaders = &HeaderEdits{Set: []NameValue{{Name: "X-A:", Value: "1"}}}
		}, "header edit"},
		{"header removal", func(c *ProxyConfig) { c.Serve.Routes[0].RequestHeaders = &HeaderEdits{Remove: []string{""}} }, "header edit"},
		{"redirect with a backend", func(c *ProxyConfig) {
			c.Serve.Routes[0].Redirect = &Redirect{Scheme: "https", StatusCode: 301}
		}, "no backend"},
		{"redirect status", func(c *ProxyConfig) {
			c.Serve.Routes[0] = Route{Path: "/", PathType: PathPrefix, Redirect: &Redirect{StatusCode: 308}}
		}, "301 or 302"},
		{"redirect scheme", func(c *ProxyConfig) {
			c.Serve.Routes[0] = Route{Path: "/", PathType: PathPrefix, Redirect: &Redirect{Scheme: "ftp", StatusCode: 302}}
		}, "http or https"},
		{"redirect hostname", func(c *ProxyConfig) {
			c.Serve.Routes[0] = Route{Path: "/", PathType: PathPrefix, Redirect: &Redirect{Hostname: "a..b", StatusCode: 302}}
		}, "not a DNS name"},
		{"prefix change of an Exact route", func(c *ProxyConfig) {
			c.Serve.Routes[0].PathType = PathExact
			c.Serve.Routes[0].Rewrite = &Rewrite{Path: &PathChange{Type: PathChangePrefix, Value: "/v2"}}
		}, "Prefix on a Prefix route"},
		{"relative rewrite", func(c *ProxyConfig) {
			c.Serve.Routes[0].Rewrite = &Rewrite{Path: &PathChange{Type: PathChangeFull, Value: "v2"}}
		}, "must start with /"},
		{"rewrite hostname", func(c *ProxyConfig) { c.Serve.Routes[0].Rewrite = &Rewrite{Hostname: "-bad-"} }, "not a DNS name"},
		{"regular expression path", func(c *ProxyConfig) {
			c.Serve.Routes[0].PathType, c.Serve.Routes[0].Path = PathRegularExpression, "/api/(v1"
		}, "missing closing )"},
		{"regular expression header", func(c *ProxyConfig) {
			c.Serve.Routes[0].Headers = []NameValue{{Name: "X-Env", Value: "[a-", Type: MatchRegularExpression}}
		}, "error parsing regexp"},
		{"match type", func(c *ProxyConfig) { c.Serve.Routes[0].Query = []NameValue{{Name: "v", Value: "2", Type: "Prefix"}} }, "must be empty or RegularExpression"},
		{"typed header edit", func(c *ProxyConfig) {
			c.Serve.Routes[0].RequestHeaders = &HeaderEdits{Set: []NameValue{{Name: "X-A", Value: "1", Type: MatchRegularExpression}}}
		}, "header edit"},
		{"mirror share", func(c *ProxyConfig) {
			c.Serve.Routes[0].Mirrors = []Mirror{{Backend: c.Serve.Routes[1].Backend, Numerator: 3, Denominator: 2}}
		}, "a fraction of 1 or less"},
		{"mirror with a fixed status", func(c *ProxyConfig) {
			c.Serve.Routes[0].Mirrors = []Mirror{{Backend: Backend{Status: 500}, Numerator: 1, Denominator: 1}}
		}, "a server's backend"},
		{"fixed status not an error", func(c *ProxyConfig) { c.Serve.Routes[0].Backend = Backend{Status: 200} }, "400 to 599"},
		{"fixed status with a URL", func(c *ProxyConfig) { c.Serve.Routes[0].Backend.Status = 500 }, "nothing else"},
		{"fixed status in a split, with endpoints", func(c *ProxyConfig) {
			c.Serve.Routes[0].Backends = []WeightedBackend{{Backend: Backend{Status: 500, Endpoints: []string{"10.0.0.1:80"}}, Weight: 1}, {Backend: c.Serve.Routes[1].Backend, Weight: 1}}
			c.Serve.Routes[0].Backend = Backend{}
		}, "nothing else"},
		{"split with a backend of its own", func(c *ProxyConfig) {
			c.Serve.Routes[0].Backends = []WeightedBackend{{Backend: c.Serve.Routes[0].Backend, Weight: 1}, {Backend: c.Serve.Routes[1].Backend, Weight: 1}}
		}, "a split"},
		{"split of one", func(c *ProxyConfig) {
			c.Serve.Routes[0].Backends = []WeightedBackend{{Backend: c.Serve.Routes[0].Backend, Weight: 1}}
			c.Serve.Routes[0].Backend = Backend{}
		}, "a split"},
		{"split weight", func(c *ProxyConfig) {
			c.Serve.Routes[0].Backends = []WeightedBackend{{Backend: c.Serve.Routes[0].Backend, Weight: 0}, {Backend: c.Serve.Routes[1].Backend, Weight: 1}}
			c.Serve.Routes[0].Backend = Backend{}
		}, "weight 0"},
		{"split backend", func(c *ProxyConfig) {
			c.Serve.Routes[0].Backends = []WeightedBackend{{Backend: Backend{URL: "ftp://x"}, Weight: 1}, {Backend: c.Serve.Routes[1].Backend, Weight: 1}}
			c.Serve.Routes[0].Backend = Backend{}
		}, "backend 0: backend URL"},
		{"negative timeout", func(c *ProxyConfig) { c.Serve.Routes[0].TimeoutMillis = -1 }, "negative"},
		{"same matches twice", func(c *ProxyConfig) {
			c.Serve.Routes[1] = c.Serve.Routes[0]
			c.Serve.Routes[0].Headers = []NameValue{{Name: "X-Env", Value: "a"}}
			c.Serve.Routes[1].Headers = []NameValue{{Name: "X-Env", Value: "a"}}
		}, "twice"},
		{"app capability", func(c *ProxyConfig) { c.Serve.AcceptAppCaps = []string{"tailscale.com/cap/kubernetes"} }, "app capability"},
		{"service without forward", func(c *ProxyConfig) { c.Kind, c.Serve = KindService, nil }, "needs forward"},
		{"bad destination IP", func(c *ProxyConfig) {
			c.Kind, c.Serve, c.Forward = KindService, nil, &Destination{IPs: []string{"10.0.0.300"}}
		}, "destination IP"},
		{"both destinations", func(c *ProxyConfig) {
			c.Kind, c.Serve, c.Forward = KindService, nil, &Destination{IPs: []string{"10.0.0.1"}, DNSName: "a.b"}
		}, "both"},
		{"group with serve", func(c *ProxyConfig) { c.Kind = KindProxyGroup }, "ConfigMap"},
		{"group bad service", func(c *ProxyConfig) { c.Kind, c.Serve, c.AdvertiseServices = KindProxyGroup, nil, []string{"web"} }, "svc:name"},
	}
	if err := validIngressConfig().Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	narrowed := validIngressConfig()
	narrowed.Serve.Routes[1] = narrowed.Serve.Routes[0]
	narrowed.Serve.Routes[1].Headers = []NameValue{{Name: "X-Env", Value: "canary"}}
	if err := narrowed.Validate(); err != nil {
		t.Fatalf("a route of the same path narrowed by a header rejected: %v", err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validIngressConfig()
			tc.mutate(cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want error containing %q", err, tc.want)
			}
			// An invalid document is refused by the reader as well, in every version that
			// carries the fault (v4 does not write a replica's list of services).
			data, _ := ProxyConfigs.Encode(cfg)
			refused := 0
			for k, b := range data {
				if _, _, err := ProxyConfigs.Decode(map[string][]byte{k: b}); err != nil {
					refused++
				}
			}
			if refused == 0 {
				t.Error("Decode accepted an invalid document in every version written")
			}
		})
	}
}

func TestAuthKeyNeverPrinted(t *testing.T) {
	cfg := validIngressConfig()
	for _, s := range []string{cfg.String(), fmtV(cfg), fmtV(*cfg)} {
		if strings.Contains(s, "tskey-auth-secret") {
			t.Errorf("auth key printed: %s", s)
		}
	}
	if cfg.AuthKey != "tskey-auth-secret" {
		t.Error("Redacted changed the original")
	}
}

func TestGroupDocumentsRoundTrip(t *testing.T) {
	serve := &ServeConfig{Services: map[string]WebService{
		"svc:web": {Routes: []Route{{Path: "/", PathType: PathPrefix, Backend: Backend{URL: "http://10.0.0.1:80"}}}},
	}}
	data, err := ServeConfigs.Encode(serve)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := ServeConfigs.Decode(data)
	if err != nil || !reflect.DeepEqual(got.Services, serve.Services) {
		t.Fatalf("serve round trip: %+v %v", got, err)
	}

	dnat := &DNATConfig{Services: map[string]DNATService{
		"svc:db": {VIPs: []string{"100.100.0.1", "fd7a:115c:a1e0::1"}, Destination: Destination{IPs: []string{"10.96.0.5"}}},
	}}
	data, err = DNATConfigs.Encode(dnat)
	if err != nil {
		t.Fatal(err)
	}
	gotD, _, err := DNATConfigs.Decode(data)
	if err != nil || !reflect.DeepEqual(gotD.Services, dnat.Services) {
		t.Fatalf("dnat round trip: %+v %v", gotD, err)
	}

	bad := map[string][]byte{"dnat-config.v1.json": []byte(`{"version":1,"services":{"db":{"vips":["x"]}}}`)}
	if _, _, err := DNATConfigs.Decode(bad); err == nil || !strings.Contains(err.Error(), "svc:name") {
		t.Errorf("invalid dnat document: %v", err)
	}
}

func TestStateRoundTrip(t *testing.T) {
	st := &ProxyState{
		DeviceID: "nABC", FQDN: "web.tailnet.test.", TailnetIPs: []string{"100.64.0.1", "fd7a:115c:a1e0::1"},
		ConfigVersion: 1, PodUID: "uid-1", HTTPSEndpoint: "web.tailnet.test", ProxyVersion: "v0.1.0",
		Advertised: []string{"svc:web"},
		Firewall: &FirewallStatus{Mode: FirewallNFTables, PodUID: "uid-1", Mappings: map[string]AppliedDNAT{
			StandaloneMapping: {TailnetIPs: []string{"100.64.0.1"}, Destinations: []string{"10.96.0.1"}},
		}},
		Certificates: map[string]CertificateStatus{
			"web.tailnet.test": {Source: CertSourceACME, Serial: "0a1b", NotBefore: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
				NotAfter: time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)},
			"app.example.com": {Reason: CertReasonSecretInvalid, Message: "expired"},
		},
		Funnel: map[string]FunnelStatus{
			"web.tailnet.test": {Public: true},
			"api.tailnet.test": {Reason: FunnelNotPermitted, Message: `"funnel" node attribute not set`},
		},
		WebPorts: []int{80, 8443},
	}
	data, err := st.Data()
	if err != nil {
		t.Fatal(err)
	}
	if string(data[StateDeviceFQDN]) != "web.tailnet.test" {
		t.Errorf("fqdn stored as %q, want no trailing dot", data[StateDeviceFQDN])
	}
	got, err := ParseState(data)
	if err != nil {
		t.Fatal(err)
	}
	st.FQDN = "web.tailnet.test"
	if !reflect.DeepEqual(got, st) {
		t.Errorf("state round trip:\n got %+v\nwant %+v", got, st)
	}
	if !got.CurrentFor("uid-1") || got.CurrentFor("uid-2") || (&ProxyState{}).CurrentFor("") {
		t.Error("CurrentFor is wrong")
	}

	// A fresh Pod's state clears every key the previous Pod set.
	fresh, _ := (&ProxyState{PodUID: "uid-2"}).Data()
	for _, k := range []string{StateDeviceIPs, StateFirewall, StateAdvertised, StateHTTPSEndpoint, StateConfigVersion, StateCertificates, StateFunnel, StateWebPorts} {
		if v, ok := fresh[k]; !ok || len(v) != 0 {
			t.Errorf("fresh state key %s = %q, present %v; want present and empty", k, v, ok)
		}
	}

	if _, err := ParseState(map[string][]byte{StateDeviceIPs: []byte("[1,")}); err == nil || !strings.Contains(err.Error(), StateDeviceIPs) {
		t.Errorf("malformed state: %v", err)
	}
}

func keys(m map[string][]byte) []string { return slices.Sorted(maps.Keys(m)) }
func fmtV(v any) string                 { return fmt.Sprintf("%v %+v %s", v, v, v) }

// The operator's guard and the proxy both renew by this rule: two thirds of the lifetime.
func TestRenewalRule(t *testing.T) {
	notBefore := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	notAfter := notBefore.Add(90 * 24 * time.Hour)
	if got, want := RenewAt(notBefore, notAfter), notBefore.Add(60*24*time.Hour); !got.Equal(want) {
		t.Fatalf("RenewAt = %s, want %s (two thirds of 90 days)", got, want)
	}
	c := CertificateStatus{Source: CertSourceACME, Serial: "01", NotBefore: notBefore, NotAfter: notAfter}
	for _, tc := range []struct {
		at   time.Duration // after notBefore
		due  bool
		what string
	}{
		{24 * time.Hour, false, "a day-old certificate"},
		{60*24*time.Hour - time.Second, false, "a second before two thirds"},
		{60 * 24 * time.Hour, true, "at two thirds"},
		{91 * 24 * time.Hour, true, "an expired certificate"},
	} {
		if got := c.RenewDue(notBefore.Add(tc.at)); got != tc.due {
			t.Errorf("%s: RenewDue = %v, want %v", tc.what, got, tc.due)
		}
	}
	if !(CertificateStatus{}).RenewDue(notBefore) {
		t.Error("no certificate: RenewDue = false, want true")
	}
	if !(CertificateStatus{Reason: CertReasonIssuanceFailed}).RenewDue(notBefore) {
		t.Error("a failed issuance: RenewDue = false, want true")
	}
}
