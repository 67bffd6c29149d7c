package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestMissingFromBoundingSet(t *testing.T) {
	// The bounding set of the VM that needed this wrapper: every capability but CAP_SYS_RESOURCE (24).
	missing := missingFrom(0x1fffeffffff)
	if len(missing) != 1 || !missing["CAP_SYS_RESOURCE"] {
		t.Fatalf("missing = %v, want only CAP_SYS_RESOURCE", missing)
	}
	if got := missingFrom(0x1ffffffffff); len(got) != 0 {
		t.Fatalf("full bounding set: missing = %v, want none", got)
	}
}

func TestRewriteBundleAndProcess(t *testing.T) {
	missing := map[string]bool{"CAP_SYS_RESOURCE": true}
	dir := t.TempDir()
	config := `{"ociVersion":"1.0.2","process":{"args":["/sbin/init"],"capabilities":{
		"bounding":["CAP_NET_ADMIN","CAP_SYS_RESOURCE"],"effective":["CAP_SYS_RESOURCE"],
		"permitted":["CAP_SYS_RESOURCE","CAP_KILL"]}},"root":{"path":"rootfs"}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	process := filepath.Join(dir, "process.json")
	if err := os.WriteFile(process, []byte(`{"args":["sh"],"capabilities":{"bounding":["CAP_SYS_RESOURCE","CAP_CHOWN"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rewriteSpecs([]string{"--root", "/run/runc", "--log", "x.log", "create", "--bundle", dir, "c1"}, missing); err != nil {
		t.Fatal(err)
	}
	if err := rewriteSpecs([]string{"exec", "--process=" + process, "c1"}, missing); err != nil {
		t.Fatal(err)
	}

	var spec struct {
		OCIVersion string
		Process    struct {
			Args         []string
			Capabilities map[string][]string
		}
		Root struct{ Path string }
	}
	readJSON(t, filepath.Join(dir, "config.json"), &spec)
	want := map[string][]string{"bounding": {"CAP_NET_ADMIN"}, "effective": {}, "permitted": {"CAP_KILL"}}
	for set, caps := range want {
		if !slices.Equal(spec.Process.Capabilities[set], caps) {
			t.Errorf("config %s = %v, want %v", set, spec.Process.Capabilities[set], caps)
		}
	}
	if spec.OCIVersion != "1.0.2" || spec.Root.Path != "rootfs" || !slices.Equal(spec.Process.Args, []string{"/sbin/init"}) {
		t.Errorf("other fields changed: %+v", spec)
	}
	var proc struct{ Capabilities map[string][]string }
	readJSON(t, process, &proc)
	if !slices.Equal(proc.Capabilities["bounding"], []string{"CAP_CHOWN"}) {
		t.Errorf("process bounding = %v, want [CAP_CHOWN]", proc.Capabilities["bounding"])
	}
}

func TestOtherCommandsPassThrough(t *testing.T) {
	if err := rewriteSpecs([]string{"state", "c1"}, map[string]bool{"CAP_SYS_RESOURCE": true}); err != nil {
		t.Fatalf("state: %v", err)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatal(err)
	}
}
