package secretstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/secretstore"
)

// replicaReport is what a replica of a group of n Ingresses and n L3 Services reports once
// it serves them all.
func replicaReport(n int) *contract.ProxyState {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	st := &contract.ProxyState{DeviceID: "n1", FQDN: "pg-0.tailnet.test", TailnetIPs: []string{"100.64.0.1", "fd7a:115c:a1e0::1"},
		ConfigVersion: 3, PodUID: "pod-1", ProxyVersion: "v1", Certificates: map[string]contract.CertificateStatus{},
		Firewall: &contract.FirewallStatus{Mode: contract.FirewallNFTables, PodUID: "pod-1", Mappings: map[string]contract.AppliedDNAT{}}}
	for i := range n {
		web, db := fmt.Sprintf("web-%05d", i), fmt.Sprintf("db-%05d", i)
		st.Advertised = append(st.Advertised, "svc:"+web, "svc:"+db)
		st.Certificates[web+".tailnet.test"] = contract.CertificateStatus{Source: contract.CertSourceACME,
			Serial: fmt.Sprintf("%036x", i), NotBefore: now, NotAfter: now.Add(90 * 24 * time.Hour)}
		st.Firewall.Mappings["svc:"+db] = contract.AppliedDNAT{TailnetIPs: []string{"100.100.0.1", "fd7a:115c:a1e0::1"},
			Destinations: []string{"10.96.0.1"}}
	}
	slices.Sort(st.Advertised)
	return st
}

// reportWorld is a fake API with a replica's state Secret and the Secrets of its report's
// shards, recording the Secrets each write patched.
type reportWorld struct {
	kube *fake.Clientset
	mu   sync.Mutex
	// patched lists the Secrets patched, by write.
	patched []string
}

func newReportWorld(t *testing.T, shards int) *reportWorld {
	var objs []runtime.Object
	for k := range shards {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: contract.ReportShardName("pg-0", k)}})
	}
	w := &reportWorld{kube: fake.NewClientset(objs...)}
	w.kube.PrependReactor("patch", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.patched = append(w.patched, a.(k8stesting.PatchAction).GetName())
		return false, nil, nil
	})
	return w
}

func (w *reportWorld) takePatched() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.patched
	w.patched = nil
	return out
}

