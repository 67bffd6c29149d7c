package l3

import (
	"github.com/vishvananda/netlink"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// netlinkHandle returns a netlink handle whose sockets live in the namespace at path ("" means
// the caller's).
func netlinkHandle(path string) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := netnamespace.Run(path, func() (err error) {
		h, err = netlink.NewHandle()
		return err
	})
	return h, err
}
