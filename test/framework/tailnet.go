package framework

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/tailnetdial"
)

// Tailnet is the tailnet under test: its API, through the OAuth client in TS_API_CLIENT_ID and
// TS_API_CLIENT_SECRET at TS_API_BASE_URL (Tailscale's by default), and a device of the suite's
// on it, through the control server at TS_CONTROL_URL (Tailscale's by default).
type Tailnet struct {
	API      *tailnet.APIClient
	Client   *tsnet.Server
	ClientID string // the client's device, deleted by Leave
	// Dial connects through Client over the tailnet only: tsnet's own Dial sends what the
	// tailnet does not route yet (a Tailscale Service's VIP before its host is known) through
	// this machine's network, and an HTTP client would keep whatever answers there.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// JoinTailnet makes the API client and joins the client, as tsingress-<suite>-<random>, a
// tagged device: the tailnet's policy must let tag:k8s reach tag:k8s. Its auth key is valid for
// keyExpiry.
func JoinTailnet(ctx context.Context, suite string, keyExpiry time.Duration) *Tailnet {
	GinkgoHelper()
	tn, err := Join(ctx, GinkgoT().TempDir, suite, keyExpiry)
	Expect(err).NotTo(HaveOccurred())
	return tn
}

// Join is JoinTailnet for suites that are not Ginkgo's: tempDir makes the directories it needs.
func Join(ctx context.Context, tempDir func() string, suite string, keyExpiry time.Duration) (*Tailnet, error) {
	// The credentials go to files, the form the API client reads.
	dir := tempDir()
	idFile, secretFile := filepath.Join(dir, "client_id"), filepath.Join(dir, "client_secret")
	if err := os.WriteFile(idFile, []byte(os.Getenv("TS_API_CLIENT_ID")), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(secretFile, []byte(os.Getenv("TS_API_CLIENT_SECRET")), 0o600); err != nil {
		return nil, err
	}
	api, err := tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: os.Getenv("TS_API_BASE_URL"), ClientIDFile: idFile, ClientSecretFile: secretFile})
	if err != nil {
		return nil, err
	}
	key, err := api.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Description: "tsingress " + suite + " client", Expiry: keyExpiry})
	if err != nil {
		return nil, fmt.Errorf("minting the client's auth key: %w", err)
	}
	tn := &Tailnet{API: api, Client: &tsnet.Server{
		Dir: tempDir(), Hostname: "tsingress-" + suite + "-" + strings.ToLower(rand.Text()[:6]),
		ControlURL: os.Getenv("TS_CONTROL_URL"), AuthKey: key.Secret.Reveal(), Ephemeral: true,
		UserLogf: func(string, ...any) {},
	}}
	upCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	st, err := tn.Client.Up(upCtx)
	if err != nil {
		return nil, fmt.Errorf("the client joining the tailnet: %w", err)
	}
	tn.ClientID = string(st.Self.ID)
	tn.Dial = tailnetdial.For(tn.Client)
	return tn, nil
}

// Leave closes the client and deletes its device.
func (tn *Tailnet) Leave(ctx context.Context) {
	GinkgoHelper()
	// tsnet's Close can hang in netstack (v1.102: aborting a connection while the outbound queue
	// is full, nobody draining it); the device is deleted below either way.
	closed := make(chan struct{})
	go func() { _ = tn.Client.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		GinkgoWriter.Println("the test client's tsnet node did not close within 30s; going on")
	}
	Expect(tn.API.DeleteDevice(ctx, tn.ClientID)).To(Succeed(), "deleting the client's device")
}

// CARoots are the roots the proxies' certificates chain to: the system's, and those in the
// PEM file E2E_CA_FILE if set (a local tailnet's CA).
func CARoots() *x509.CertPool {
	GinkgoHelper()
	roots, err := Roots()
	Expect(err).NotTo(HaveOccurred())
	return roots
}

// Roots is CARoots for suites that are not Ginkgo's.
func Roots() (*x509.CertPool, error) {
	roots, err := x509.SystemCertPool()
	if err != nil {
		return nil, err
	}
	if f := os.Getenv("E2E_CA_FILE"); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("E2E_CA_FILE: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in E2E_CA_FILE %s", f)
		}
	}
	return roots, nil
}
