package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// -h shows devenv's own flags, and no flag it does not read.
func TestHelp(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-h")
	cmd.Env = append(os.Environ(), roleEnv+"=devenv")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("devenv -h: %v\n%s", err, out)
	}
	for _, want := range []string{"-once", "-v", "-logs", "Ctrl-C"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %s in:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "kubeconfig") {
		t.Errorf("a flag devenv does not read:\n%s", out)
	}
}

// A broken pipe anywhere but stdout (a proxy's connection closed by its peer, say) does not stop
// devenv; only the signals and stdout's reader going do.
func TestBrokenPipeElsewhereDoesNotStop(t *testing.T) {
	ctx, cancel := stopContext()
	defer cancel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("a write to a pipe without reader succeeded")
	}
	w.Close()
	select {
	case <-ctx.Done():
		t.Fatalf("stopped by a broken pipe on another descriptor: %v", context.Cause(ctx))
	case <-time.After(300 * time.Millisecond):
	}
}
