package secretstore_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"tailscale.com/ipn"
	"tailscale.com/net/netns"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/secretstore"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

func TestMain(m *testing.M) {
	// In-process tailnet nodes run without privileges (no SO_MARK), as in tsnet's own tests.
	netns.SetEnabled(false)
	os.Exit(m.Run())
}

const ns = "tailscale"

func TestStore(t *testing.T) {
	env := proxytest.StartKube(t)
	secrets := env.Client.CoreV1().Secrets(ns)
	env.Secret(t, ns, "web-0", map[string][]byte{
		"proxy-config.v1.json": []byte(`{"version":1}`),
		"operator-note":        []byte("keep"),
	})
	get := func() map[string][]byte {
		t.Helper()
		s, err := secrets.Get(t.Context(), "web-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Data
	}

	t.Run("tailscale keys", func(t *testing.T) {
		st, err := secretstore.New(t.Context(), secrets, "web-0")
		if err != nil {
			t.Fatal(err)
		}
		writes := map[ipn.StateKey]string{
			"_machinekey":          "mkey",
			"profile-1a2b":         "profile",
			"web.tailnet.test.crt": "cert",
			"a/b:c":                "odd",
			"a_2fb_3ac":            "not the same as a/b:c",
			contract.StateDeviceID: "tailscale's own device_id key",
			"_empty":               "",
		}
		for k, v := range writes {
			if err := st.WriteState(k, []byte(v)); err != nil {
				t.Fatalf("WriteState(%s): %v", k, err)
			}
		}
		if err := st.WriteState("gone", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := st.WriteState("gone", nil); err != nil {
			t.Fatal(err)
		}

		data := get()
		if string(data["ts._machinekey"]) != "mkey" || string(data["ts.web.tailnet.test.crt"]) != "cert" {
			t.Errorf("tailscale keys not stored under ts.: %v", keys(data))
		}
		if _, ok := data[contract.StateDeviceID]; ok {
			t.Errorf("tailscale's %q key landed on the contract key", contract.StateDeviceID)
		}
		if _, ok := data[secretstore.SecretKey("gone")]; ok {
			t.Error("a nil write did not delete the key")
		}
		if string(data["proxy-config.v1.json"]) != `{"version":1}` || string(data["operator-note"]) != "keep" {
			t.Errorf("the operator's keys changed: %v", keys(data))
		}

		// A new store (a restarted proxy) reads what the first one wrote.
		again, err := secretstore.New(t.Context(), secrets, "web-0")
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range writes {
			got, err := again.ReadState(k)
			if err != nil || string(got) != v {
				t.Errorf("ReadState(%s) = %q, %v; want %q", k, got, err, v)
			}
		}
		if _, err := again.ReadState("gone"); !errors.Is(err, ipn.ErrStateNotExist) {
			t.Errorf("deleted key: err = %v, want ErrStateNotExist", err)
		}
		if _, err := again.ReadState("operator-note"); !errors.Is(err, ipn.ErrStateNotExist) {
			t.Errorf("the operator's keys are visible to tailscale: err = %v", err)
		}
	})

	t.Run("report", func(t *testing.T) {
		st, err := secretstore.New(t.Context(), secrets, "web-0")
		if err != nil {
			t.Fatal(err)
		}
		state := contract.ProxyState{PodUID: "uid-1", DeviceID: "nABC", TailnetIPs: []string{"100.64.0.1"}, ConfigVersion: 1}
		d, err := state.Data()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Report(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		got, err := contract.ParseState(get())
		if err != nil {
			t.Fatal(err)
		}
		if got.PodUID != "uid-1" || got.DeviceID != "nABC" || len(got.TailnetIPs) != 1 || got.ConfigVersion != 1 {
			t.Errorf("state read back = %+v", got)
		}

		// Empty values remove stale keys; the rest of the Secret stays.
		state = contract.ProxyState{PodUID: "uid-2"}
		d, _ = state.Data()
		if err := st.Report(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		data := get()
		if _, ok := data[contract.StateDeviceID]; ok || string(data[contract.StatePodUID]) != "uid-2" {
			t.Errorf("after a reset: %v", keys(data))
		}
		if string(data["ts._machinekey"]) != "mkey" || string(data["operator-note"]) != "keep" {
			t.Errorf("reporting touched other keys: %v", keys(data))
		}

		if err := st.Report(t.Context(), map[string][]byte{"ts._machinekey": nil}); err == nil {
			t.Error("Report may change the tailnet client's keys")
		}
	})

	t.Run("certificates", func(t *testing.T) {
		st, err := secretstore.New(t.Context(), secrets, "web-0")
		if err != nil {
			t.Fatal(err)
		}
		// What tailscaled's certificate flow looks for in a state store, in Kubernetes.
		var _ interface {
			ReadTLSCertAndKey(string) ([]byte, []byte, error)
			WriteTLSCertAndKey(string, []byte, []byte) error
		} = st
		if _, _, err := st.ReadTLSCertAndKey("own.tailnet.test"); !errors.Is(err, ipn.ErrStateNotExist) {
			t.Errorf("no certificate yet: err = %v, want ErrStateNotExist", err)
		}
		if err := st.WriteTLSCertAndKey("own.tailnet.test", []byte("own cert"), []byte("own key")); err != nil {
			t.Fatal(err)
		}
		// The keys of tailscaled's separate writes, so that certificates cached before stay found.
		if data := get(); string(data["ts.own.tailnet.test.crt"]) != "own cert" || string(data["ts.own.tailnet.test.key"]) != "own key" {
			t.Errorf("own certificate stored as %v", keys(data))
		}
		again, err := secretstore.New(t.Context(), secrets, "web-0")
		if err != nil {
			t.Fatal(err)
		}
		if c, k, err := again.ReadTLSCertAndKey("own.tailnet.test"); err != nil || string(c) != "own cert" || string(k) != "own key" {
			t.Errorf("after a restart: %q %q %v", c, k, err)
		}

		// A shared certificate lives in its kubernetes.io/tls Secret, created empty by the operator.
		if _, err := secrets.Create(t.Context(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "svc.tailnet.test"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: nil, corev1.TLSPrivateKeyKey: nil},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		st.ShareCert("svc.tailnet.test", "svc.tailnet.test")
		if _, _, err := st.ReadTLSCertAndKey("svc.tailnet.test"); !errors.Is(err, ipn.ErrStateNotExist) {
			t.Errorf("empty shared Secret: err = %v, want ErrStateNotExist", err)
		}
		if err := st.WriteTLSCertAndKey("svc.tailnet.test", []byte("svc cert"), []byte("svc key")); err != nil {
			t.Fatal(err)
		}
		shared, err := secrets.Get(t.Context(), "svc.tailnet.test", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(shared.Data[corev1.TLSCertKey]) != "svc cert" || string(shared.Data[corev1.TLSPrivateKeyKey]) != "svc key" {
			t.Errorf("shared Secret holds %v", keys(shared.Data))
		}
		for _, k := range keys(get()) {
			if strings.Contains(k, "svc.tailnet.test") {
				t.Errorf("the shared certificate is in the state Secret too: %s", k)
			}
		}
		// Read from the Secret, whoever wrote it last.
		shared.Data[corev1.TLSCertKey] = []byte("renewed cert")
		if _, err := secrets.Update(t.Context(), shared, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if c, _, err := st.ReadTLSCertAndKey("svc.tailnet.test"); err != nil || string(c) != "renewed cert" {
			t.Errorf("shared certificate read back: %q, %v", c, err)
		}
		st.UnshareCert("svc.tailnet.test")
		if _, _, err := st.ReadTLSCertAndKey("svc.tailnet.test"); !errors.Is(err, ipn.ErrStateNotExist) {
			t.Errorf("no longer shared: err = %v, want ErrStateNotExist from the state Secret", err)
		}
	})

	t.Run("missing secret", func(t *testing.T) {
		_, err := secretstore.New(t.Context(), secrets, "nope")
		if err == nil || !strings.Contains(err.Error(), "state Secret nope does not exist") {
			t.Errorf("err = %v", err)
		}
	})

	t.Run("restart keeps the device", func(t *testing.T) {
		testRestartKeepsDevice(t, env)
	})
}

// A node that restarts on the same Secret is the same device and needs no auth key: the
// single-use key it joined with could not be used twice anyway.
func testRestartKeepsDevice(t *testing.T, env *proxytest.Kube) {
	lt, api := localtailnettest.Start(t, localtailnet.Options{})
	key, err := api.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Expiry: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	env.Secret(t, ns, "node-0", nil)
	secrets := env.Client.CoreV1().Secrets(ns)

	up := func(authKey string) string {
		t.Helper()
		st, err := secretstore.New(t.Context(), secrets, "node-0")
		if err != nil {
			t.Fatal(err)
		}
		s := &tsnet.Server{Dir: t.TempDir(), Store: st, Hostname: "node", ControlURL: lt.ControlURL,
			AuthKey: authKey, UserLogf: t.Logf}
		defer s.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		status, err := s.Up(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return string(status.Self.ID)
	}
	first := up(key.Secret.Reveal())
	second := up("")
	if first == "" || first != second {
		t.Errorf("device after restart = %q, want %q", second, first)
	}
	devices, err := api.Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != 1 {
		t.Errorf("the tailnet has %d devices, want 1", len(devices))
	}
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
