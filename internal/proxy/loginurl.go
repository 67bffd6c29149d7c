package proxy

import (
	"fmt"
	"regexp"

	"tailscale.com/types/logger"
)

// The tailnet client prints the interactive login URL while it waits for a login (no auth key,
// or a spent or revoked one), every few seconds: whoever opens it puts the node into their own
// tailnet. The proxy's logs carry no such URL; its readiness says it waits for the login.
var (
	loginLine = regexp.MustCompile(`(?i)auth ?url|go to:|visit|log ?in|register`)
	anyURL    = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"'<>]+`)
)

// withholdLoginURLs passes the tailnet client's lines to logf, with every URL taken out of a
// line about a login.
func withholdLoginURLs(logf logger.Logf) logger.Logf {
	return func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if loginLine.MatchString(msg) {
			msg = anyURL.ReplaceAllString(msg, "[login URL withheld]")
		}
		logf("%s", msg)
	}
}
