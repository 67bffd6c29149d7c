package groupstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// shardedWriter is a group writer with a small shard bound, on a fake API with the group's
// first ConfigMap, as the ProxyGroup reconciler creates it.
func shardedWriter(t *testing.T, shardBytes int) (*groupWriter, client.Client) {
	t.Helper()
	main := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: proxies.Group{Name: "pg"}.ConfigMap(), Namespace: "ns", Labels: proxies.Group{Name: "pg"}.Labels(),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "tailscale.com/v1alpha1", Kind: "ProxyGroup", Name: "pg", UID: "pg-uid"}}}}
	c := fake.NewClientBuilder().WithObjects(main).Build()
	return newGroupWriter(c, c, "ns", shardBytes), c
}

func webEntry(path string) *contract.WebService {
	return &contract.WebService{Routes: []contract.Route{{Path: path, PathType: contract.PathPrefix, Backend: contract.Backend{URL: "http://web.apps.svc:80"}}}}
}

// storedShards reads the group's shards as a replica does, checking each against the bound.
func storedShards(t *testing.T, c client.Client, bound int) ([]*corev1.ConfigMap, contract.GroupDocuments) {
	t.Helper()
	ctx := context.Background()
	var cms []*corev1.ConfigMap
	var datas []map[string][]byte
	for i, count := 0, 1; i < count; i++ {
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: contract.ShardName(proxies.Group{Name: "pg"}.ConfigMap(), i)}, cm); err != nil {
			t.Fatalf("shard %d of %d: %v", i, count, err)
		}
		if i == 0 {
			n, err := contract.ShardCount(contract.ConfigMapBytes(cm.Data))
			if err != nil {
				t.Fatal(err)
			}
			count = n
		}
		if size := dataSize(cm.Data, nil, nil); size > bound {
			t.Errorf("%s holds %d bytes, over the bound of %d", cm.Name, size, bound)
		}
		cms, datas = append(cms, cm), append(datas, contract.ConfigMapBytes(cm.Data))
	}
	docs := contract.MergeShards(datas)
	if docs.ServeErr != nil || docs.DNATErr != nil {
		t.Fatal(docs.ServeErr, docs.DNATErr)
	}
	return cms, docs
}

