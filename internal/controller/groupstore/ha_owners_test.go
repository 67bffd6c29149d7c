package groupstore

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
)

// operatorOn is one operator's view of the Tailscale Services of a tailnet, with a fixed ID,
// on a clock the test moves.
func operatorOn(api tailnet.Client, id string, clock *time.Time) *tailscaleServices {
	return &tailscaleServices{Tailnet: api, id: id, now: func() time.Time { return *clock }}
}

func serviceOwners(t *testing.T, api tailnet.Client, name string) []string {
	t.Helper()
	svc, err := api.Service(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	var refs OwnerRefs
	if err := json.Unmarshal([]byte(svc.Annotations[AnnotationOwnerRefs]), &refs); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range refs.OwnerRefs {
		ids = append(ids, r.OperatorID)
	}
	slices.Sort(ids)
	return ids
}

// Two operators (clusters) share a Tailscale Service: both are recorded, the service carries what
// either asks for, a record dropped by a concurrent write is restored at the next check (a read
// that found all as wanted stands for serviceReadReuse, a write for nothing), and the service is
// deleted with its last owner only.
func TestSharedTailscaleService(t *testing.T) {
	_, api := localtailnettest.Start(t, localtailnet.Options{})
	ctx := t.Context()
	const name, web = "svc:web", "Ingress/shop/web"
	clock := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	east, west := operatorOn(api, "east", &clock), operatorOn(api, "west", &clock)

	claim, err := east.Ensure(ctx, name, web, []string{"tcp:443"}, []string{"tag:k8s"})
	if err != nil || !claim.Created || claim.Recheck < ownershipVerify {
		t.Fatalf("east's first claim: %+v, %v; want created, checked again soon", claim, err)
	}
	// Alone, and nothing to change: checked now and then all the same, as west may join unseen.
	claim, err = east.Ensure(ctx, name, web, []string{"tcp:443"}, []string{"tag:k8s"})
	if err != nil || claim.Recheck < defaultSharedResync {
		t.Errorf("east's check of its own service: recheck %s, %v; want %s or more", claim.Recheck, err, defaultSharedResync)
	}
	claim, err = west.Ensure(ctx, name, web, []string{"tcp:443", "tcp:80"}, []string{"tag:web"})
	if err != nil || claim.Created {
		t.Fatalf("west's claim: %+v, %v", claim, err)
	}
	if got := serviceOwners(t, api, name); !slices.Equal(got, []string{"east", "west"}) {
		t.Fatalf("owners %v", got)
	}
	if !slices.Equal(claim.Ports, []string{"tcp:443", "tcp:80"}) || !slices.Equal(claim.Tags, []string{"tag:k8s", "tag:web"}) {
		t.Errorf("shared service: ports %v, tags %v; want what either owner asks for", claim.Ports, claim.Tags)
	}
	// Nothing to change: no write, and a check now and then since the service is shared.
	claim, err = east.Ensure(ctx, name, web, []string{"tcp:443"}, []string{"tag:k8s"})
	if err != nil || claim.Recheck < defaultSharedResync {
		t.Errorf("east's check of a shared service: recheck %s, %v; want %s or more", claim.Recheck, err, defaultSharedResync)
	}

	// West writes from a read made before east's claim: east's record is gone.
	svc, _ := api.Service(ctx, name)
	svc.Annotations = map[string]string{AnnotationOwnerRefs: `{"ownerRefs":[{"operatorID":"west","ports":["tcp:443","tcp:80"],"tags":["tag:web"]}]}`}
	if _, err := api.PutService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	// East's reconciles soon after its last read reuse that read: nothing is restored yet.
	clock = clock.Add(serviceReadReuse - time.Second)
	if _, err := east.Ensure(ctx, name, web, []string{"tcp:443"}, []string{"tag:k8s"}); err != nil {
		t.Fatal(err)
	}
	if got := serviceOwners(t, api, name); !slices.Equal(got, []string{"west"}) {
		t.Fatalf("owners after east's reconcile within a read's reuse %v; want the service not read again", got)
	}
	// Asking for something else reads (and writes) at once.
	if _, err := east.Ensure(ctx, name, web, []string{"tcp:443", "tcp:8443"}, []string{"tag:k8s"}); err != nil {
		t.Fatal(err)
	}
	if got := serviceOwners(t, api, name); !slices.Equal(got, []string{"east", "west"}) {
		t.Fatalf("owners after east asked for a new port %v; want east restored", got)
	}
	svc.Annotations = map[string]string{AnnotationOwnerRefs: `{"ownerRefs":[{"operatorID":"west","ports":["tcp:443","tcp:80"],"tags":["tag:web"]}]}`}
	if _, err := api.PutService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if _, err := east.Ensure(ctx, name, web, []string{"tcp:443", "tcp:8443"}, []string{"tag:k8s"}); err != nil {
		t.Fatal(err)
	}
	if got := serviceOwners(t, api, name); !slices.Equal(got, []string{"east", "west"}) {
		t.Fatalf("owners after east's write then its check %v; want east restored (a write is no read to reuse)", got)
	}
	// Once a read is old, any reconcile reads again.
	if _, err := east.Ensure(ctx, name, web, []string{"tcp:443", "tcp:8443"}, []string{"tag:k8s"}); err != nil {
		t.Fatal(err) // a read that finds all as wanted: reused from here on
	}
	svc.Annotations = map[string]string{AnnotationOwnerRefs: `{"ownerRefs":[{"operatorID":"west","ports":["tcp:443","tcp:80"],"tags":["tag:web"]}]}`}
	if _, err := api.PutService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(serviceReadReuse)
	if _, err := east.Ensure(ctx, name, web, []string{"tcp:443", "tcp:8443"}, []string{"tag:k8s"}); err != nil {
		t.Fatal(err)
	}
	if got := serviceOwners(t, api, name); !slices.Equal(got, []string{"east", "west"}) {
		t.Fatalf("owners after east's check %v; want east restored", got)
	}
	if _, err := east.Ensure(ctx, name, web, []string{"tcp:443"}, []string{"tag:k8s"}); err != nil {
		t.Fatal(err)
	}

	// West leaves: the service stays, with east's ports and tags only.
	if err := west.Release(ctx, name, web); err != nil {
		t.Fatal(err)
	}
	svc, err = api.Service(ctx, name)
	if err != nil {
		t.Fatalf("west's release deleted the service east owns: %v", err)
	}
	if !slices.Equal(svc.Ports, []string{"tcp:443"}) || !slices.Equal(svc.Tags, []string{"tag:k8s"}) || !slices.Equal(serviceOwners(t, api, name), []string{"east"}) {
		t.Errorf("after west left: ports %v, tags %v, owners %v", svc.Ports, svc.Tags, serviceOwners(t, api, name))
	}
	// Releasing again, or by an operator that never owned it, changes nothing.
	if err := west.Release(ctx, name, web); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Service(ctx, name); err != nil {
		t.Fatalf("a second release by west deleted the service: %v", err)
	}
	if err := east.Release(ctx, name, web); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Service(ctx, name); !tailnet.IsNotFound(err) {
		t.Errorf("the service outlived its last owner: %v", err)
	}
}

// A claim is found again by the object it was made for, in the Pod that made it and in a later
// one (the operator restarted between claiming a name and entering it on a group); a release for one object leaves a name another object claimed since.
func TestClaimsFoundByTheirObject(t *testing.T) {
	_, api := localtailnettest.Start(t, localtailnet.Options{})
	ctx := t.Context()
	clock := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	const shop, blog = "Ingress/shop/web", "Ingress/blog/web"
	before := operatorOn(api, "east", &clock)
	for _, name := range []string{"svc:a", "svc:b"} {
		if _, err := before.Ensure(ctx, name, shop, []string{"tcp:443"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := before.Ensure(ctx, "svc:c", blog, []string{"tcp:443"}, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := before.claimedBy(ctx, shop); err != nil || !slices.Equal(got, []string{"svc:a", "svc:b"}) {
		t.Errorf("claims of %s in the Pod that made them: %v, %v; want a and b", shop, got, err)
	}

	after := operatorOn(api, "east", &clock)
	if got, err := after.claimedBy(ctx, shop); err != nil || !slices.Equal(got, []string{"svc:a", "svc:b"}) {
		t.Errorf("claims of %s after a restart: %v, %v; want a and b, read from the tailnet", shop, got, err)
	}
	if _, err := after.Ensure(ctx, "svc:b", blog, []string{"tcp:443"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := after.Release(ctx, "svc:b", shop); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Service(ctx, "svc:b"); err != nil {
		t.Errorf("shop's release deleted svc:b, which blog claimed since: %v", err)
	}
	if got, _ := after.claimedBy(ctx, blog); !slices.Equal(got, []string{"svc:b", "svc:c"}) {
		t.Errorf("claims of %s: %v; want b and c", blog, got)
	}
	if err := after.Release(ctx, "svc:a", shop); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Service(ctx, "svc:a"); !tailnet.IsNotFound(err) {
		t.Errorf("svc:a outlived its release: %v", err)
	}
	if got, _ := after.claimedBy(ctx, shop); len(got) != 0 {
		t.Errorf("claims of %s after its release: %v", shop, got)
	}
}

// A failed read of the operator's namespace is not remembered: the next ensure reads it again
// (it once failed every later ensure until the operator restarted).
func TestOperatorIDReadAgainAfterAFailure(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tailscale", UID: "uid-1"}}
	failures := 1
	c := fake.NewClientBuilder().WithObjects(ns).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if failures > 0 {
				failures--
				return errors.New("apiserver unavailable")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	ts := &tailscaleServices{API: c, Settings: kit.Settings{Namespace: "tailscale"}}
	if _, err := ts.operatorID(t.Context()); err == nil {
		t.Fatal("the first read failed, yet operatorID returned no error")
	}
	id, err := ts.operatorID(t.Context())
	if err != nil || id != "uid-1" {
		t.Fatalf("after the API server came back: id %q, error %v; want uid-1", id, err)
	}
}
