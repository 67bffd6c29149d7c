package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Leader election: a lease renewed every retryPeriod, given up after renewDeadline without a
// renewal. The API server may be gone for a minute (an upgrade, a control-plane node restart)
// without that: renewal may fail for 107s. A leader that loses its lease all the same stops
// reconciling and starts over as a new process image in its container (startOver). A leader that stops cleanly (its Pod deleted) hands the lease on at once, and a
// waiting replica tries every 5s, so the long lease delays a takeover only after a crash.
const (
	leaseDuration = 137 * time.Second
	renewDeadline = 107 * time.Second
	retryPeriod   = 5 * time.Second
)

// leaderIdentity names this process in the lease: the host (a Pod's name) and the process ID,
// which in a container is the same after a restart. A container restarted after its lease was
// lost (the API server away for longer than renewDeadline) is then still the lease's holder and
// takes it back at once, where a new identity would wait leaseDuration for its own old lease to
// expire. Two Pods, or two processes on one machine, still differ.
func leaderIdentity() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s_%d", host, os.Getpid()), nil
}

// leaderLock is the lease the operator's replicas elect their leader with, held as identity.
func leaderLock(cfg *rest.Config, namespace, name, identity string) (resourcelock.Interface, error) {
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	// One hung request must not use up the renewal deadline.
	cfg.Timeout = renewDeadline / 2
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	coordination, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return resourcelock.New(resourcelock.LeasesResourceLock, namespace, name, core, coordination,
		resourcelock.ResourceLockConfig{Identity: identity})
}

// leaseLost reports whether the manager stopped because its leader lease was lost: then, and
// only then, the operator starts over rather than exits. controller-runtime reports it with
// this error alone (TestLeaseLostIsRecognised keeps the two in step).
func leaseLost(err error) bool {
	return err != nil && err.Error() == "leader election lost"
}

// startOver replaces the process with a fresh run of the same binary, arguments and
// environment, keeping its process ID: every controller, cache and connection of the old run
// is gone at once (controller-runtime skips the graceful stop after a lost lease), and the
// lease identity (host and process ID) is unchanged, so the new run takes the lease back as
// soon as the API server answers if no other replica took it. Exiting instead would restart
// the container, and after a few outages put it in CrashLoopBackOff, waiting minutes to lead.
func startOver() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the operator's binary: %w", err)
	}
	return errors.Join(errors.New("starting over"), syscall.Exec(exe, os.Args, os.Environ()))
}
