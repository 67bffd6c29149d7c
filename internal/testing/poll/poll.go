// Package poll waits, in tests and the bench, for what nothing announces: a condition that
// another process or goroutine brings about, checked again and again.
package poll

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// firstWait is the wait after the first failed check; later waits double, up to the interval,
// so that a condition met at once is seen at once and a long wait costs few checks.
const firstWait = 10 * time.Millisecond

// testInterval is the longest wait between the checks of a test.
const testInterval = 100 * time.Millisecond

// Until calls check until it returns nil. Once timeout has passed, or ctx is done, it returns
// check's last error, saying what it waited for.
func Until(ctx context.Context, timeout, interval time.Duration, what string, check func() error) error {
	deadline := time.Now().Add(timeout)
	wait := min(firstWait, interval)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for %s: %w (last: %w)", what, ctx.Err(), err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s: %w", timeout, what, err)
		}
		time.Sleep(wait)
		wait = min(2*wait, interval)
	}
}

// Eventually fails tb with check's last error unless check returns nil within timeout.
func Eventually(tb testing.TB, timeout time.Duration, what string, check func() error) {
	tb.Helper()
	if err := Until(tb.Context(), timeout, testInterval, what, check); err != nil {
		tb.Fatal(err)
	}
}

var errFalse = errors.New("the condition does not hold")

// True fails tb unless cond holds within timeout.
func True(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	Eventually(tb, timeout, what, func() error {
		if cond() {
			return nil
		}
		return errFalse
	})
}
