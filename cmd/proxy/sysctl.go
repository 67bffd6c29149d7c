package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// forwardingSysctls are what an L3 proxy needs on in its network namespace.
var forwardingSysctls = []struct{ name, path string }{
	{"net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward"},
	{"net.ipv6.conf.all.forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"},
}

// runSysctl is `proxy sysctl`, the L3 proxy Pod's init container: it turns IP forwarding on in
// the Pod's network namespace, which only a privileged container can write. It says what it did
// and exits 0 even when a switch stays off, so that the proxy starts and reports on the Service
// what it cannot forward, instead of the Pod hanging in its init container.
func runSysctl(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "proxy sysctl: takes no arguments, got %q\n", args)
		return 2
	}
	for _, s := range forwardingSysctls {
		fmt.Fprintf(stdout, "%s: %s\n", s.name, enableSysctl(s.path))
	}
	return 0
}

// enableSysctl writes 1 to path unless it holds 1 already, and says how that went.
func enableSysctl(path string) string {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "absent (the kernel lacks this address family), left alone"
	case err != nil:
		return "cannot read it: " + err.Error()
	case strings.TrimSpace(string(b)) == "1":
		return "on already"
	}
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		return "off, and cannot be turned on: " + err.Error()
	}
	return "turned on"
}
