package l3

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/firewall"
	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// familyNames are contract's names of the families, by familyIndex.
var familyNames = [2]string{contract.FamilyIPv4, contract.FamilyIPv6}

// familyProblems says what keeps each family from being forwarded at all: disabled in the
// namespace, forwarding off (turned on here when the namespace lets us), or the tunnel lacking
// the family's address or route (linkErrs, from the last syncLink). nil entries work.
func (f *Forwarder) familyProblems(linkErrs [2]error) [2]*contract.FamilyProblem {
	var out [2]*contract.FamilyProblem
	if msg := f.ipv6Disabled(); msg != "" {
		out[1] = &contract.FamilyProblem{Reason: contract.FamilyDisabled, Message: msg}
	}
	for i, path := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if out[i] != nil || f.sysctl(path) == "1" {
			continue
		}
		err := firewall.EnableForwarding(f.opts.NetNS, i == 0, i == 1)
		if err == nil && f.sysctl(path) == "1" {
			f.logf("l3: turned on %s forwarding", familyNames[i])
			continue
		}
		name := strings.ReplaceAll(strings.TrimPrefix(path, "/proc/sys/"), "/", ".")
		out[i] = &contract.FamilyProblem{Reason: contract.FamilyForwardingOff, Message: fmt.Sprintf(
			"%s forwarding is off (%s is not 1) and the proxy cannot turn it on (%v): run the Pod with the forwarding init container or the sysctl (docs/l3.md)",
			familyNames[i], name, errOr(err, "it stays off"))}
	}
	for i, err := range linkErrs {
		if out[i] == nil && err != nil {
			out[i] = &contract.FamilyProblem{Reason: contract.FamilyLinkFailed, Message: fmt.Sprintf("configure %s for %s: %v", f.opts.TunName, familyNames[i], err)}
		}
	}
	return out
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// ipv6Disabled says why the namespace has no IPv6, or "" when it has: the kernel was built or
// booted without it, or it is disabled for every interface or for the TUN (Docker and some CNIs
// set net.ipv6.conf.all.disable_ipv6=1 in containers).
func (f *Forwarder) ipv6Disabled() string {
	var missing bool
	err := netnamespace.Run(f.opts.NetNS, func() error {
		_, err := os.Stat("/proc/sys/net/ipv6")
		missing = errors.Is(err, fs.ErrNotExist)
		return nil
	})
	switch {
	case err != nil:
		return ""
	case missing:
		return "the kernel has no IPv6"
	case f.sysctl("/proc/sys/net/ipv6/conf/all/disable_ipv6") == "1":
		return "IPv6 is disabled in the proxy's network namespace (net.ipv6.conf.all.disable_ipv6=1)"
	case f.sysctl("/proc/sys/net/ipv6/conf/"+f.opts.TunName+"/disable_ipv6") == "1":
		return fmt.Sprintf("IPv6 is disabled on %s (net.ipv6.conf.%s.disable_ipv6=1; new interfaces take net.ipv6.conf.default.disable_ipv6)", f.opts.TunName, f.opts.TunName)
	}
	return ""
}

// sysctl reads a /proc/sys file in the forwarder's namespace; "" when it cannot.
func (f *Forwarder) sysctl(path string) string {
	var b []byte
	err := netnamespace.Run(f.opts.NetNS, func() (err error) {
		b, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
