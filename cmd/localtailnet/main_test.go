package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/tailnet"
)

// The command prints URLs and credential files that work, and shuts down cleanly when told to.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	dir := t.TempDir()
	out, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-dir", dir, "-tags", "tag:web"}, w)
		w.Close()
	}()

	fields := map[string]string{}
	line := regexp.MustCompile(`^\s+(API base URL|client ID file|client secret file|control URL):\s+(\S+)$`)
	sc := bufio.NewScanner(out)
	for sc.Scan() && len(fields) < 4 {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			fields[m[1]] = m[2]
		}
	}
	go io.Copy(io.Discard, out)
	if len(fields) < 4 {
		t.Fatalf("output lacks URLs or files: %v", fields)
	}
	if fields["client ID file"] != filepath.Join(dir, "client_id") {
		t.Errorf("client ID file %q is not in -dir", fields["client ID file"])
	}

	c, err := tailnet.NewAPIClient(tailnet.APIConfig{
		BaseURL:          fields["API base URL"],
		ClientIDFile:     fields["client ID file"],
		ClientSecretFile: fields["client secret file"],
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:web"}}); err != nil {
		t.Fatalf("minting a key with the printed credentials: %v", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after the signal")
	}
	if res, err := http.Get(fields["control URL"] + "/key"); err == nil {
		res.Body.Close()
		t.Error("the control server still answers after shutdown")
	}
}
