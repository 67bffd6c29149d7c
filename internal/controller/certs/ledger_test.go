package certs

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/acmebudget"
)

func TestLedgerSegmentNames(t *testing.T) {
	for i := range 12 {
		if got, ok := ledgerSegmentIndex(LedgerSegmentName(i)); !ok || got != i {
			t.Errorf("segment %d named %q reads as %d, %v", i, LedgerSegmentName(i), got, ok)
		}
	}
	for _, name := range []string{"tsingress-acme-ledger-0", "tsingress-acme-ledger-01", "tsingress-acme-ledger-x", "tsingress-acme-ledger-", "other"} {
		if _, ok := ledgerSegmentIndex(name); ok {
			t.Errorf("%q read as a segment", name)
		}
	}
}

func TestPlaceLedger(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	entry := func(n int, serial string) acmebudget.Entry {
		return acmebudget.Entry{Name: fmt.Sprintf("n%02d.x.ts.net", n), At: t0.Add(time.Duration(n) * time.Minute), Serial: serial, Reserved: serial == ""}
	}
	ledger := func(entries ...acmebudget.Entry) *acmebudget.Ledger {
		l := &acmebudget.Ledger{Entries: entries}
		for _, e := range entries {
			setKnown(l, e.Name, e.At)
		}
		return l
	}
	cost := entryBytes(entry(0, "")) + knownBytes(entry(0, "").Name)
	part := func(i int, l *acmebudget.Ledger) segmentPart {
		return segmentPart{index: i, bytes: len(l.Entries) * cost, ledger: l}
	}
	names := func(l *acmebudget.Ledger) []string {
		var out []string
		for _, e := range l.Entries {
			out = append(out, e.Name)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		parts []segmentPart
		other map[int]int // bytes of other domains, by segment
		next  *acmebudget.Ledger
		bound int
		want  map[int][]string // entries of the parts that changed
	}{
		{
			name:  "nothing changed, nothing written",
			parts: []segmentPart{part(0, ledger(entry(1, "a"), entry(2, "b"))), part(1, ledger(entry(3, "")))},
			next:  ledger(entry(1, "a"), entry(2, "b"), entry(3, "")),
			bound: 3 * cost,
			want:  map[int][]string{},
		},
		{
			name:  "a filled reservation rewrites its segment only",
			parts: []segmentPart{part(0, ledger(entry(1, ""), entry(2, "b"))), part(1, ledger(entry(3, "")))},
			next:  ledger(entry(1, "a"), entry(2, "b"), entry(3, "")),
			bound: 3 * cost,
			want:  map[int][]string{0: {"n01.x.ts.net", "n02.x.ts.net"}},
		},
		{
			name:  "new entries fill the first segment with room, then open one after the last",
			parts: []segmentPart{part(0, ledger(entry(1, "a"), entry(2, "b"))), part(2, ledger(entry(3, "c")))},
			next:  ledger(entry(1, "a"), entry(2, "b"), entry(3, "c"), entry(4, ""), entry(5, ""), entry(6, "")),
			bound: 3 * cost,
			want:  map[int][]string{0: {"n01.x.ts.net", "n02.x.ts.net", "n04.x.ts.net"}, 2: {"n03.x.ts.net", "n05.x.ts.net", "n06.x.ts.net"}},
		},
		{
			name:  "other domains' bytes count against the room",
			parts: []segmentPart{part(0, ledger(entry(1, "a")))},
			other: map[int]int{0: 2 * cost},
			next:  ledger(entry(1, "a"), entry(2, "")),
			bound: 3 * cost,
			want:  map[int][]string{1: {"n02.x.ts.net"}},
		},
		{
			name:  "what left the window empties its part; the room it leaves is used",
			parts: []segmentPart{part(0, ledger(entry(1, "a"), entry(2, "b"), entry(3, "c"))), part(1, ledger(entry(4, "d")))},
			next:  ledger(entry(4, "d"), entry(5, "")),
			bound: 3 * cost,
			want:  map[int][]string{0: {"n05.x.ts.net"}},
		},
		{
			name:  "segment 1 emptied",
			parts: []segmentPart{part(0, ledger(entry(1, "a"))), part(1, ledger(entry(4, "d")))},
			next:  ledger(entry(1, "a")),
			bound: 3 * cost,
			want:  map[int][]string{1: nil},
		},
		{
			name:  "no segment yet",
			next:  ledger(entry(1, "")),
			bound: 3 * cost,
			want:  map[int][]string{0: {"n01.x.ts.net"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sizes := map[int]int{}
			for _, p := range tc.parts {
				sizes[p.index] = p.bytes + tc.other[p.index]
			}
			got := placeLedger(tc.parts, sizes, tc.next, tc.bound)
			gotNames := map[int][]string{}
			for i, l := range got {
				gotNames[i] = names(l)
			}
			if !maps.EqualFunc(gotNames, tc.want, slices.Equal) {
				t.Errorf("changed parts %v; want %v", gotNames, tc.want)
			}
			// The parts written and kept hold the whole ledger once.
			all := map[int]*acmebudget.Ledger{}
			for _, p := range tc.parts {
				all[p.index] = p.ledger
			}
			maps.Copy(all, got)
			var kept []*acmebudget.Ledger
			for _, i := range slices.Sorted(maps.Keys(all)) {
				kept = append(kept, all[i])
			}
			u := acmebudget.Union(kept...)
			if !sameLedger(sortedByTime(u), tc.next) {
				t.Errorf("the segments hold %v; want %v", names(u), names(tc.next))
			}
			for i, n := range sizes {
				if n > tc.bound {
					t.Errorf("segment %d filled to %d; bound %d", i, n, tc.bound)
				}
			}
		})
	}
}

func sortedByTime(l *acmebudget.Ledger) *acmebudget.Ledger {
	l.Entries = slices.SortedFunc(slices.Values(l.Entries), func(a, b acmebudget.Entry) int { return a.At.Compare(b.At) })
	return l
}
