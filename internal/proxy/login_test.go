package proxy_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// A proxy whose auth key cannot log it in (here: revoked) waits for an interactive login: it
// reports so in its state (login) and readiness, and prints no login URL.
func TestWaitsForLoginWithoutItsURL(t *testing.T) {
	w := newWorld(t)
	key := w.mintKey(t)
	if err := w.api.DeleteAuthKey(t.Context(), key.ID); err != nil {
		t.Fatal(err)
	}
	dir, stateDir := t.TempDir(), t.TempDir()
	proxytest.WriteConfig(t, dir, w.config(key.Secret.Reveal(), contract.WebService{Routes: w.routes()}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	health, done := w.start(t, ctx, proxy.Options{ConfigDir: dir, StateDir: stateDir})
	var state map[string]string
	eventually(t, "the state reports the login it waits for", func() bool {
		b, err := os.ReadFile(filepath.Join(stateDir, "web-0", "proxy-state.json"))
		return err == nil && json.Unmarshal(b, &state) == nil && state[contract.StateLogin] == contract.LoginNeeded
	})
	if msg := readyz(t, health); !strings.Contains(msg, "interactive login") {
		t.Errorf("readiness %q, want it to say the proxy waits for an interactive login", msg)
	}
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// A proxy with a usable key does not report a login it waits for on its way up.
func TestNoLoginWaitWithAKey(t *testing.T) {
	w := newWorld(t)
	dir, stateDir := t.TempDir(), t.TempDir()
	proxytest.WriteConfig(t, dir, w.config(w.mintKey(t).Secret.Reveal(), contract.WebService{Routes: w.routes()}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, done := w.startFromDir(t, ctx, dir, stateDir)
	b, err := os.ReadFile(filepath.Join(stateDir, "web-0", "proxy-state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var state map[string]string
	if err := json.Unmarshal(b, &state); err != nil || state[contract.StateLogin] != "" || state[contract.StateDeviceID] == "" {
		t.Errorf("state %s (%v): want the device, no login waited for", b, err)
	}
	if strings.Contains(w.logs.String(), "interactive login") {
		t.Errorf("a proxy logging in with its key said it waits for an interactive login:\n%s", w.logs.String())
	}
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// A proxy without a key, on a fresh state, gets a login URL from the control server, as from
// Tailscale's: it reports the wait, and its logs, verbose ones included, withhold the URL.
func TestLoginURLNeverLogged(t *testing.T) {
	w := newWorld(t)
	dir, stateDir := t.TempDir(), t.TempDir()
	proxytest.WriteConfig(t, dir, w.config("", contract.WebService{Routes: w.routes()}))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, done := w.start(t, ctx, proxy.Options{ConfigDir: dir, StateDir: stateDir})
	eventually(t, "the state reports the login it waits for", func() bool {
		b, err := os.ReadFile(filepath.Join(stateDir, "web-0", "proxy-state.json"))
		var state map[string]string
		return err == nil && json.Unmarshal(b, &state) == nil && state[contract.StateLogin] == contract.LoginNeeded
	})
	eventually(t, "tsnet's line about the login", func() bool { return strings.Contains(w.logs.String(), "To start this tsnet server") })
	cancel()
	if err := waitDone(t, done); err != nil {
		t.Errorf("Run: %v", err)
	}
	if logs := w.logs.String(); strings.Contains(logs, w.lt.ControlURL+"/a/") || !strings.Contains(logs, "go to: [login URL withheld]") {
		t.Errorf("the login URL is in the proxy's logs, or tsnet's line does not withhold it:\n%s", logs)
	}
}
