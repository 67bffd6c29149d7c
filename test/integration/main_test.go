package integration

import (
	"context"
	"os"
	"testing"

	"github.com/tsingress/tsingress/internal/testing/localacme"
)

func TestMain(m *testing.M) {
	// Go loads the system roots once per process: have them trust the local CAs' API (one root
	// per process) before any test loads them, so that a test can use the local tailnet's ACME
	// CA whichever tests ran before it.
	ca, err := localacme.Start(context.Background(), localacme.Options{DNSServer: "127.0.0.1:1"})
	if err != nil {
		panic(err)
	}
	if err := ca.UseInProcess(func(k, v string) { os.Setenv(k, v) }); err != nil {
		panic(err)
	}
	ca.Close()
	os.Unsetenv("TS_DEBUG_ACME_DIRECTORY_URL")
	os.Exit(m.Run())
}
