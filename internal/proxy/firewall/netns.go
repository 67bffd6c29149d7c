package firewall

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// inNetNS runs fn on an OS thread that has joined the network namespace at path ("" runs fn
// directly). Sockets fn opens stay in that namespace, and processes it starts (iptables)
// inherit it, because fork copies the calling thread's namespaces. fn must not hand work to
// other goroutines that needs the namespace: they run on other threads.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: when this goroutine returns the runtime discards it,
		// so no other goroutine ever runs in the switched namespace.
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

// openNetNS opens the namespace file at path for nftables.WithNetNSFd; "" means the current
// namespace, which the library spells as fd 0.
func openNetNS(path string) (fd int, closeFn func(), err error) {
	if path == "" {
		return 0, func() {}, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, err
	}
	return int(f.Fd()), func() { f.Close() }, nil
}