func TestGroupWriterShards(t *testing.T) {
	const bound = 4 << 10
	w, c := shardedWriter(t, bound)
	ctx := context.Background()
	for batch := range 20 {
		before := configMapVersions(t, c)
		var changes []func(*groupShards)
		for j := range 10 {
			name, owner := fmt.Sprintf("svc:site-%03d", batch*10+j), fmt.Sprintf("Ingress/apps/site-%03d", batch*10+j)
			changes = append(changes, func(g *groupShards) { g.setServe(name, webEntry("/"+name), owner) })
		}
		for i, err := range w.flush("pg", changes) {
			if err != nil {
				t.Fatalf("batch %d, change %d: %v", batch, i, err)
			}
		}
		// New entries go where there is room: the shards they fill, a new one and shard 0
		// (its count) when they need one; however many shards there are.
		if written := changedVersions(before, configMapVersions(t, c)); written > 4 {
			t.Errorf("batch %d of 10 new entries wrote %d of %d shards", batch, written, len(before))
		}
	}
	cms, docs := storedShards(t, c, bound)
	if len(cms) < 4 {
		t.Fatalf("200 entries in %d ConfigMaps of at most %d bytes", len(cms), bound)
	}
	if len(docs.Serve.Services) != 200 {
		t.Fatalf("%d of 200 entries stored", len(docs.Serve.Services))
	}
	holder := map[string]int{}
	for i, cm := range cms {
		content := decodeGroup(cm)
		for name := range content.serve.Services {
			if j, dup := holder[name]; dup {
				t.Errorf("%s is in shards %d and %d", name, j, i)
			}
			holder[name] = i
			if content.owners[name] == "" {
				t.Errorf("%s: no owner in its shard", name)
			}
		}
		if i > 0 && (cm.Labels[kit.LabelParentName] != "pg" || len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != "pg-uid") {
			t.Errorf("%s: labels %v, owners %v: not the group's", cm.Name, cm.Labels, cm.OwnerReferences)
		}
	}

	// Readers find owners in every shard.
	d := documents{Client: c, Namespace: "ns", W: w}
	names, err := d.ownedBy(ctx, "Ingress/apps/site-123")
	if err != nil || len(names) != 1 || names[0] != "svc:site-123" {
		t.Errorf("ownedBy: %v, %v", names, err)
	}

	// Removing writes only the shards it touches, and entries go.
	for i := range 200 {
		if i%2 == 0 {
			continue
		}
		name := fmt.Sprintf("svc:site-%03d", i)
		if err := d.removeElsewhere(ctx, name, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, docs := storedShards(t, c, bound); len(docs.Serve.Services) != 100 {
		t.Errorf("%d entries after removing 100 of 200", len(docs.Serve.Services))
	}
}

// An entry that no shard could hold fails alone; the rest of its batch is stored.
func TestGroupWriterFull(t *testing.T) {
	const bound = 1 << 10
	w, c := shardedWriter(t, bound)
	errs := w.flush("pg", []func(*groupShards){
		func(g *groupShards) {
			g.setServe("svc:huge", webEntry("/"+strings.Repeat("x", 2*bound)), "Ingress/apps/huge")
		},
		func(g *groupShards) { g.setServe("svc:small", webEntry("/"), "Ingress/apps/small") },
	})
	if !errors.Is(errs[0], ErrConfigFull) || errs[1] != nil {
		t.Fatalf("errors %v; want errConfigFull for the huge entry only", errs)
	}
	cms, docs := storedShards(t, c, bound)
	if len(cms) != 1 || len(docs.Serve.Services) != 1 || !hasService(docs.Serve.Services, "svc:small") {
		t.Errorf("%d shards with %v", len(cms), docs.Serve.Services)
	}
}

// A service's entries found in two shards, as a flush that stopped while moving them to a new
// shard leaves them, stay in the first only.
func TestGroupShardsSettle(t *testing.T) {
	first, second := emptyContent(), emptyContent()
	first.setServe("svc:a", webEntry("/"), "Ingress/apps/a")
	second.setServe("svc:a", webEntry("/"), "Ingress/apps/a")
	second.setDNAT("svc:b", &contract.DNATService{VIPs: []string{"100.100.0.1"}}, "Service/apps/b")
	s := newGroupShards([]*groupContent{first, second}, []int{100, 200}, 1<<10)
	s.settle()
	if !s.shards[0].has("svc:a") || s.shards[1].has("svc:a") || !s.shards[1].has("svc:b") || s.shards[0].owners["svc:a"] != "Ingress/apps/a" {
		t.Errorf("shard 0 %v, shard 1 %v %v", s.shards[0].serve.Services, s.shards[1].serve.Services, s.shards[1].dnat.Services)
	}
	if !second.has("svc:a") {
		t.Error("settling changed the shared content it started from")
	}
	if s.touched[0] || !s.touched[1] {
		t.Errorf("touched %v; want the second shard only", s.touched)
	}
}

// configMapVersions are the group's ConfigMaps' resourceVersions, by name.
func configMapVersions(t *testing.T, c client.Client) map[string]string {
	t.Helper()
	list := &corev1.ConfigMapList{}
	if err := c.List(context.Background(), list, client.InNamespace("ns")); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, cm := range list.Items {
		out[cm.Name] = cm.ResourceVersion
	}
	return out
}

// changedVersions counts the ConfigMaps written (or created) between two configMapVersions.
func changedVersions(before, after map[string]string) int {
	n := 0
	for name, v := range after {
		if before[name] != v {
			n++
		}
	}
	return n
}

// laggingCache is a cache that has not seen any shard but the first yet.
type laggingCache struct{ client.Client }

func (c laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.ConfigMap); ok && key.Name != (proxies.Group{Name: "pg"}).ConfigMap() {
		return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// A shard the cache does not show yet is neither taken as empty nor overwritten: the writer
// uses what it wrote last, or reads the API again.
func TestGroupWriterCacheLag(t *testing.T) {
	const bound = 4 << 10
	_, api := shardedWriter(t, bound)
	w := newGroupWriter(laggingCache{api}, api, "ns", bound)
	for batch := range 20 {
		if batch%5 == 4 {
			w.last = kit.LastWritten[*corev1.ConfigMap]{} // as after a failed flush
		}
		var changes []func(*groupShards)
		for j := range 10 {
			name := fmt.Sprintf("svc:site-%03d", batch*10+j)
			changes = append(changes, func(g *groupShards) { g.setServe(name, webEntry("/"), "Ingress/apps/"+name) })
		}
		for i, err := range w.flush("pg", changes) {
			if err != nil {
				t.Fatalf("batch %d, change %d: %v", batch, i, err)
			}
		}
	}
	if _, docs := storedShards(t, api, bound); len(docs.Serve.Services) != 200 {
		t.Errorf("%d of 200 entries stored", len(docs.Serve.Services))
	}
}

// Growing adds one shard at a time and writes the new one and shard 0 (the count) only; the
// other shards keep what they hold.
func TestGroupWriterGrowsOneShardAtATime(t *testing.T) {
	const bound = 4 << 10
	w, c := shardedWriter(t, bound)
	counts := map[int]bool{}
	for i := range 300 {
		before := configMapVersions(t, c)
		name := fmt.Sprintf("svc:site-%03d", i)
		if err := w.flush("pg", []func(*groupShards){func(g *groupShards) { g.setServe(name, webEntry("/"+name), "Ingress/apps/"+name) }})[0]; err != nil {
			t.Fatal(err)
		}
		after := configMapVersions(t, c)
		counts[len(after)] = true
		rewritten := changedVersions(before, after)
		switch {
		case len(after) == len(before) && rewritten != 1:
			t.Errorf("entry %d: %d shards written; want the one it went to", i, rewritten)
		case len(after) != len(before) && (len(after) != len(before)+1 || rewritten != 2):
			t.Errorf("entry %d: from %d shards to %d, writing %d; want one more, written with shard 0", i, len(before), len(after), rewritten)
		}
	}
	cms, docs := storedShards(t, c, bound)
	if len(docs.Serve.Services) != 300 {
		t.Errorf("%d of 300 entries stored", len(docs.Serve.Services))
	}
	if len(cms) < 6 || !counts[5] || !counts[6] {
		t.Errorf("300 entries in %d shards, through the counts %v: the test wants growth past counts that are not powers of two", len(cms), counts)
	}
	// Full shards: no more than one more than the entries' bytes need.
	total := 0
	for _, cm := range cms {
		total += dataSize(cm.Data, nil, nil)
	}
	if need := (total + bound - 1) / bound; len(cms) > need+1 {
		t.Errorf("%d bytes in %d shards of %d; %d would hold them", total, len(cms), bound, need)
	}
}

// An entry grown past what its shard can hold moves, with half the shard's others, to a new
// shard: written first, then shard 0 counts it, then the old one drops them.
func TestGroupWriterRelievesAFullShard(t *testing.T) {
	const bound = 4 << 10
	w, c := shardedWriter(t, bound)
	name := func(i int) string { return fmt.Sprintf("svc:site-%03d", i) }
	for i := range 20 {
		if err := w.flush("pg", []func(*groupShards){func(g *groupShards) { g.setServe(name(i), webEntry("/"+name(i)), "Ingress/apps/"+name(i)) }})[0]; err != nil {
			t.Fatal(err)
		}
	}
	cms, _ := storedShards(t, c, bound)
	last := decodeGroup(cms[len(cms)-1]).names()
	slices.Sort(last)
	grown := last[len(last)-1]
	big := webEntry("/" + strings.Repeat("x", bound/3))
	if err := w.flush("pg", []func(*groupShards){func(g *groupShards) { g.setServe(grown, big, "Ingress/apps/"+grown) }})[0]; err != nil {
		t.Fatal(err)
	}
	after, docs := storedShards(t, c, bound)
	if len(after) != len(cms)+1 {
		t.Fatalf("%d shards after growing an entry of %d; want %d", len(after), len(cms), len(cms)+1)
	}
	if got := docs.Serve.Services[grown]; len(got.Routes) != 1 || got.Routes[0].Path != big.Routes[0].Path {
		t.Errorf("%s: %+v", grown, got)
	}
	if len(docs.Serve.Services) != 20 {
		t.Errorf("%d of 20 entries stored", len(docs.Serve.Services))
	}
}

// A group document made unreadable (a hand edit leaving only a future version) is rebuilt from
// the last one the writer read, so that the first change written after it keeps the other
// owners' entries: written with only its own, the replicas would withdraw the others.
func TestGroupWriterRebuildsUnreadableDocumentFromLastRead(t *testing.T) {
	w, c := shardedWriter(t, 1<<20)
	ctx := context.Background()
	set := func(name string) func(*groupShards) {
		return func(g *groupShards) { g.setServe(name, webEntry("/"+name), "Ingress/apps/"+name) }
	}
	for _, err := range w.flush("pg", []func(*groupShards){set("svc:a"), set("svc:b")}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: proxies.Group{Name: "pg"}.ConfigMap()}, cm); err != nil {
		t.Fatal(err)
	}
	for k := range cm.Data {
		if strings.HasPrefix(k, "serve-config.") {
			delete(cm.Data, k)
		}
	}
	cm.Data["serve-config.v99.json"] = `{"version":99}`
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	for _, err := range w.flush("pg", []func(*groupShards){set("svc:c")}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	_, docs := storedShards(t, c, 1<<20)
	for _, name := range []string{"svc:a", "svc:b", "svc:c"} {
		if _, ok := docs.Serve.Services[name]; !ok {
			t.Errorf("%s is missing from the rewritten document: %v", name, slices.Sorted(maps.Keys(docs.Serve.Services)))
		}
	}
}

// A change the documents already hold takes no turn at the writer; any other does: another
// owner, another entry, a document this build cannot read, an entry removed by someone else.
func TestGroupDocsSkipWhatTheyHold(t *testing.T) {
	w, c := shardedWriter(t, 4<<10)
	ctx := context.Background()
	d := documents{Client: c, Namespace: "ns", W: w}
	flushes := 0
	flush := w.batch.Flush
	w.batch.Flush = func(key string, batch []func(*groupShards)) []error {
		flushes++
		return flush(key, batch)
	}
	name := func(i int) string { return fmt.Sprintf("svc:site-%03d", i) }
	for i := range 40 {
		if err := d.setServeDoc(ctx, "pg", name(i), webEntry("/"+name(i)), "Ingress/apps/"+name(i)); err != nil {
			t.Fatal(err)
		}
		if err := d.setDNATDoc(ctx, "pg", name(i), &contract.DNATService{VIPs: []string{"100.100.0.1"}, Destination: contract.Destination{DNSName: "db.apps.svc"}}, "Ingress/apps/"+name(i)); err != nil {
			t.Fatal(err)
		}
	}
	if cms, _ := storedShards(t, c, 4<<10); len(cms) < 2 {
		t.Fatalf("%d shards; the test wants several", len(cms))
	}
	step := func(what string, wantFlush bool, set func() error) {
		t.Helper()
		before := flushes
		if err := set(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := flushes > before; got != wantFlush {
			t.Errorf("%s: written %v, want %v", what, got, wantFlush)
		}
	}
	for i := range 40 {
		step("the same Serve entry", false, func() error {
			return d.setServeDoc(ctx, "pg", name(i), webEntry("/"+name(i)), "Ingress/apps/"+name(i))
		})
		step("the same DNAT entry", false, func() error {
			return d.setDNATDoc(ctx, "pg", name(i), &contract.DNATService{VIPs: []string{"100.100.0.1"}, Destination: contract.Destination{DNSName: "db.apps.svc"}}, "Ingress/apps/"+name(i))
		})
	}
	step("another owner", true, func() error { return d.setServeDoc(ctx, "pg", name(1), webEntry("/"+name(1)), "Ingress/other/x") })
	step("another entry", true, func() error { return d.setServeDoc(ctx, "pg", name(2), webEntry("/changed"), "Ingress/apps/"+name(2)) })
	step("another DNAT entry", true, func() error {
		return d.setDNATDoc(ctx, "pg", name(3), &contract.DNATService{VIPs: []string{"100.100.0.2"}, Destination: contract.Destination{DNSName: "db.apps.svc"}}, "Ingress/apps/"+name(3))
	})

	// Removed by another writer, then edited by hand into a version this build cannot read.
	for _, err := range w.flush("pg", []func(*groupShards){func(g *groupShards) { g.setServe(name(4), nil, "") }}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	step("an entry removed", true, func() error { return d.setServeDoc(ctx, "pg", name(4), webEntry("/"+name(4)), "Ingress/apps/"+name(4)) })
	var cm *corev1.ConfigMap
	for _, shard := range mustShards(t, c) {
		if decodeGroup(shard).has(name(5)) {
			cm = shard
		}
	}
	if cm == nil {
		t.Fatalf("no shard holds %s", name(5))
	}
	cm.Data["dnat-config.v99.json"] = `{"version":99}`
	for k := range cm.Data {
		if strings.HasPrefix(k, "dnat-config.v") && k != "dnat-config.v99.json" {
			delete(cm.Data, k)
		}
	}
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	step("a document this build cannot read", true, func() error {
		return d.setServeDoc(ctx, "pg", name(5), webEntry("/"+name(5)), "Ingress/apps/"+name(5))
	})
}

func mustShards(t *testing.T, c client.Client) []*corev1.ConfigMap {
	t.Helper()
	cms, _ := storedShards(t, c, 4<<10)
	return cms
}

// Readers at two versions in turn (the cache, and the writer's last write ahead of it) find
// both decoded; only versions beyond keptVersions are dropped.
func TestGroupWriterKeepsRecentVersions(t *testing.T) {
	w := newGroupWriter(nil, nil, "ns", 0)
	at := func(rv int) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: proxies.Group{Name: "pg"}.ConfigMap(), ResourceVersion: fmt.Sprint(rv)}}
	}
	a, b := w.content(at(1)), w.content(at(2))
	for range 3 {
		if w.content(at(1)) != a || w.content(at(2)) != b {
			t.Fatal("a version read in turn with another was decoded again")
		}
	}
	for rv := 3; rv < 3+keptVersions; rv++ {
		w.content(at(rv))
	}
	if w.content(at(1)) == a {
		t.Errorf("more than %d versions kept", keptVersions)
	}
}

// An object's entries are known to be alone only where its last pass left them: a move to
// another group, a new name or a new object of the same name (another UID) searches again,
// and so does every pass after the object leaves its group.
func TestPlacementRemembered(t *testing.T) {
	w, _ := shardedWriter(t, 4<<10)
	d := documents{W: w}
	const owner = "Ingress/apps/web"
	at := placement{UID: "uid-1", PG: "pg", SvcName: "svc:web"}
	if d.placedAt(owner, at) {
		t.Fatal("placed before any pass")
	}
	d.place(owner, at)
	for _, c := range []struct {
		name string
		p    placement
		want bool
	}{
		{"same object, group and name", at, true},
		{"moved to another group", placement{UID: "uid-1", PG: "pg2", SvcName: "svc:web"}, false},
		{"renamed", placement{UID: "uid-1", PG: "pg", SvcName: "svc:site"}, false},
		{"created again under its name", placement{UID: "uid-2", PG: "pg", SvcName: "svc:web"}, false},
	} {
		if got := d.placedAt(owner, c.p); got != c.want {
			t.Errorf("%s: placedAt = %t, want %t", c.name, got, c.want)
		}
	}
	if d.placedAt("Service/apps/web", at) {
		t.Error("another owner found placed")
	}
	d.unplace(owner)
	if d.placedAt(owner, at) {
		t.Error("still placed after leaving its group")
	}
}
