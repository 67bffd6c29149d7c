package l3

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
)

const childNetNSEnv = "TSINGRESS_L3_TEST_CHILD_NETNS"

// As in a Pod that is not privileged, /proc/sys is read-only and forwarding is off: the
// forwarder starts all the same, reports per family that forwarding is off and why, forwards
// nothing, and installs the rules on the next attempt once forwarding is on (an init container,
// in a Pod, or an operator fixing the node).
func TestForwardingOffReadOnlyProcSys(t *testing.T) {
	netnstest.NeedRoot(t, "unshare", "mount")
	t.Parallel()
	ns := netnstest.New(t, "ro")
	ns.SetForwarding(t, false)

	// The child runs in a mount namespace of its own whose /proc/sys is a read-only bind mount,
	// as a container runtime sets it up.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$0" "$@"`,
		os.Args[0], "-test.run=^TestForwardingOffChild$", "-test.v")
	cmd.Env = append(os.Environ(), childNetNSEnv+"="+ns.Path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	var out strings.Builder
	status := func(tag string) contract.FirewallStatus {
		t.Helper()
		for lines.Scan() {
			l := lines.Text()
			out.WriteString(l + "\n")
			if rest, ok := strings.CutPrefix(l, tag+" "); ok {
				var st contract.FirewallStatus
				if err := json.Unmarshal([]byte(rest), &st); err != nil {
					t.Fatalf("%s: %v", tag, err)
				}
				return st
			}
		}
		err := cmd.Wait()
		t.Fatalf("the child ended (%v) before %s:\n%s%s", err, tag, out.String(), stderr.String())
		return contract.FirewallStatus{}
	}

	off := status("OFF")
	fam := off.Families[contract.FamilyIPv4]
	if fam.Reason != contract.FamilyForwardingOff || !strings.Contains(fam.Message, "read-only file system") || !strings.Contains(fam.Message, "net.ipv4.ip_forward") {
		t.Errorf("IPv4 family status %+v, want %s naming the sysctl and the read-only file system", fam, contract.FamilyForwardingOff)
	}
	if fam := off.Families[contract.FamilyIPv6]; fam.Reason != contract.FamilyForwardingOff {
		t.Errorf("IPv6 family status %+v, want %s", fam, contract.FamilyForwardingOff)
	}
	m := off.Mappings[contract.StandaloneMapping]
	if len(m.TailnetIPs) != 0 || !strings.Contains(m.Error, "ipv4: ipv4 forwarding is off") || m.FamilyErrors[contract.FamilyIPv4] == "" {
		t.Errorf("mapping %+v, want nothing forwarded and the IPv4 forwarding error", m)
	}

	// Forwarding turned on from outside, as an init container does before the proxy starts.
	ns.SetForwarding(t, true)
	fmt.Fprintln(stdin, "on")
	on := status("ON")
	if len(on.Families) != 0 {
		t.Errorf("families %+v once forwarding is on, want none", on.Families)
	}
	if m := on.Mappings[contract.StandaloneMapping]; m.Error != "" || len(m.TailnetIPs) != 2 {
		t.Errorf("mapping %+v once forwarding is on, want both families installed", m)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("child: %v\n%s%s", err, out.String(), stderr.String())
	}
}

// TestForwardingOffChild is the child of TestForwardingOffReadOnlyProcSys; alone it does nothing.
func TestForwardingOffChild(t *testing.T) {
	path := os.Getenv(childNetNSEnv)
	if path == "" {
		t.Skip("runs as the child of TestForwardingOffReadOnlyProcSys")
	}
	ctx := t.Context()
	fwd, err := New(ctx, Options{NetNS: path, Logf: t.Logf})
	if err != nil {
		t.Fatalf("New with forwarding off: %v", err)
	}
	defer fwd.Close(context.Background())
	ips := addrs("100.64.0.1", "fd7a:115c:a1e0::1")
	if err := fwd.SetTailnetIPs(ips); err != nil {
		t.Fatalf("SetTailnetIPs: %v", err)
	}
	mappings := []Mapping{{Name: contract.StandaloneMapping, TailnetIPs: ips, Destination: contract.Destination{IPs: []string{"10.96.0.10", "fd00:96::10"}}}}
	report := func(tag string) {
		b, err := json.Marshal(fwd.Status())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%s %s\n", tag, b)
	}
	if err := fwd.SetMappings(ctx, mappings); err == nil || !strings.Contains(err.Error(), "forwarding is off") {
		t.Errorf("SetMappings with forwarding off = %v, want an error saying so", err)
	}
	report("OFF")
	if !bufio.NewScanner(os.Stdin).Scan() {
		t.Fatal("no word from the parent")
	}
	if err := fwd.SetMappings(ctx, mappings); err != nil {
		t.Errorf("SetMappings once forwarding is on: %v", err)
	}
	report("ON")
}