// stored reads the report as the operator does, and the size of its largest Secret.
func (w *reportWorld) stored(t *testing.T) (*contract.ProxyState, int) {
	t.Helper()
	secrets := w.kube.CoreV1().Secrets(ns)
	first, err := secrets.Get(t.Context(), "pg-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	count, err := contract.ReportShardCount(first.Data)
	if err != nil {
		t.Fatal(err)
	}
	shards, largest := []map[string][]byte{first.Data}, secretBytes(first)
	for k := 1; k < count; k++ {
		s, err := secrets.Get(t.Context(), contract.ReportShardName("pg-0", k), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		shards, largest = append(shards, s.Data), max(largest, secretBytes(s))
	}
	st, err := contract.ParseReport(shards)
	if err != nil {
		t.Fatal(err)
	}
	return st, largest
}

func secretBytes(s *corev1.Secret) int {
	n := 0
	for k, v := range s.Data {
		n += len(k) + len(v)
	}
	return n
}

func report(t *testing.T, st *secretstore.Store, state *contract.ProxyState) {
	t.Helper()
	data, err := state.Data()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Report(t.Context(), data); err != nil {
		t.Fatal(err)
	}
}

func sameReport(t *testing.T, got, want *contract.ProxyState) {
	t.Helper()
	a, err := got.Data()
	if err != nil {
		t.Fatal(err)
	}
	b, err := want.Data()
	if err != nil {
		t.Fatal(err)
	}
	for k := range b {
		if string(a[k]) != string(b[k]) {
			t.Errorf("key %s: read %.200q…, reported %.200q…", k, a[k], b[k])
		}
	}
}

func TestReportOfALargeGroup(t *testing.T) {
	// 5,000 Ingresses and 5,000 Services: over 1 MiB in one Secret, over the 32 Secrets their
	// documents take (32 shards of at most 128 KiB) each under 256 KiB.
	const shards = 32
	state := replicaReport(5000)
	data, err := state.Data()
	if err != nil {
		t.Fatal(err)
	}
	whole := 0
	for k, v := range data {
		whole += len(k) + len(v)
	}
	if whole <= 1<<20 {
		t.Fatalf("the unsharded report is %d bytes; the test wants one over the 1 MiB Secret limit", whole)
	}
	w := newReportWorld(t, shards)
	st, err := secretstore.New(t.Context(), w.kube.CoreV1().Secrets(ns), "pg-0")
	if err != nil {
		t.Fatal(err)
	}
	st.SetReportShards(shards)
	report(t, st, state)
	got, largest := w.stored(t)
	sameReport(t, got, state)
	if largest > 256<<10 {
		t.Errorf("the largest Secret of the report holds %d bytes, over 256 KiB", largest)
	}
	t.Logf("%d bytes unsharded; the largest of %d shards %d bytes", whole, shards, largest)
	if n := len(w.takePatched()); n != shards {
		t.Errorf("the first report made %d writes; want one per shard, %d", n, shards)
	}

	// One certificate renewed: one write, of its shard alone.
	name := "web-00042.tailnet.test"
	c := state.Certificates[name]
	c.Serial = "ff"
	state.Certificates[name] = c
	report(t, st, state)
	want := contract.ReportShardName("pg-0", contract.ShardOf(contract.ReportService(name), shards))
	if got := w.takePatched(); !slices.Equal(got, []string{want}) {
		t.Errorf("a renewal wrote %v; want %s only", got, want)
	}
	// Nothing changed: nothing written.
	report(t, st, state)
	if got := w.takePatched(); len(got) > 0 {
		t.Errorf("an unchanged report wrote %v", got)
	}
	got, _ = w.stored(t)
	sameReport(t, got, state)
}

func TestReportShardsGrow(t *testing.T) {
	w := newReportWorld(t, 8)
	st, err := secretstore.New(t.Context(), w.kube.CoreV1().Secrets(ns), "pg-0")
	if err != nil {
		t.Fatal(err)
	}
	state := replicaReport(100)
	st.SetReportShards(4)
	report(t, st, state)
	w.takePatched()

	// From 4 shards to 8: the new shards first, then the index, then the shards that lost
	// entries, so that a reader never counts a shard whose entries are not written yet.
	if !st.SetReportShards(8) {
		t.Error("SetReportShards(8) after 4 says nothing changed")
	}
	if st.SetReportShards(8) {
		t.Error("SetReportShards(8) twice says it changed")
	}
	report(t, st, state)
	patched := w.takePatched()
	at := slices.Index(patched, "pg-0")
	if at < 0 {
		t.Fatalf("the state Secret, with the index, was not written: %v", patched)
	}
	for i, name := range patched {
		k := 0
		if name != "pg-0" {
			if _, err := fmt.Sscanf(name, "pg-0-report%d", &k); err != nil {
				t.Fatal(err)
			}
		}
		if (k >= 4) != (i < at) {
			t.Errorf("written in the order %v: the new shards (4 to 7) must come before the state Secret, the old ones after", patched)
			break
		}
	}
	got, _ := w.stored(t)
	sameReport(t, got, state)
}

func TestReportWithoutShardSecrets(t *testing.T) {
	// An operator that made no Secrets for the shards (yet): the report goes whole into the
	// state Secret, without an index.
	w := newReportWorld(t, 1)
	st, err := secretstore.New(t.Context(), w.kube.CoreV1().Secrets(ns), "pg-0")
	if err != nil {
		t.Fatal(err)
	}
	st.SetReportShards(4)
	state := replicaReport(20)
	data, err := state.Data()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Report(t.Context(), data); !errors.Is(err, secretstore.ErrWrittenWhole) {
		t.Errorf("a report written whole for want of its shards' Secrets: error %v, so nobody writes the shards again", err)
	}
	first, err := w.kube.CoreV1().Secrets(ns).Get(context.Background(), "pg-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := contract.ReportShardCount(first.Data); n != 1 || err != nil {
		t.Errorf("the state Secret counts %d shards (%v); want none", n, err)
	}
	got, _ := w.stored(t)
	sameReport(t, got, state)
}
