package proxy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
)

// reporter stores the proxy's state keys (contract.ProxyState.Data) where the operator reads
// them. Empty values remove their keys.
type reporter interface {
	Report(ctx context.Context, data map[string][]byte) error
}

// fileReporter keeps the state keys in a JSON file, for a proxy running outside Kubernetes.
type fileReporter struct {
	path string
}

func (f fileReporter) Report(_ context.Context, data map[string][]byte) error {
	m := map[string]string{}
	for k, v := range data {
		if len(v) > 0 {
			m[k] = string(v)
		}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	// Replaced by rename, so that a reader never sees half a file.
	tmp, err := os.CreateTemp(filepath.Dir(f.path), ".proxy-state-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename; otherwise the write's error says why
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.path)
}
