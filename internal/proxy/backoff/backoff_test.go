package backoff

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		min, max time.Duration
		fails    int
		want     []time.Duration // the wait returned by each failure
	}{
		{"doubles from min", time.Second, time.Minute, 4, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}},
		{"stops at max", time.Second, 5 * time.Second, 5, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}},
		{"min above max is max", time.Minute, time.Second, 2, []time.Duration{time.Second, time.Second}},
		{"fractional min", 100 * time.Millisecond, 250 * time.Millisecond, 3, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 250 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Backoff{Min: tc.min, Max: tc.max}
			if b.Due(t0) || b.Attempts() != 0 || !b.Next().IsZero() {
				t.Fatalf("a new backoff has a failure: due %t, attempts %d, next %v", b.Due(t0), b.Attempts(), b.Next())
			}
			now := t0
			for i, want := range tc.want {
				got := b.Fail(now)
				if got != want {
					t.Fatalf("failure %d: wait %v, want %v", i+1, got, want)
				}
				if b.Attempts() != i+1 || !b.Next().Equal(now.Add(want)) {
					t.Fatalf("failure %d: attempts %d next %v, want %d %v", i+1, b.Attempts(), b.Next(), i+1, now.Add(want))
				}
				if b.Due(now.Add(want-1)) || !b.Due(now.Add(want)) {
					t.Fatalf("failure %d: due before %v or not at it", i+1, want)
				}
				now = now.Add(want)
			}
			if n := b.Reset(); n != tc.fails {
				t.Fatalf("Reset returned %d attempts, want %d", n, tc.fails)
			}
			if b.Due(now) || b.Attempts() != 0 || !b.Next().IsZero() {
				t.Fatal("a reset backoff still has a failure")
			}
			if got := b.Fail(now); got != tc.want[0] {
				t.Fatalf("after a reset the wait is %v, want %v", got, tc.want[0])
			}
		})
	}
}

func TestBackoffJitter(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		fails  int
		lo, hi time.Duration // bounds of the last wait
	}{
		{"first", 1, 500 * time.Millisecond, time.Second},
		{"third", 3, 2 * time.Second, 4 * time.Second},
		{"at max", 10, 5 * time.Second, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[time.Duration]bool{}
			for range 200 {
				b := Backoff{Min: time.Second, Max: 10 * time.Second, Jitter: true}
				var wait time.Duration
				for range tc.fails {
					wait = b.Fail(t0)
				}
				if wait < tc.lo || wait > tc.hi {
					t.Fatalf("wait %v outside [%v, %v]", wait, tc.lo, tc.hi)
				}
				if !b.Next().Equal(t0.Add(wait)) {
					t.Fatalf("next %v, want %v", b.Next(), t0.Add(wait))
				}
				seen[wait] = true
			}
			if len(seen) < 2 {
				t.Fatalf("200 draws gave one wait: no jitter")
			}
		})
	}
}
