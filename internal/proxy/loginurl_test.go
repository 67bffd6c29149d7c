package proxy

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
)

// The tailnet client's login URL never reaches the proxy's logs, from the lines it means for the
// user (tsnet's, every few seconds while it waits for a login) or its verbose ones; other URLs
// still do.
func TestNodeLogsWithholdLoginURL(t *testing.T) {
	const loginURL = "https://login.example.com/a/5e3f0c1d2b7a"
	var user bytes.Buffer
	var verbose strings.Builder
	opts := Options{
		Logger:      slog.New(slog.NewTextHandler(&user, nil)),
		TailnetLogf: func(format string, args ...any) { fmt.Fprintf(&verbose, format+"\n", args...) },
	}
	node := newNode(opts, &contract.ProxyConfig{Hostname: "web"}, t.TempDir(), nil)
	// As tsnet and the control client print them.
	node.UserLogf("To start this tsnet server, restart with TS_AUTHKEY set, or go to: %s", loginURL)
	node.Logf("AuthURL is %v", loginURL)
	node.Logf("RegisterResponse: %s", `{"AuthURL":"`+loginURL+`"}`)
	node.Logf("derphttp.Client.Connect: connecting to %s", "https://derp.example.com/derp")

	for name, out := range map[string]string{"the proxy's log": user.String(), "the tailnet client's verbose log": verbose.String()} {
		if strings.Contains(out, "login.example.com") {
			t.Errorf("%s carries the login URL:\n%s", name, out)
		}
	}
	if !strings.Contains(user.String(), "go to: [login URL withheld]") {
		t.Errorf("the proxy's log does not say that the node waits for a login:\n%s", user.String())
	}
	if !strings.Contains(verbose.String(), "https://derp.example.com/derp") {
		t.Errorf("a URL of no login was taken out:\n%s", verbose.String())
	}
}
