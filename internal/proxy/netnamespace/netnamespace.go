// Package netnamespace runs code inside a Linux network namespace, for the L3 proxy's TUN
// device and firewall rules (and for tests that place them in namespaces they create).
package netnamespace

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs fn on an OS thread that has joined the network namespace at path ("" runs fn
// directly). Sockets and devices fn creates belong to that namespace and keep working from any
// thread afterwards, and processes it starts inherit it, because fork copies the calling
// thread's namespaces. fn must not hand work that needs the namespace to other goroutines:
// they run on other threads.
func Run(path string, fn func() error) error {
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
		_ = ns.Close()
		if err != nil {
			errc <- fmt.Errorf("join network namespace %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
