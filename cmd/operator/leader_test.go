package main

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// A process that comes back under the identity that holds a valid lease (its container
// restarted after the lease was lost while the API server was away) leads again at once;
// another identity waits for the lease to expire.
func TestRestartedLeaderTakesItsLeaseBack(t *testing.T) {
	identity, err := leaderIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := leaderIdentity(); again != identity {
		t.Fatalf("identity changed within one process: %q, then %q", identity, again)
	}
	leads := func(identity string) bool {
		now := metav1.NewMicroTime(time.Now())
		cs := fake.NewClientset(&coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tailscale", Name: "lease"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(t.Name() + "-holder"), LeaseDurationSeconds: ptr.To(int32(leaseDuration / time.Second)),
				AcquireTime: &now, RenewTime: &now},
		})
		lock, err := resourcelock.New(resourcelock.LeasesResourceLock, "tailscale", "lease", cs.CoreV1(), cs.CoordinationV1(),
			resourcelock.ResourceLockConfig{Identity: identity})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		led := make(chan struct{})
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) { close(led) }, OnStoppedLeading: func() {}},
		})
		if err != nil {
			t.Fatal(err)
		}
		go le.Run(ctx)
		select {
		case <-led:
			return true
		case <-ctx.Done():
			return false
		}
	}
	if !leads(t.Name() + "-holder") {
		t.Error("the lease's holder, back, does not lead at once")
	}
	if leads(t.Name() + "-other") {
		t.Error("another identity leads while the lease is valid")
	}
}

// controller-runtime's manager reports a lost lease with the error leaseLost knows: a manager
// that cannot renew its lease (the API server gone) stops with it, and a manager stopped otherwise does not.
func TestLeaseLostIsRecognised(t *testing.T) {
	cs := fake.NewClientset()
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, "tailscale", "lease", cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	newManager := func() manager.Manager {
		mgr, err := manager.New(&rest.Config{Host: "http://127.0.0.1:1"}, manager.Options{
			Metrics:                             metricsserver.Options{BindAddress: "0"},
			LeaderElection:                      true,
			LeaderElectionID:                    "lease",
			LeaderElectionNamespace:             "tailscale",
			LeaderElectionResourceLockInterface: lock,
			LeaseDuration:                       ptr.To(2 * time.Second),
			RenewDeadline:                       ptr.To(time.Second),
			RetryPeriod:                         ptr.To(100 * time.Millisecond),
		})
		if err != nil {
			t.Fatal(err)
		}
		return mgr
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	mgr := newManager()
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()
	select {
	case <-mgr.Elected():
	case <-ctx.Done():
		t.Fatal("never elected")
	}
	// The API server goes away: the manager cannot renew its lease.
	cs.PrependReactor("*", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	select {
	case err := <-stopped:
		if !leaseLost(err) {
			t.Errorf("a manager whose lease was taken stopped with %v, which leaseLost does not recognise", err)
		}
	case <-ctx.Done():
		t.Fatal("the manager went on after its lease was taken")
	}

	if leaseLost(nil) || leaseLost(context.Canceled) {
		t.Error("a clean stop is taken for a lost lease")
	}
}
