package groupstore

import (
	"context"
	"testing"
)

// holderStore is a Store whose documents hold one entry, for TakenByOtherKind.
type holderStore struct {
	Store
	svcName, owner string
}

func (h holderStore) Holder(_ context.Context, svcName string) (string, error) {
	if svcName == h.svcName {
		return h.owner, nil
	}
	return "", nil
}

func TestTakenByOtherKind(t *testing.T) {
	for _, tc := range []struct {
		kind, owner, want string
	}{
		{"Gateway", "Ingress/app/web", "Ingress app/web"},
		{"Ingress", "Gateway/app/edge", "Gateway app/edge"},
		{"Service", "Gateway/app/edge", "Gateway app/edge"},
		{"Gateway", "Service/app/db", "Service app/db"},
		{"Gateway", "Gateway/app/edge", ""}, // a Gateway's own kind: TakenBy decides
		{"Ingress", "Service/app/db", ""},   // Ingresses and Services do not hold names from each other
		{"Service", "Ingress/app/web", ""},
		{"Gateway", "", ""},
	} {
		got, err := TakenByOtherKind(context.Background(), holderStore{svcName: "svc:web", owner: tc.owner}, tc.kind, "svc:web")
		if err != nil || got != tc.want {
			t.Errorf("%s, held by %q: %q, %v; want %q", tc.kind, tc.owner, got, err, tc.want)
		}
	}
}
