package web

import (
	"maps"
	"net/url"
	"slices"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// A reload that no longer names a server name and CA bundle (a rotated CA) drops its verified
// transport; one still named keeps its own, with its connections.
func TestVerifiedTransportsFollowTheConfig(t *testing.T) {
	oldCA, newCA := proxytest.NewCA(t).RootPEM(), proxytest.NewCA(t).RootPEM()
	tr := newTransports()
	target, _ := url.Parse("https://app.shop.svc:8443")
	apply := func(bundles ...string) map[string]bool {
		t.Helper()
		inUse := map[string]bool{}
		for _, ca := range bundles {
			_, key, err := tr.forBackend(contract.Backend{URL: target.String(), CABundle: ca}, target)
			if err != nil {
				t.Fatal(err)
			}
			inUse[key] = true
		}
		tr.keepVerifying(inUse)
		return inUse
	}
	keys := func() []string { return slices.Sorted(maps.Keys(tr.verifying)) }

	first := apply(oldCA, newCA)
	kept := tr.verifying["app.shop.svc\x00"+newCA]
	if got := keys(); len(got) != 2 || !slices.Equal(got, slices.Sorted(maps.Keys(first))) {
		t.Fatalf("two bundles: transports %q", got)
	}
	apply(newCA)
	if got := keys(); !slices.Equal(got, []string{"app.shop.svc\x00" + newCA}) {
		t.Errorf("after the old CA is gone: transports %q, want the new CA's only", got)
	}
	if tr.verifying["app.shop.svc\x00"+newCA] != kept {
		t.Error("the transport still in use was replaced")
	}
}
