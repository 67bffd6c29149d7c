// Package backoff is the proxy's one wait between failed attempts: it doubles from Min up to
// Max, optionally with jitter, so that proxies and replicas that fail together do not retry
// together.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Backoff tracks the failed attempts at one thing in a row. The zero value with Min and Max set
// has no failure; a success (Reset) returns to it.
type Backoff struct {
	Min, Max time.Duration
	// Jitter draws each wait from [d/2, d] for a doubled d.
	Jitter bool

	step     time.Duration // the last doubled wait, before jitter
	attempts int
	next     time.Time
}

// Fail records a failed attempt at now and returns the wait before the next one.
func (b *Backoff) Fail(now time.Time) time.Duration {
	b.attempts++
	b.step = min(max(2*b.step, b.Min), b.Max)
	wait := b.step
	if b.Jitter {
		wait = wait/2 + rand.N(wait/2+1)
	}
	b.next = now.Add(wait)
	return wait
}

// Reset records a success and returns how many attempts failed before it.
func (b *Backoff) Reset() int {
	n := b.attempts
	b.step, b.attempts, b.next = 0, 0, time.Time{}
	return n
}

// Attempts is the number of failed attempts in a row.
func (b *Backoff) Attempts() int { return b.attempts }

// Next is when the next attempt is due; zero without a failure.
func (b *Backoff) Next() time.Time { return b.next }

// Due reports whether a failed attempt is to be tried again at now.
func (b *Backoff) Due(now time.Time) bool { return b.attempts > 0 && !now.Before(b.next) }
