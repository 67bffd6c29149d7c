package poll

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		timeout time.Duration
		okAt    int // the call that succeeds, 0: none
		// wantErr is the error, given the number of calls made (the last call's error is told).
		wantErr   func(calls int) string
		wantCalls func(int) bool
	}{
		{name: "at once", ctx: context.Background(), timeout: time.Second, okAt: 1, wantCalls: func(n int) bool { return n == 1 }},
		{name: "on the third call", ctx: context.Background(), timeout: 5 * time.Second, okAt: 3, wantCalls: func(n int) bool { return n == 3 }},
		{name: "never", ctx: context.Background(), timeout: 50 * time.Millisecond,
			wantErr:   func(n int) string { return fmt.Sprintf("timed out after 50ms waiting for the thing: not yet %d", n) },
			wantCalls: func(n int) bool { return n >= 2 }},
		{name: "context done", ctx: cancelled, timeout: time.Hour,
			wantErr:   func(int) string { return "waiting for the thing: context canceled (last: not yet 1)" },
			wantCalls: func(n int) bool { return n == 1 }},
	} {
		calls := 0
		err := Until(tc.ctx, tc.timeout, 20*time.Millisecond, "the thing", func() error {
			calls++
			if calls == tc.okAt {
				return nil
			}
			return fmt.Errorf("not yet %d", calls)
		})
		switch {
		case tc.wantErr == nil && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.wantErr != nil && (err == nil || err.Error() != tc.wantErr(calls)):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr(calls))
		}
		if !tc.wantCalls(calls) {
			t.Errorf("%s: %d calls", tc.name, calls)
		}
	}
}

// fatalTB records a failure instead of ending the goroutine.
type fatalTB struct {
	testing.TB
	failed string
}

func (f *fatalTB) Helper()                  {}
func (f *fatalTB) Context() context.Context { return context.Background() }
func (f *fatalTB) Fatal(args ...any)        { f.failed = fmt.Sprint(args...) }

func TestTrue(t *testing.T) {
	held := &fatalTB{TB: t}
	n := 0
	True(held, time.Second, "n to reach 2", func() bool { n++; return n == 2 })
	if held.failed != "" || n != 2 {
		t.Errorf("a condition that holds on the second check: failed %q after %d checks", held.failed, n)
	}
	never := &fatalTB{TB: t}
	True(never, 30*time.Millisecond, "never", func() bool { return false })
	if want := "timed out after 30ms waiting for never: the condition does not hold"; never.failed != want {
		t.Errorf("a condition that never holds: failed %q, want %q", never.failed, want)
	}
}
