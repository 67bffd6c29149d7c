package proxies

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tsingress/tsingress/internal/contract"
)

// A replica's report spread over several Secrets reads whole; one shard's change is read once
// the event handlers saw it, and a shard deleted reads as empty.
func TestReportsReadShardedReports(t *testing.T) {
	ctx := context.Background()
	g := Group{Name: "pg"}
	report := func(pod string, n int) contract.ProxyState {
		st := contract.ProxyState{PodUID: pod, DeviceID: "n-" + pod, FQDN: pod + ".tailnet.test"}
		for i := range n {
			st.Advertised = append(st.Advertised, fmt.Sprintf("svc:web-%03d", i))
		}
		return st
	}
	shardSecrets := func(i int, st contract.ProxyState, count int) []client.Object {
		data, err := st.Data()
		if err != nil {
			t.Fatal(err)
		}
		shards, err := contract.SplitReport(data, count)
		if err != nil {
			t.Fatal(err)
		}
		var objs []client.Object
		for k, d := range shards {
			name := contract.ReportShardName(g.Replicas().StateSecret(i), k)
			objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(fmt.Sprintf("uid-%s-%d", name, time.Now().UnixNano()))}, Data: d})
		}
		return objs
	}
	objs := []client.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: g.Replicas().StateSecret(0), UID: "pod-a"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: g.Replicas().StateSecret(1), UID: "pod-b"}},
	}
	objs = append(objs, shardSecrets(0, report("pod-a", 40), 4)...) // sharded
	objs = append(objs, shardSecrets(1, report("pod-b", 40), 1)...) // as a replica older than report shards writes it
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	var reports Reports
	reports.Watch() // as the group store's event handlers do
	states := func() []*contract.ProxyState {
		t.Helper()
		var states []*contract.ProxyState
		for i := range 2 {
			r, err := g.Replicas().Read(ctx, c, &reports, Where{State: "ns", Pods: []string{"ns"}}, i)
			if err != nil {
				t.Fatal(err)
			}
			states = append(states, r.State)
		}
		return states
	}

	for i, st := range states() {
		if st == nil || len(st.Advertised) != 40 {
			t.Fatalf("replica %d: %+v; want 40 services advertised", i, st)
		}
	}

	// One shard changes alone: the next read sees it.
	name := contract.ReportShardName(g.Replicas().StateSecret(0), 2)
	shard := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, shard); err != nil {
		t.Fatal(err)
	}
	part, err := contract.ParseState(shard.Data)
	if err != nil || len(part.Advertised) == 0 {
		t.Fatalf("shard 2 of 4 holds %+v (%v); the test wants some services in it", part, err)
	}
	shard.Data[contract.StateAdvertised] = nil
	if err := c.Update(ctx, shard); err != nil {
		t.Fatal(err)
	}
	// Until the event handlers see the write, the report read last stands: its shards are
	// not read again.
	if got := len(states()[0].Advertised); got != 40 {
		t.Errorf("before the handlers saw shard 2 change: %d advertised, want the 40 read before", got)
	}
	reports.Saw(shard)
	read := states()
	if got := len(read[0].Advertised); got != 40-len(part.Advertised) {
		t.Errorf("after shard 2 withdrew %d services: %d advertised", len(part.Advertised), got)
	}
	for _, svc := range part.Advertised {
		if slices.Contains(read[0].Advertised, svc) {
			t.Errorf("%s still read as advertised", svc)
		}
	}

	// A shard's Secret gone (deleted by hand): it reads as empty.
	if err := c.Delete(ctx, shard); err != nil {
		t.Fatal(err)
	}
	reports.Saw(shard)
	if got := len(states()[0].Advertised); got != 40-len(part.Advertised) {
		t.Errorf("with shard 2 gone: %d advertised, want %d", got, 40-len(part.Advertised))
	}
}

// Each version of a report Secret is parsed once, however many ask for it at once; a new
// version is parsed again, and an object without identity (not from the API server) every time.
func TestVersionedParsesEachVersionOnce(t *testing.T) {
	var c versioned[*contract.ProxyState]
	var parses atomic.Int32
	parse := func(svc string) func() (*contract.ProxyState, error) {
		return func() (*contract.ProxyState, error) {
			parses.Add(1)
			time.Sleep(10 * time.Millisecond) // long enough for the others to ask meanwhile
			return &contract.ProxyState{Advertised: []string{svc}}, nil
		}
	}
	var wg sync.WaitGroup
	got := make([]*contract.ProxyState, 16)
	for i := range got {
		wg.Go(func() { got[i], _ = c.get("s1", "10", parse("svc:a")) })
	}
	wg.Wait()
	if parses.Load() != 1 {
		t.Errorf("version 10 parsed %d times", parses.Load())
	}
	for _, st := range got {
		if st != got[0] {
			t.Fatal("callers got different parses of one version")
		}
	}
	if st, _ := c.get("s1", "11", parse("svc:b")); st == got[0] || !slices.Equal(st.Advertised, []string{"svc:b"}) || parses.Load() != 2 {
		t.Errorf("a new version read as %v after %d parses", st.Advertised, parses.Load())
	}
	_, _ = c.get("", "11", parse("svc:c"))
	_, _ = c.get("", "11", parse("svc:c"))
	if parses.Load() != 4 {
		t.Errorf("an object without a UID was kept: %d parses", parses.Load())
	}
}

func TestReportStateOf(t *testing.T) {
	for _, tc := range []struct {
		name, state string
		ok          bool
	}{
		{contract.ReportShardName("pg-0", 1), "pg-0", true},
		{contract.ReportShardName("my-report-pg-1", 12), "my-report-pg-1", true},
		{"pg-0", "", false},          // a state Secret
		{"pg-0-report0", "", false},  // shard 0 is the state Secret itself
		{"pg-0-report01", "", false}, // not a name ReportShardName gives
		{"pg-0-reportx", "", false},  // no ordinal
		{"pg-0-report-1", "", false}, // a negative one
		{"web-report", "", false},    // no ordinal at all
	} {
		state, ok := reportStateOf(tc.name)
		if state != tc.state || ok != tc.ok {
			t.Errorf("reportStateOf(%q) = %q, %t; want %q, %t", tc.name, state, ok, tc.state, tc.ok)
		}
	}
}
