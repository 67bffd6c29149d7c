package main

import (
	"fmt"
	"os"
	"time"

	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Leader election: a lease renewed every retryPeriod, given up after renewDeadline without a
// renewal. A leader that cannot renew its lease stops, and its Pod restarts. The API server may
// be gone for a minute (an upgrade, a control-plane node restart) without that: renewal may fail
// for 107s. A leader that stops cleanly (its Pod deleted) hands the lease on at once, and a
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
