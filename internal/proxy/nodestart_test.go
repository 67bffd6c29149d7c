package proxy

import (
	"testing"

	"tailscale.com/ipn/store/mem"
	"tailscale.com/net/netns"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
)

// A ProxyClass's tailscale.acceptRoutes reaches the node's prefs (RouteAll, off by default on
// Linux) as it starts, and a change of it restarts the proxy to set it again.
func TestAcceptRoutes(t *testing.T) {
	netns.SetEnabled(false)
	lt, _ := localtailnettest.Start(t, localtailnet.Options{})
	for _, on := range []bool{true, false} {
		node := &tsnet.Server{Dir: t.TempDir(), ControlURL: lt.ControlURL, Hostname: "p", Store: new(mem.Store), Ephemeral: true,
			Logf: logger.Discard, UserLogf: logger.Discard}
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
		lc, err := node.LocalClient()
		if err != nil {
			t.Fatal(err)
		}
		opts := Options{metrics: newProxyMetrics()}
		if err := nodeStarted(t.Context(), opts, &contract.ProxyConfig{AcceptRoutes: on}, lc); err != nil {
			t.Fatal(err)
		}
		prefs, err := lc.GetPrefs(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if prefs.RouteAll != on {
			t.Errorf("acceptRoutes %t: the node's RouteAll is %t", on, prefs.RouteAll)
		}
		node.Close()
	}
	old := &contract.ProxyConfig{Kind: contract.KindIngress, Hostname: "p"}
	changed := *old
	changed.AcceptRoutes = true
	if restartReason(old, &changed, true) == "" {
		t.Error("a change of acceptRoutes does not restart the proxy, which sets it only as the node starts")
	}
}
