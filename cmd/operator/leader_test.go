package main

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
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
