package proxy_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// A standalone proxy asked to serve its name over Funnel: it reports why not while the tailnet's
// policy does not grant the funnel attribute, serves a client on the internet once it does
// (requests marked as from Funnel, with the client's address and no tailnet identity), and
// stops when the config no longer asks.
func TestStandaloneFunnel(t *testing.T) {
	w := newWorldWith(t, localtailnet.Options{Funnel: true})
	dir, stateDir := t.TempDir(), t.TempDir()
	funnelState := func() (contract.FunnelStatus, bool) {
		b, err := os.ReadFile(filepath.Join(stateDir, "web-0", "proxy-state.json"))
		if err != nil {
			return contract.FunnelStatus{}, false
		}
		var state map[string]string
		var fs map[string]contract.FunnelStatus
		if json.Unmarshal(b, &state) != nil || json.Unmarshal([]byte(state[contract.StateFunnel]), &fs) != nil {
			return contract.FunnelStatus{}, false
		}
		st, ok := fs["web.tailnet.test"]
		return st, ok
	}
	proxytest.WriteConfig(t, dir, w.config(w.mintKey(t).Secret.Reveal(), contract.WebService{Routes: w.routes(), Funnel: true}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, done := w.startFromDir(t, ctx, dir, stateDir)
	eventually(t, "Funnel reported not permitted", func() bool {
		st, ok := funnelState()
		return ok && st.Reason == contract.FunnelNotPermitted && strings.Contains(st.Message, "funnel")
	})
	public := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: w.lt.PublicDialer(), TLSClientConfig: &tls.Config{RootCAs: w.ca.Pool()}, DisableKeepAlives: true}}
	if res, err := public.Get("https://web.tailnet.test/"); err == nil {
		res.Body.Close()
		t.Fatal("served to the internet without the policy's grant")
	}

	w.lt.SetNodeAttrs([]localtailnet.NodeAttr{{Target: []string{"tag:k8s"}, Attr: []string{"funnel"}}})
	eventually(t, "Funnel reported on", func() bool { st, _ := funnelState(); return st.Public })
	var body string
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := public.Get("https://web.tailnet.test/api/x")
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			body = fmt.Sprintf("%d %s", res.StatusCode, b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET over Funnel: %v\n%s", err, w.logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if body != "200 b /api/x" {
		t.Errorf("GET over Funnel = %q", body)
	}
	seen := w.b.seen()
	if seen.Header.Get("Tailscale-Funnel-Request") != "?1" || !strings.HasPrefix(seen.Header.Get("X-Forwarded-For"), "127.0.0.1") {
		t.Errorf("headers at the backend of a Funnel request: %v", seen.Header)
	}
	// Still served on the tailnet, with no Funnel mark.
	if r := w.get(t, "https://web.tailnet.test/api/y", nil); r.body != "b /api/y" || w.b.seen().Header.Get("Tailscale-Funnel-Request") != "" {
		t.Errorf("tailnet GET: %q, headers %v", r.body, w.b.seen().Header)
	}

	proxytest.WriteConfig(t, dir, w.config("", contract.WebService{Routes: w.routes()}))
	eventually(t, "Funnel no longer reported", func() bool { _, ok := funnelState(); return !ok })
	eventually(t, "the name gone from the internet", func() bool {
		res, err := public.Get("https://web.tailnet.test/")
		if err == nil {
			res.Body.Close()
		}
		return err != nil
	})
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Errorf("Run: %v", err)
	}
}
