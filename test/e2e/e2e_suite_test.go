//go:build e2e

// Package e2e tests the operator and its proxies in a cluster, through a kubeconfig, with a
// client on the tailnet: against a kind cluster running the built images on a real tailnet
// (`make test-e2e`), or against the local environment of `make dev` (`make test-e2e-local`).
// Variables describe the environment:
//
//	KUBECONFIG                                the cluster (the usual loading rules)
//	TS_API_CLIENT_ID, TS_API_CLIENT_SECRET    the tailnet's OAuth client; without them every spec skips
//	TS_API_BASE_URL                           the Tailscale API; https://api.tailscale.com by default
//	TS_CONTROL_URL                            control server of the suite's tailnet client; Tailscale's by default
//	E2E_CA_FILE                               roots the proxies' certificates chain to, besides the system's
//	E2E_OPERATOR_NAMESPACE                    tailscale by default
//	E2E_OPERATOR_LOG, E2E_PROXY_LOG           log files of an operator and proxies run outside Pods
//	E2E_LOCAL_BACKEND                         host:port of a backend for Ingresses where no workload Pods run
//	E2E_SKIP_L3                               why L3 Services cannot be served here
//	E2E_BACKEND_IMAGE                         agnhost image of the backend Deployment; agnhost:2.53 by default
//	E2E_FUNNEL_ADDR                           the local tailnet's Funnel listener (port 443 of its relays); the internet otherwise
//	E2E_TIMEOUT                               how long a spec waits for the operator and proxies; 5m by default
package e2e

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/tsnet"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/tailnetdial"
)

// suite is what every spec uses: the cluster, the tailnet's API and a client on the tailnet.
var suite struct {
	k8s       client.Client
	clientset kubernetes.Interface
	api       *tailnet.APIClient
	client    *tsnet.Server
	// dial connects through the client over the tailnet only: tsnet's own Dial sends what the
	// tailnet does not route yet (a Tailscale Service's VIP before its host is known) through
	// this machine's network, and an HTTP client would keep whatever answers there.
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	clientID string // the client's device, deleted at the end
	roots    *x509.CertPool
	opNS     string
	timeout  time.Duration

	operatorLog, proxyLog string
	localBackend          string
	backendImage          string
	skipL3                string
	oauthSecret           string
}

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "tsingress e2e")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	id, secret := os.Getenv("TS_API_CLIENT_ID"), os.Getenv("TS_API_CLIENT_SECRET")
	if id == "" || secret == "" {
		Skip("no tailnet credentials: set TS_API_CLIENT_ID and TS_API_CLIENT_SECRET to an OAuth client " +
			"(scopes devices, auth keys and services; owner of tag:k8s), or run make test-e2e-local")
	}
	suite.oauthSecret = secret
	suite.opNS = envOr("E2E_OPERATOR_NAMESPACE", "tailscale")
	suite.operatorLog, suite.proxyLog = os.Getenv("E2E_OPERATOR_LOG"), os.Getenv("E2E_PROXY_LOG")
	suite.localBackend = os.Getenv("E2E_LOCAL_BACKEND")
	suite.backendImage = envOr("E2E_BACKEND_IMAGE", defaultBackendImage)
	suite.skipL3 = os.Getenv("E2E_SKIP_L3")
	var err error
	suite.timeout, err = time.ParseDuration(envOr("E2E_TIMEOUT", "5m"))
	Expect(err).NotTo(HaveOccurred(), "E2E_TIMEOUT")
	SetDefaultEventuallyTimeout(suite.timeout)
	// Gomega applies no default timeout to an Eventually given a context: a spec waiting for
	// something that never happens would hang until -test.timeout instead of failing.
	EnforceDefaultTimeoutsWhenUsingContexts()
	SetDefaultEventuallyPollingInterval(500 * time.Millisecond)

	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	Expect(err).NotTo(HaveOccurred(), "kubeconfig")
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(tsv1alpha1.AddToScheme(scheme)).To(Succeed())
	suite.k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	suite.clientset, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())

	suite.roots, err = x509.SystemCertPool()
	Expect(err).NotTo(HaveOccurred())
	if f := os.Getenv("E2E_CA_FILE"); f != "" {
		pem, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred(), "E2E_CA_FILE")
		Expect(suite.roots.AppendCertsFromPEM(pem)).To(BeTrue(), "no certificate in E2E_CA_FILE %s", f)
	}

	// The credentials go to files, the form the API client reads.
	dir := GinkgoT().TempDir()
	idFile, secretFile := filepath.Join(dir, "client_id"), filepath.Join(dir, "client_secret")
	Expect(os.WriteFile(idFile, []byte(id), 0o600)).To(Succeed())
	Expect(os.WriteFile(secretFile, []byte(secret), 0o600)).To(Succeed())
	suite.api, err = tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: os.Getenv("TS_API_BASE_URL"), ClientIDFile: idFile, ClientSecretFile: secretFile})
	Expect(err).NotTo(HaveOccurred())

	// The client is a tagged device: the tailnet's policy must let tag:k8s reach tag:k8s.
	key, err := suite.api.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Description: "tsingress e2e client", Expiry: time.Hour})
	Expect(err).NotTo(HaveOccurred(), "minting the client's auth key")
	suite.client = &tsnet.Server{
		Dir: GinkgoT().TempDir(), Hostname: "tsingress-e2e-" + strings.ToLower(rand.Text()[:6]),
		ControlURL: os.Getenv("TS_CONTROL_URL"), AuthKey: key.Secret.Reveal(), Ephemeral: true,
		UserLogf: func(string, ...any) {},
	}
	upCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	st, err := suite.client.Up(upCtx)
	Expect(err).NotTo(HaveOccurred(), "the client joining the tailnet")
	suite.dial = tailnetdial.For(suite.client)
	suite.clientID = string(st.Self.ID)
})

var _ = AfterSuite(func(ctx SpecContext) {
	if suite.client == nil {
		return
	}
	suite.client.Close()
	if suite.clientID != "" {
		Expect(suite.api.DeleteDevice(ctx, suite.clientID)).To(Succeed(), "deleting the client's device")
	}
	// Credentials never reach logs.
	for _, f := range []string{suite.operatorLog, suite.proxyLog} {
		if f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(b)).NotTo(ContainSubstring("tskey-"), "an auth key or client secret in %s", f)
		Expect(string(b)).NotTo(ContainSubstring(suite.oauthSecret), "the OAuth client secret in %s", f)
	}
})

// On failure: the Events and Pods (as kubectl describe shows their state) of the spec's namespace
// and of the operator's, and the operator's and the proxies' logs.
var _ = AfterEach(func() {
	if !CurrentSpecReport().Failed() || suite.k8s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ns := range []string{specNamespace, suite.opNS} {
		if ns != "" {
			dumpEvents(ctx, ns)
		}
	}
	dumpPods(ctx, specNamespace)
	dumpPods(ctx, suite.opNS)
	dumpLogs(ctx, "operator", suite.operatorLog, "app.kubernetes.io/component=operator")
	dumpLogs(ctx, "proxies", suite.proxyLog, "app.kubernetes.io/name=tsingress-proxy")
})

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
