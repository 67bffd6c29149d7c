package firewall

import (
	"os"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// EnableForwarding turns on IP forwarding for the families asked in the network namespace at
// netns ("" means the caller's): DNATed packets are forwarded, never delivered locally. Inside
// a network namespace these switches are the namespace's own.
func EnableForwarding(netns string, v4, v6 bool) error {
	return netnamespace.Run(netns, func() error {
		if v4 {
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
				return err
			}
		}
		if v6 {
			return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1\n"), 0o644)
		}
		return nil
	})
}
