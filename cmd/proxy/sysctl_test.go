package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// sysctlChildEnv makes the test binary run `proxy sysctl` and nothing else, as the init
// container does.
const sysctlChildEnv = "TSINGRESS_TEST_RUN_SYSCTL"

func init() {
	if os.Getenv(sysctlChildEnv) != "" {
		os.Exit(run(nil, []string{"sysctl"}, os.Stdout, os.Stderr))
	}
}

// newNetNS makes a network namespace for the test, with forwarding off whatever the host has.
func newNetNS(t *testing.T) (name, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root to create network namespaces")
	}
	name = fmt.Sprintf("tsproxy-%d-sysctl", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("kernel test: ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	path = "/run/netns/" + name
	setForwarding(t, path, "0")
	return name, path
}

func setForwarding(t *testing.T, path, v string) {
	t.Helper()
	err := netnamespace.Run(path, func() error {
		for _, s := range forwardingSysctls {
			if err := os.WriteFile(s.path, []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func forwarding(t *testing.T, path string) string {
	t.Helper()
	var got []string
	err := netnamespace.Run(path, func() error {
		for _, s := range forwardingSysctls {
			b, err := os.ReadFile(s.path)
			if err != nil {
				return err
			}
			got = append(got, strings.TrimSpace(string(b)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(got, ",")
}

// `proxy sysctl` turns forwarding on in its network namespace, and says so; run again, it finds
// it on. With a read-only /proc/sys (no privileges) it says what stays off and still exits 0,
// so that the proxy starts and reports it.
func TestSysctl(t *testing.T) {
	name, path := newNetNS(t)
	var out, errOut bytes.Buffer
	code := -1
	if err := netnamespace.Run(path, func() error { code = run(t.Context(), []string{"sysctl"}, &out, &errOut); return nil }); err != nil {
		t.Fatal(err)
	}
	want := "net.ipv4.ip_forward: turned on\nnet.ipv6.conf.all.forwarding: turned on\n"
	if code != 0 || out.String() != want || forwarding(t, path) != "1,1" {
		t.Fatalf("code %d, stdout %q, stderr %q, forwarding %s; want 0, %q, 1,1", code, out.String(), errOut.String(), forwarding(t, path), want)
	}
	out.Reset()
	if err := netnamespace.Run(path, func() error { code = run(t.Context(), []string{"sysctl"}, &out, &errOut); return nil }); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "net.ipv4.ip_forward: on already") {
		t.Errorf("second run: %q", out.String())
	}
	if code := run(t.Context(), []string{"sysctl", "extra"}, &out, &errOut); code != 2 {
		t.Errorf("extra argument: code %d", code)
	}

	t.Run("read-only", func(t *testing.T) {
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skip("needs unshare (util-linux)")
		}
		setForwarding(t, path, "0")
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec ip netns exec "$0" "$1"`, name, os.Args[0])
		cmd.Env = append(os.Environ(), sysctlChildEnv+"=1")
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("proxy sysctl under a read-only /proc/sys: %v: %s", err, got)
		}
		if !strings.Contains(string(got), "net.ipv4.ip_forward: off, and cannot be turned on: ") || !strings.Contains(string(got), "read-only file system") {
			t.Errorf("output %q, want IPv4 forwarding reported off with the reason", got)
		}
		if f := forwarding(t, path); f != "0,0" {
			t.Errorf("forwarding %s, want still off", f)
		}
	})
}
