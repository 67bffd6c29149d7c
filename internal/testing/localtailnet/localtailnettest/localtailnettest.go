// Package localtailnettest starts a local tailnet for a test.
package localtailnettest

import (
	"context"
	"testing"

	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
)

// Start starts a local tailnet for the test, closed when it ends, and a client of its API. Not
// on the test's context: that ends before cleanups run, and nodes leave before control does.
func Start(tb testing.TB, opts localtailnet.Options) (*localtailnet.LocalTailnet, *tailnet.APIClient) {
	tb.Helper()
	lt, err := localtailnet.Start(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = lt.Close() })
	api, err := lt.APIClient(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return lt, api
}
