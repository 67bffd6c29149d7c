package proxytest

import (
	"context"
	"testing"

	"github.com/tsingress/tsingress/internal/localtailnet"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// StartTailnet starts a local tailnet for the test, closed when it ends, and a client of its
// API. Not on the test's context: that ends before cleanups run, and nodes leave before control.
func StartTailnet(t testing.TB, opts localtailnet.Options) (*localtailnet.LocalTailnet, *tailnet.APIClient) {
	t.Helper()
	lt, err := localtailnet.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lt.Close() })
	api, err := lt.APIClient(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return lt, api
}
