package proxy

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http/httpproxy"
	"tailscale.com/envknob"
	"tailscale.com/net/tshttpproxy"
)

// A proxy contacts Tailscale's servers only when its control server is Tailscale's. With another
// one (Headscale, a private control plane) it uploads no logs (TS_NO_LOGS_NO_SUPPORT, which the
// tailnet client reads), and the HTTP clients of the tailnet client refuse every request to a
// Tailscale host: the log server, and the bootstrap DNS of Tailscale's public DERP servers,
// which the tailnet client asks when a DNS lookup of the control server fails or its address
// does not answer. Connections to the DERP servers the control server names are not HTTP
// requests of this kind, and stay as the control server says.
//
// With Tailscale's control server, logs are uploaded as tailscaled does, unless
// TS_NO_LOGS_NO_SUPPORT=true (the operator's --proxy-no-logs, or a ProxyClass's env) says not.

// tailscaleDomains are the domains of Tailscale's own servers.
var tailscaleDomains = []string{"tailscale.com", "tailscale.io"}

func isTailscaleHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, d := range tailscaleDomains {
		if host == d || strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// tailscaleControl reports whether controlURL ("" means the default) is Tailscale's.
func tailscaleControl(controlURL string) bool {
	if controlURL == "" {
		return true
	}
	u, err := url.Parse(controlURL)
	return err == nil && isTailscaleHost(u.Hostname())
}

var (
	// refuseTailscale is set once a proxy runs with another control server. It stays set for
	// the life of the process: a proxy restarts when its control server changes.
	refuseTailscale atomic.Bool
	envProxy        = sync.OnceValue(func() func(*url.URL) (*url.URL, error) { return httpproxy.FromEnvironment().ProxyFunc() })
)

func init() {
	// Before anything asks tshttpproxy, which then fixes its function for good. The rest of its
	// behaviour, HTTP(S)_PROXY and NO_PROXY, is the standard library's, as here.
	if err := tshttpproxy.SetProxyFunc(guardedProxy); err != nil {
		panic(err)
	}
}

// guardedProxy is the proxy function of the tailnet client's HTTP clients: the environment's
// proxy, or an error, which fails the request before any connection, for a Tailscale host while
// refuseTailscale is set.
func guardedProxy(u *url.URL) (*url.URL, error) {
	if refuseTailscale.Load() && isTailscaleHost(u.Hostname()) {
		return nil, fmt.Errorf("not contacting %s: this proxy's control server is not Tailscale's", u.Hostname())
	}
	return envProxy()(u)
}

// portMapperOffByDefault turns the tailnet client's port mapper off unless TS_DISABLE_PORTMAPPER
// says otherwise: it asks the default gateway for a port mapping (NAT-PMP, PCP) and multicasts
// UPnP discovery onto the gateway's network, and a Pod's gateway is its node, which offers none.
func portMapperOffByDefault() {
	if _, set := os.LookupEnv("TS_DISABLE_PORTMAPPER"); !set {
		envknob.Setenv("TS_DISABLE_PORTMAPPER", "true")
	}
}

// limitTailscaleContact sets, before the tailnet client starts, what a proxy of controlURL may
// send to Tailscale's servers.
func limitTailscaleContact(controlURL string, log *slog.Logger) {
	if tailscaleControl(controlURL) {
		log.Info("the control server is Tailscale's", "logUpload", !envknob.NoLogsNoSupport())
		return
	}
	envknob.SetNoLogsNoSupport()
	refuseTailscale.Store(true)
	log.Info("the control server is not Tailscale's: no log upload, no request to Tailscale's servers", "controlURL", controlURL)
}
