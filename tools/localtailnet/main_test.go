package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/tailnet"
)

// The command prints URLs, credential files and CA files that work, and shuts down cleanly when
// told to.
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
	line := regexp.MustCompile(`^\s+(API base URL|client ID file|client secret file|control URL|ACME directory|CA roots file|API root file):\s+(\S+)$`)
	sc := bufio.NewScanner(out)
	for sc.Scan() && len(fields) < 7 {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			fields[m[1]] = m[2]
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	if len(fields) < 7 {
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

	// The CA's directory answers over HTTPS under the printed API root, and the printed roots
	// file holds the roots of the certificates it issues.
	apiRoots, roots := x509.NewCertPool(), x509.NewCertPool()
	for pool, file := range map[*x509.CertPool]string{apiRoots: fields["API root file"], roots: fields["CA roots file"]} {
		pem, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			t.Errorf("no certificate in %s", file)
		}
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: apiRoots}}}
	res, err := hc.Get(fields["ACME directory"])
	if err != nil {
		t.Fatalf("ACME directory: %v", err)
	}
	var directory struct{ NewOrder string }
	err = json.NewDecoder(res.Body).Decode(&directory)
	res.Body.Close()
	if err != nil || directory.NewOrder == "" {
		t.Errorf("ACME directory: %v, newOrder %q", err, directory.NewOrder)
	}
	hc.CloseIdleConnections()

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

// -env-file gives scripts the settings as shell variables: complete, private, and working.
func TestEnvFile(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	envFile := filepath.Join(t.TempDir(), "tailnet.env")
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-dir", t.TempDir(), "-env-file", envFile}, io.Discard) }()

	var data []byte
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if data, err = os.ReadFile(envFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no env file after a minute: %v", err)
		}
	}
	if fi, err := os.Stat(envFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("env file mode: %v, %v; want 0600 (it holds the client secret)", fi.Mode(), err)
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z_]+)='([^']*)'$`).FindAllStringSubmatch(string(data), -1) {
		vars[m[1]] = m[2]
	}
	for _, name := range []string{"TS_CONTROL_URL", "TS_API_BASE_URL", "TS_API_CLIENT_ID", "TS_API_CLIENT_SECRET",
		"TS_DEBUG_ACME_DIRECTORY_URL", "ACME_ROOTS_FILE", "ACME_API_ROOT_FILE"} {
		if vars[name] == "" {
			t.Errorf("%s missing from the env file:\n%s", name, data)
		}
	}
	dir := t.TempDir()
	idFile, secretFile := filepath.Join(dir, "id"), filepath.Join(dir, "secret")
	if err := os.WriteFile(idFile, []byte(vars["TS_API_CLIENT_ID"]), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secretFile, []byte(vars["TS_API_CLIENT_SECRET"]), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: vars["TS_API_BASE_URL"], ClientIDFile: idFile, ClientSecretFile: secretFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}}); err != nil {
		t.Fatalf("minting a key with the env file's credentials: %v", err)
	}
	if pem, err := os.ReadFile(vars["ACME_API_ROOT_FILE"]); err != nil || !x509.NewCertPool().AppendCertsFromPEM(pem) {
		t.Errorf("ACME_API_ROOT_FILE holds no certificate: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

// With -funnel the env file names the Funnel listener and the public DNS, which answer.
func TestFunnelFlags(t *testing.T) {
	if err := run(t.Context(), []string{"-funnel-tags", "tag:k8s"}, io.Discard); err == nil {
		t.Error("-funnel-tags without -funnel was accepted")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	envFile := filepath.Join(t.TempDir(), "tailnet.env")
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-dir", t.TempDir(), "-acme=false", "-funnel", "-funnel-tags", "tag:k8s", "-env-file", envFile}, io.Discard)
	}()
	var data []byte
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if data, err = os.ReadFile(envFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no env file after a minute: %v", err)
		}
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z_]+)='([^']*)'$`).FindAllStringSubmatch(string(data), -1) {
		vars[m[1]] = m[2]
	}
	for _, name := range []string{"FUNNEL_ADDR", "PUBLIC_DNS_ADDR"} {
		c, err := net.DialTimeout("tcp", vars[name], 5*time.Second)
		if err != nil {
			t.Errorf("%s=%q: %v", name, vars[name], err)
			continue
		}
		c.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

// -admin-addr serves the test switches: the API goes down and comes back, the CA's orders are
// counted; it refuses to listen beyond loopback.
func TestAdmin(t *testing.T) {
	if err := run(t.Context(), []string{"-admin-addr", "0.0.0.0:0"}, io.Discard); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("-admin-addr on a wildcard address: %v, want refused", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	envFile := filepath.Join(t.TempDir(), "tailnet.env")
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-dir", t.TempDir(), "-env-file", envFile, "-admin-addr", "127.0.0.1:0"}, io.Discard)
	}()
	var data []byte
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if data, err = os.ReadFile(envFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no env file after a minute: %v", err)
		}
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z_]+)='([^']*)'$`).FindAllStringSubmatch(string(data), -1) {
		vars[m[1]] = m[2]
	}
	admin := vars["LOCALTAILNET_ADMIN_URL"]
	if admin == "" {
		t.Fatalf("LOCALTAILNET_ADMIN_URL missing from the env file:\n%s", data)
	}
	post := func(path string) {
		t.Helper()
		res, err := http.Post(admin+path, "", nil)
		if err != nil || res.StatusCode != http.StatusNoContent {
			t.Fatalf("POST %s: %v %v", path, res, err)
		}
		res.Body.Close()
	}
	keyStatus := func() int {
		t.Helper()
		res, err := http.Get(vars["TS_CONTROL_URL"] + "/key?v=100")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	post("/control/down")
	if s := keyStatus(); s != http.StatusServiceUnavailable {
		t.Errorf("control server down: /key answers %d", s)
	}
	post("/control/up")
	if s := keyStatus(); s != http.StatusOK {
		t.Errorf("control server up: /key answers %d", s)
	}
	res, err := http.Get(admin + "/acme/orders")
	if err != nil {
		t.Fatal(err)
	}
	var counts map[string]int
	err = json.NewDecoder(res.Body).Decode(&counts)
	res.Body.Close()
	if err != nil || counts["orders"] != 0 || counts["issued"] != 0 || len(counts) != 2 {
		t.Errorf("orders of a new CA: %v, %v", counts, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}
