package contract

import (
	"fmt"
	"strings"
	"testing"
)

func TestShardOfGrowsInPlace(t *testing.T) {
	// Doubling the count moves an entry from shard i to i or i+n only: the writer relies on it
	// to grow without a reader missing an entry.
	spread := map[int]int{}
	for j := range 1000 {
		name := fmt.Sprintf("svc:site-%04d", j)
		for n := 1; n < MaxShards; n *= 2 {
			a, b := ShardOf(name, n), ShardOf(name, 2*n)
			if a < 0 || a >= n || (b != a && b != a+n) {
				t.Fatalf("%s: shard %d of %d became %d of %d", name, a, n, b, 2*n)
			}
		}
		spread[ShardOf(name, 8)]++
	}
	for i := range 8 {
		if spread[i] < 1000/8/2 {
			t.Errorf("shard %d of 8 holds %d of 1000 names: %v", i, spread[i], spread)
		}
	}
}

func TestShardCount(t *testing.T) {
	if n, err := ShardCount(map[string][]byte{"serve-config.v3.json": []byte(`{}`)}); n != 1 || err != nil {
		t.Errorf("without an index: %d, %v; want 1", n, err)
	}
	idx, err := GroupShardIndexes.Encode(&GroupShards{Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := ShardCount(idx); n != 4 || err != nil {
		t.Errorf("with count 4: %d, %v", n, err)
	}
	for _, bad := range []string{`{"version":1,"count":3}`, `{"version":1,"count":0}`, `{"version":1,"count":128}`, `nope`} {
		if _, err := ShardCount(map[string][]byte{"group-shards.v1.json": []byte(bad)}); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if _, err := ShardCount(map[string][]byte{"group-shards.v2.json": []byte(`{"version":2,"count":2}`)}); err == nil {
		t.Error("an index of a newer version than this build reads: no error")
	}
	if ShardName("pg-ingress-config", 0) != "pg-ingress-config" || ShardName("pg-ingress-config", 3) != "pg-ingress-config-3" {
		t.Error("shard names")
	}
}

func shardsOf(t *testing.T, count int, services ...string) []map[string][]byte {
	t.Helper()
	serve := make([]*ServeConfig, count)
	dnat := make([]*DNATConfig, count)
	for i := range count {
		serve[i] = &ServeConfig{Services: map[string]WebService{}}
		dnat[i] = &DNATConfig{Services: map[string]DNATService{}}
	}
	for _, s := range services {
		i := ShardOf(s, count)
		if strings.HasPrefix(s, "svc:l3-") {
			dnat[i].Services[s] = DNATService{VIPs: []string{"100.100.0.1"}, Destination: Destination{DNSName: "db.example.com"}}
		} else {
			serve[i].Services[s] = validWebService()
		}
	}
	out := make([]map[string][]byte, count)
	for i := range count {
		out[i] = map[string][]byte{}
		for _, enc := range []func() (map[string][]byte, error){
			func() (map[string][]byte, error) { return ServeConfigs.Encode(serve[i]) },
			func() (map[string][]byte, error) { return DNATConfigs.Encode(dnat[i]) },
		} {
			data, err := enc()
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range data {
				out[i][k] = v
			}
		}
	}
	return out
}

func TestMergeShards(t *testing.T) {
	names := []string{"svc:a", "svc:b", "svc:c", "svc:d", "svc:l3-a", "svc:l3-b", "svc:l3-c"}
	shards := shardsOf(t, 4, names...)
	docs := MergeShards(shards)
	if docs.ServeErr != nil || docs.DNATErr != nil {
		t.Fatal(docs.ServeErr, docs.DNATErr)
	}
	if len(docs.Serve.Services) != 4 || len(docs.DNAT.Services) != 3 {
		t.Fatalf("merged %d Serve and %d DNAT entries; want 4 and 3", len(docs.Serve.Services), len(docs.DNAT.Services))
	}

	// An entry left outside its own shard (while the count grows, or by a writer that stopped
	// halfway) yields to the one in its own shard, whichever comes first.
	moved := "svc:a"
	for ShardOf(moved, 4) != 0 {
		moved += "a"
	}
	grown := shardsOf(t, 4, append(names, moved)...)
	leftover, _, err := ServeConfigs.Decode(grown[3])
	if err != nil {
		t.Fatal(err)
	}
	ws := validWebService()
	ws.Routes[0].Path = "/old"
	leftover.Services[moved] = ws
	data, err := ServeConfigs.Encode(leftover)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range data {
		grown[3][k] = v
	}
	docs = MergeShards(grown)
	if got := docs.Serve.Services[moved].Routes[0].Path; got != "/" {
		t.Errorf("the entry outside its own shard won: path %q", got)
	}

	// A document unreadable in one shard fails that document only.
	shards[1]["serve-config.v3.json"] = []byte("{")
	docs = MergeShards(shards)
	if docs.ServeErr == nil || docs.Serve != nil {
		t.Errorf("a broken Serve shard: %v", docs.ServeErr)
	}
	if docs.DNATErr != nil || len(docs.DNAT.Services) != 3 {
		t.Errorf("the DNAT document failed with the Serve one: %v", docs.DNATErr)
	}
	if !strings.Contains(docs.ServeErr.Error(), "shard 1 of 4") {
		t.Errorf("the error does not say which shard: %v", docs.ServeErr)
	}

	// No document at all: empty ones, as before the group's first object.
	docs = MergeShards([]map[string][]byte{{}})
	if docs.ServeErr != nil || docs.DNATErr != nil || len(docs.Serve.Services)+len(docs.DNAT.Services) != 0 {
		t.Errorf("empty shards: %+v", docs)
	}
}

func validWebService() WebService {
	return WebService{Routes: []Route{{Path: "/", PathType: PathPrefix, Backend: Backend{URL: "http://10.0.0.1:80"}}}}
}
