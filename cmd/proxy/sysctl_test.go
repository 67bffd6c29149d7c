package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
)

// sysctlChildEnv makes the test binary run `proxy sysctl` and nothing else, as the init
// container does.
const sysctlChildEnv = "TSINGRESS_TEST_RUN_SYSCTL"

func init() {
	if os.Getenv(sysctlChildEnv) != "" {
		os.Exit(run(context.Background(), []string{"sysctl"}, os.Stdout, os.Stderr))
	}
}

// forwarding reads IPv4 and IPv6 forwarding in ns, as "<v4>,<v6>".
func forwarding(t *testing.T, ns netnstest.NS) string {
	t.Helper()
	return ns.Sysctl(t, netnstest.IPv4Forwarding) + "," + ns.Sysctl(t, netnstest.IPv6Forwarding)
}

// `proxy sysctl` turns forwarding on in its network namespace, and says so; run again, it finds
// it on. With a read-only /proc/sys (no privileges) it says what stays off and still exits 0,
// so that the proxy starts and reports it.
func TestSysctl(t *testing.T) {
	ns := netnstest.New(t, "sysctl")
	ns.SetForwarding(t, false) // whatever the host has
	var out, errOut bytes.Buffer
	code := -1
	if err := netnamespace.Run(ns.Path, func() error { code = run(t.Context(), []string{"sysctl"}, &out, &errOut); return nil }); err != nil {
		t.Fatal(err)
	}
	want := "net.ipv4.ip_forward: turned on\nnet.ipv6.conf.all.forwarding: turned on\n"
	if code != 0 || out.String() != want || forwarding(t, ns) != "1,1" {
		t.Fatalf("code %d, stdout %q, stderr %q, forwarding %s; want 0, %q, 1,1", code, out.String(), errOut.String(), forwarding(t, ns), want)
	}
	out.Reset()
	if err := netnamespace.Run(ns.Path, func() error { code = run(t.Context(), []string{"sysctl"}, &out, &errOut); return nil }); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "net.ipv4.ip_forward: on already") {
		t.Errorf("second run: %q", out.String())
	}
	if code := run(t.Context(), []string{"sysctl", "extra"}, &out, &errOut); code != 2 {
		t.Errorf("extra argument: code %d", code)
	}

	t.Run("read-only", func(t *testing.T) {
		netnstest.NeedRoot(t, "unshare", "mount")
		ns.SetForwarding(t, false)
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec ip netns exec "$0" "$1"`, ns.Name, os.Args[0])
		cmd.Env = append(os.Environ(), sysctlChildEnv+"=1")
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("proxy sysctl under a read-only /proc/sys: %v: %s", err, got)
		}
		if !strings.Contains(string(got), "net.ipv4.ip_forward: off, and cannot be turned on: ") || !strings.Contains(string(got), "read-only file system") {
			t.Errorf("output %q, want IPv4 forwarding reported off with the reason", got)
		}
		if f := forwarding(t, ns); f != "0,0" {
			t.Errorf("forwarding %s, want still off", f)
		}
	})
}
