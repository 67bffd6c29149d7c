package contract

import (
	"fmt"
	"hash/fnv"
	"strings"
	"testing"
)

func TestShardOfGrowsInPlace(t *testing.T) {
	// Growing the count by one moves entries from SplitShard to the new shard only, and a count
	// that is a power of two spreads entries as version 1 of the index says (hash mod count):
	// the writer relies on the first, readers of version 1 on the second.
	spread := map[int]int{}
	for j := range 1000 {
		name := fmt.Sprintf("svc:site-%04d", j)
		for n := 1; n < MaxShards; n++ {
			a, b := ShardOf(name, n), ShardOf(name, n+1)
			if a < 0 || a >= n || (b != a && (a != SplitShard(n) || b != n)) {
				t.Fatalf("%s: shard %d of %d became %d of %d (the split shard is %d)", name, a, n, b, n+1, SplitShard(n))
			}
		}
		for n := 1; n <= MaxShards; n *= 2 {
			h := fnv.New32a()
			h.Write([]byte(name))
			if got, want := ShardOf(name, n), int(h.Sum32()%uint32(n)); got != want {
				t.Fatalf("%s: shard %d of %d; version 1 of the index says %d", name, got, n, want)
			}
		}
		spread[ShardOf(name, 6)]++
	}
	// Of 6 shards, 2 have been split (0 and 1 into 4 and 5): those hold an eighth each, the
	// others a quarter.
	for i, want := range []int{125, 125, 250, 250, 125, 125} {
		if spread[i] < want/2 || spread[i] > want*2 {
			t.Errorf("shard %d of 6 holds %d of 1000 names, expected about %d: %v", i, spread[i], want, spread)
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
	if _, ok := idx["group-shards.v1.json"]; !ok {
		t.Error("a count that is a power of two is not written for version 1 readers")
	}
	// Any other count is in version 2 alone: a reader of version 1 fails rather than misread it.
	idx, err = GroupShardIndexes.Encode(&GroupShards{Count: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := idx["group-shards.v1.json"]; ok || len(idx) != 1 {
		t.Errorf("count 5 written as %v; want group-shards.v2.json alone", idx)
	}
	if n, err := ShardCount(idx); n != 5 || err != nil {
		t.Errorf("with count 5: %d, %v", n, err)
	}
	for key, bad := range map[string]string{
		"group-shards.v1.json": `{"version":1,"count":3}`, "group-shards.v2.json": `{"version":2,"count":0}`,
		"group-shards.v1.json ": `{"version":1,"count":128}`, "group-shards.v2.json ": `nope`,
	} {
		if _, err := ShardCount(map[string][]byte{strings.TrimSpace(key): []byte(bad)}); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if _, err := ShardCount(map[string][]byte{"group-shards.v3.json": []byte(`{"version":3,"count":2}`)}); err == nil {
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
	shards[1][ServeConfigs.Keys()[0]] = []byte("{") // the newest, which readers take
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
