package proxy

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"tailscale.com/envknob"
	"tailscale.com/net/tshttpproxy"
)

func TestTailscaleControl(t *testing.T) {
	for u, want := range map[string]bool{
		"":                                   true,
		"https://controlplane.tailscale.com": true,
		"https://login.tailscale.com/":       true,
		"https://headscale.example.com":      false,
		"http://127.0.0.1:8080":              false,
		"https://tailscale.com.example.org":  false,
		"https://nottailscale.com":           false,
	} {
		if got := tailscaleControl(u); got != want {
			t.Errorf("tailscaleControl(%q) = %v, want %v", u, got, want)
		}
	}
}

// With another control server, the tailnet client's HTTP clients (which all ask tshttpproxy)
// fail every request to a Tailscale host before connecting, and log upload is off; other hosts
// are left alone. The setting outlives the test: every proxy of this test binary has a local
// control server anyway.
func TestLimitTailscaleContact(t *testing.T) {
	limitTailscaleContact("http://127.0.0.1:1", slog.New(slog.DiscardHandler))
	if !envknob.NoLogsNoSupport() {
		t.Error("log upload still allowed")
	}
	for _, u := range []string{"https://derp1.tailscale.com/bootstrap-dns?q=headscale.example.com", "https://log.tailscale.com/c/x", "https://LOG.tailscale.io./"} {
		req, err := http.NewRequest("GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p, err := tshttpproxy.ProxyFromEnvironment(req); err == nil || !strings.Contains(err.Error(), "not Tailscale's") {
			t.Errorf("request to %s: proxy %v, error %v; want refused", u, p, err)
		}
	}
	req, _ := http.NewRequest("GET", "https://headscale.example.com/key", nil)
	if p, err := tshttpproxy.ProxyFromEnvironment(req); err != nil || p != nil {
		t.Errorf("request to the control server: proxy %v, error %v; want direct", p, err)
	}
}
