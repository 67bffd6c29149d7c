package l3

import (
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inNetNS runs fn on an OS thread that has joined the network namespace at path ("" runs fn
// directly). Sockets and devices fn creates belong to that namespace and keep working from any
// thread afterwards.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime discards the thread when this goroutine returns, so no
		// other goroutine ever runs in the switched namespace.
		runtime.LockOSThread()
		ns, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET)
		ns.Close()
		if err != nil {
			errc <- fmt.Errorf("join network namespace %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// netlinkHandle returns a netlink handle whose sockets live in the namespace at path ("" means
// the caller's).
func netlinkHandle(path string) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := inNetNS(path, func() (err error) {
		h, err = netlink.NewHandle()
		return err
	})
	return h, err
}
