package proxy

import (
	"log/slog"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// A replica reads a group's documents from every shard the first ConfigMap counts, and only
// once it has read them all; a count that grows brings the new shards' watches.
func TestWatchGroupDocsShards(t *testing.T) {
	kube := proxytest.StartKube(t)
	const ns, main = "default", "pg-ingress-config"
	cms := kube.Client.CoreV1().ConfigMaps(ns)
	// put writes shard i of count with the entries of names (not necessarily all their own).
	put := func(i, count int, names ...string) {
		t.Helper()
		serve := &contract.ServeConfig{Services: map[string]contract.WebService{}}
		for _, n := range names {
			serve.Services[n] = contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://web:80"}}}}
		}
		data, err := contract.ServeConfigs.Encode(serve)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 && count > 1 {
			idx, err := contract.GroupShardIndexes.Encode(&contract.GroupShards{Count: count})
			if err != nil {
				t.Fatal(err)
			}
			maps.Copy(data, idx)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: contract.ShardName(main, i), Namespace: ns}, Data: map[string]string{}}
		for k, v := range data {
			cm.Data[k] = string(v)
		}
		if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
			if _, err := cms.Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Names by their shard of 2 and of 4.
	byShard := func(count int) [][]string {
		out := make([][]string, count)
		for _, n := range []string{"svc:a", "svc:b", "svc:c", "svc:d", "svc:e", "svc:f", "svc:g", "svc:h", "svc:i", "svc:j"} {
			i := contract.ShardOf(n, count)
			out[i] = append(out[i], n)
		}
		return out
	}
	two := byShard(2)
	put(0, 2, two[0]...)

	out := make(chan []map[string][]byte, 16)
	go watchGroupDocs(t.Context(), kube.Client, ns, main, slog.New(slog.DiscardHandler), out)
	served := func() map[string]bool {
		t.Helper()
		select {
		case shards := <-out:
			docs := contract.MergeShards(shards)
			if docs.ServeErr != nil {
				t.Fatal(docs.ServeErr)
			}
			got := map[string]bool{}
			for n := range docs.Serve.Services {
				got[n] = true
			}
			return got
		case <-time.After(30 * time.Second):
			t.Fatal("no documents within 30s")
			return nil
		}
	}
	select {
	case shards := <-out:
		t.Fatalf("documents sent before shard 1 existed: %d shards", len(shards))
	case <-time.After(time.Second):
	}
	put(1, 2, two[1]...)
	if got := served(); len(got) != 10 {
		t.Fatalf("with both shards: %v", got)
	}

	// Growing to 4: the new shards first, then the count; the old shards keep what moved until
	// they are rewritten, so every read has all ten.
	four := byShard(4)
	put(2, 4, four[2]...)
	put(3, 4, four[3]...)
	put(0, 4, append(four[0], four[2]...)...)
	if got := served(); len(got) != 10 {
		t.Fatalf("after the count grew: %v", got)
	}
	put(1, 4, four[1]...)
	deadline := time.After(30 * time.Second)
	for {
		select {
		case shards := <-out:
			if len(shards) != 4 {
				continue
			}
			docs := contract.MergeShards(shards)
			if len(docs.Serve.Services) != 10 {
				t.Fatalf("a read lost entries while the count grew: %d", len(docs.Serve.Services))
			}
			if d, _, _ := contract.ServeConfigs.Decode(shards[1]); len(d.Services) == len(four[1]) {
				return // shard 1 rewritten
			}
		case <-deadline:
			t.Fatal("the rewritten shard 1 was not read within 30s")
		}
	}
}
