package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/tsingress/tsingress/internal/proxy/backoff"
)

// startBackoff spaces the tries of a start step that failed: from a second, doubling to half a
// minute, jittered so that the proxies of a cluster whose API server comes back do not all ask
// at once.
var startBackoff = backoff.Backoff{Min: time.Second, Max: 30 * time.Second, Jitter: true}

// untilDone runs a start step that needs the API server (reading the config, the state, the
// first state write) until it succeeds. A failure there is transient as a rule: the API server
// restarting, the proxy's Role not yet in effect, its config Secret not yet written. Exiting on
// one would put the Pod in the kubelet's crash back-off, which outlasts the cause by minutes.
// Meanwhile /readyz says what the proxy is waiting for. It returns the step's error only when
// it is permanent (a config this build cannot use), and ctx's once ctx ends.
func untilDone(ctx context.Context, opts Options, hl *health, what string, step func(context.Context) error) error {
	b := startBackoff
	for {
		err := step(ctx)
		if err == nil {
			if failed := b.Reset(); failed > 0 {
				opts.Logger.Info("start step done after failures", "step", what, "failures", failed)
			}
			return nil
		}
		if permanent(err) || ctx.Err() != nil {
			return err
		}
		wait := b.Fail(time.Now())
		hl.set(what + ": " + err.Error())
		opts.Logger.Warn("start step failed; trying again", "step", what, "err", err, "retryIn", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// permanent says a start error will not go away by waiting: a config the proxy read and cannot
// use (of versions this image does not read, say, which needs another image). A config not
// written yet is only late.
func permanent(err error) bool {
	_, ok := errors.AsType[*invalidConfig](err)
	return ok
}
