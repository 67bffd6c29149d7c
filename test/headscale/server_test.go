package headscale

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// baseDomain is the tailnet's MagicDNS domain: nodes are <host>.headscale.test.
const baseDomain = "headscale.test"

// server is a Headscale process on loopback, with its state in a temporary directory.
type server struct {
	bin    string
	config string
	URL    string // server_url: the nodes' control URL, and the embedded DERP's

	logs    *syncBuffer
	exited  chan struct{}
	waitErr error

	mu      sync.Mutex
	secrets []string // auth keys minted, scrubbed from anything the test prints
}

// headscaleBin is the binary under test. It is required rather than searched for, so that
// CI cannot pass by silently not running this test.
func headscaleBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("HEADSCALE_BIN")
	if bin == "" {
		t.Fatal("HEADSCALE_BIN is not set: run `make headscale` and set HEADSCALE_BIN=$PWD/bin/headscale " +
			"(the Headscale control server, built from source by hack/build-headscale.sh)")
	}
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		t.Fatalf("HEADSCALE_BIN=%s is not an executable (%v): run `make headscale`", bin, err)
	}
	return bin
}

// startHeadscale starts `headscale serve` on free loopback ports and waits until it answers.
// policy, if not empty, is written as its ACL policy file.
func startHeadscale(t *testing.T, policy string) *server {
	t.Helper()
	s := &server{bin: headscaleBin(t), logs: &syncBuffer{}, exited: make(chan struct{})}
	dir := t.TempDir()
	httpPort, metricsPort, grpcPort := freePort(t, "tcp"), freePort(t, "tcp"), freePort(t, "tcp")
	stunPort := freePort(t, "udp")
	s.URL = "https://127.0.0.1:" + strconv.Itoa(httpPort)
	tlsCert, tlsKey := ca.issue(t, dir)
	policyPath := ""
	if policy != "" {
		policyPath = filepath.Join(dir, "policy.hujson")
		if err := os.WriteFile(policyPath, []byte(policy), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// JSON strings are YAML strings, so %q-quoting keeps paths intact. Nothing here reaches the
	// internet: no DERP map URLs, update checks or logtail, and DNS is not overridden.
	config := fmt.Sprintf(`server_url: %q
listen_addr: "127.0.0.1:%d"
metrics_listen_addr: "127.0.0.1:%d"
grpc_listen_addr: "127.0.0.1:%d"
grpc_allow_insecure: false
tls_cert_path: %q
tls_key_path: %q
unix_socket: %q
unix_socket_permission: "0770"
disable_check_updates: true
ephemeral_node_inactivity_timeout: 30m
noise:
  private_key_path: %q
prefixes:
  v4: 100.64.0.0/10
  v6: fd7a:115c:a1e0::/48
  allocation: sequential
derp:
  server:
    enabled: true
    region_id: 999
    region_code: headscale
    region_name: Headscale embedded DERP
    verify_clients: true
    stun_listen_addr: "127.0.0.1:%d"
    private_key_path: %q
    automatically_add_embedded_derp_region: true
    ipv4: 127.0.0.1
    ipv6: ""
  urls: []
  paths: []
  auto_update_enabled: false
database:
  type: sqlite
  sqlite:
    path: %q
    write_ahead_log: true
dns:
  magic_dns: true
  base_domain: %q
  override_local_dns: false
  nameservers:
    global: []
policy:
  mode: file
  path: %q
log:
  level: info
logtail:
  enabled: false
`, s.URL, httpPort, metricsPort, grpcPort, tlsCert, tlsKey, filepath.Join(dir, "headscale.sock"),
		filepath.Join(dir, "noise_private.key"), stunPort, filepath.Join(dir, "derp_server_private.key"),
		filepath.Join(dir, "db.sqlite"), baseDomain, policyPath)
	s.config = filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(s.config, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(s.bin, "serve", "-c", s.config)
	cmd.Stdout, cmd.Stderr = s.logs, s.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	// Registered after t.TempDir, so it runs first: the process is gone before its files are.
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("headscale output:\n%s", s.scrub(tail(s.logs.String(), 8000)))
		}
	})

	deadline := time.Now().Add(60 * time.Second)
	for !s.healthy(filepath.Join(dir, "headscale.sock")) {
		select {
		case <-s.exited:
			t.Fatalf("headscale exited before it was ready (%v):\n%s", s.waitErr, tail(s.logs.String(), 8000))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("headscale did not become healthy at %s within a minute", s.URL)
		}
	}
	return s
}

// healthy reports whether both the HTTP endpoint (nodes) and the CLI socket answer.
func (s *server) healthy(socket string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	res, err := c.Get(s.URL + "/health")
	if err != nil {
		return false
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return false
	}
	_, err = os.Stat(socket)
	return err == nil
}

// cli runs a headscale CLI command against the server (over its unix socket) and returns its
// JSON output. Errors carry stderr only: stdout may hold a key.
func (s *server) cli(args ...string) ([]byte, error) {
	cmd := exec.Command(s.bin, append([]string{"-c", s.config, "-o", "json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("headscale %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

type user struct {
	ID    uint64 `json:"id"`
	Name  string `json:"name"`
	Email string `json:"email"`
}

// createUser creates a user; Headscale reports its users by this email as their login name.
func (s *server) createUser(t *testing.T, name, email, displayName string) user {
	t.Helper()
	out, err := s.cli("users", "create", name, "--email", email, "--display-name", displayName)
	if err != nil {
		t.Fatal(err)
	}
	var u user
	if err := json.Unmarshal(out, &u); err != nil || u.ID == 0 {
		t.Fatalf("users create printed %q (%v)", out, err)
	}
	return u
}

// createKey mints a pre-auth key for the user. The operator cannot do this against Headscale
// (its API is not Tailscale's), so an administrator would, as here.
func (s *server) createKey(t *testing.T, userID uint64, extra ...string) string {
	t.Helper()
	args := append([]string{"preauthkeys", "create", "--user", strconv.FormatUint(userID, 10), "--expiration", "1h"}, extra...)
	out, err := s.cli(args...)
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal(out, &k); err != nil || k.Key == "" {
		// Not the output itself: it would hold the key.
		t.Fatalf("preauthkeys create printed %d bytes without a key (%v)", len(out), err)
	}
	s.mu.Lock()
	s.secrets = append(s.secrets, k.Key)
	s.mu.Unlock()
	return k.Key
}

// node is a node as Headscale lists it.
type node struct {
	ID          uint64   `json:"id"`
	Name        string   `json:"name"`
	GivenName   string   `json:"given_name"`
	IPAddresses []string `json:"ip_addresses"`
	Online      bool     `json:"online"`
	User        user     `json:"user"`
	ForcedTags  []string `json:"forced_tags"`
	ValidTags   []string `json:"valid_tags"`
	InvalidTags []string `json:"invalid_tags"`
}

func (s *server) nodes(t *testing.T) []node {
	t.Helper()
	out, err := s.cli("nodes", "list")
	if err != nil {
		t.Fatal(err)
	}
	var ns []node
	if err := json.Unmarshal(out, &ns); err != nil {
		t.Fatalf("nodes list printed %q: %v", out, err)
	}
	return ns
}

// scrub removes the minted keys from text about to be printed.
func (s *server) scrub(text string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.secrets {
		text = strings.ReplaceAll(text, k, "REDACTED")
	}
	return text
}

// freePort returns a loopback port that was free a moment ago. Headscale takes ports only from
// its config, so a listener cannot be handed over.
func freePort(t *testing.T, network string) int {
	t.Helper()
	switch network {
	case "udp":
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	default:
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// syncBuffer collects output written from several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
