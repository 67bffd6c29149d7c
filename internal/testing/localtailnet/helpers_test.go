package localtailnet_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"tailscale.com/ipn/store/mem"
	"tailscale.com/net/netns"
	"tailscale.com/tsnet"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
)

var verbose = flag.Bool("verbose-nodes", false, "log what the tsnet nodes log")

func TestMain(m *testing.M) {
	// Nodes run in-process without privileges: no SO_MARK or bind-to-device, as in tsnet's own tests.
	netns.SetEnabled(false)
	os.Exit(m.Run())
}

// logBuffer collects log lines from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) logf(format string, args ...any) {
	fmt.Fprintf(b, format+"\n", args...)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func startTailnet(t *testing.T, opts localtailnet.Options) *localtailnet.LocalTailnet {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	// Not t.Context(): that ends before cleanups run, and nodes must leave before control does.
	lt, err := localtailnet.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lt.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return lt
}

// apiClient is the operator's own backend, pointed at the local tailnet.
func apiClient(t *testing.T, lt *localtailnet.LocalTailnet, log io.Writer) *tailnet.APIClient {
	t.Helper()
	idFile, secretFile, err := lt.WriteOAuthFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := tailnet.APIConfig{BaseURL: lt.APIBaseURL, ClientIDFile: idFile, ClientSecretFile: secretFile}
	if log != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c, err := tailnet.NewAPIClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mintKey(t *testing.T, c tailnet.Client, description string) tailnet.AuthKey {
	t.Helper()
	k, err := c.CreateAuthKey(t.Context(), tailnet.AuthKeyRequest{
		Tags: []string{"tag:k8s"}, Description: description, Expiry: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newNode(lt *localtailnet.LocalTailnet, dir, hostname string, key tailnet.AuthKey, logf logger.Logf) *tsnet.Server {
	return &tsnet.Server{
		Dir:        dir,
		ControlURL: lt.ControlURL,
		Hostname:   hostname,
		Store:      new(mem.Store),
		Ephemeral:  true,
		AuthKey:    key.Secret.Reveal(),
		Logf:       logf,
		UserLogf:   logf,
	}
}

// joinNode starts a tsnet node that logs in with key and waits until it runs.
func joinNode(t *testing.T, lt *localtailnet.LocalTailnet, hostname string, key tailnet.AuthKey) *tsnet.Server {
	t.Helper()
	logf := logger.Discard
	if *verbose {
		logf = logger.WithPrefix(t.Logf, hostname+": ")
	}
	s := newNode(lt, t.TempDir(), hostname, key, logf)
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := s.Up(ctx); err != nil {
		t.Fatalf("%s: %v", hostname, err)
	}
	return s
}

// echoServer answers each connection on ln with "<greeting>: <first line>".
func echoServer(t *testing.T, ln net.Listener, greeting string) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256)
				n, _ := c.Read(buf)
				fmt.Fprintf(c, "%s: %s", greeting, buf[:n])
			}()
		}
	}()
}

// roundTrip dials addr through node, retrying until the tailnet has a path, and returns the reply.
func roundTrip(t *testing.T, node *tsnet.Server, addr, msg string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var lastErr error
	for ctx.Err() == nil {
		reply, err := func() (string, error) {
			dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
			defer dcancel()
			c, err := node.Dial(dctx, "tcp", addr)
			if err != nil {
				return "", err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := io.WriteString(c, msg); err != nil {
				return "", err
			}
			b, err := io.ReadAll(c)
			return string(b), err
		}()
		if err == nil && reply != "" {
			return reply
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no answer from %s: %v", addr, lastErr)
	return ""
}
