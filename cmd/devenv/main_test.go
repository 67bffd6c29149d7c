package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
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
