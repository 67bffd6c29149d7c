package proxytest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
)

// WriteConfig writes cfg's files to dir, where a proxy run with Options.ConfigDir reads them,
// as the operator's config Secret would be mounted. Each file is written aside and renamed into
// place, so that a proxy polling dir never reads half of one.
func WriteConfig(t testing.TB, dir string, cfg *contract.ProxyConfig) {
	t.Helper()
	data, err := contract.ProxyConfigs.Encode(cfg)
	if err != nil {
		t.Fatalf("encoding the proxy config: %v", err)
	}
	for k, v := range data {
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, v, 0o600); err != nil {
			t.Fatalf("writing the proxy config: %v", err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, k)); err != nil {
			t.Fatalf("writing the proxy config: %v", err)
		}
	}
}
