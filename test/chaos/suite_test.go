//go:build chaos

// Package chaos does to the operator and its proxies, on a kind cluster with real Pods, what
// clusters do to them: it kills the operator while objects come and go, deletes proxy Pods,
// evicts replicas under load, takes the API server and the tailnet's control server away, and
// corrupts the documents proxies read. Every figure it reports is counted; every loop is bounded
// in time and count. It runs with `make chaos` (hack/chaos-kind.sh), which deploys the operator
// as hack/kind-deploy.sh does and collects the figures into docs/reliability.md.
//
// Environment, as hack/kind-deploy.sh leaves it:
//
//	KUBECONFIG, KIND_CLUSTER                    the cluster, and its name (its node is KIND_CLUSTER-control-plane)
//	TS_API_CLIENT_ID, TS_API_CLIENT_SECRET      the tailnet's OAuth client
//	TS_API_BASE_URL, TS_CONTROL_URL, E2E_CA_FILE the local tailnet's API, control server and CA roots
//	LOCALTAILNET_ADMIN_URL                      its admin endpoint (control server down and up, CA orders)
//	E2E_BACKEND_IMAGE                           the agnhost image
//	CHAOS_REPORT                                a file the figures are written to, as Markdown
//	CHAOS_LOG_DIR                               where the Pods' logs are collected (a temporary directory by default)
//	CHAOS_POD_DELETIONS (20), CHAOS_OPERATOR_KILLS (50), CHAOS_OBJECTS (30)  the counts of the faults
package chaos

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/tsnet"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/tailnet"
)

const opNS = "tailscale"

var suite struct {
	cfg       *rest.Config
	k8s       client.Client
	clientset kubernetes.Interface
	logClient kubernetes.Interface // without a timeout, for streams
	api       *tailnet.APIClient
	client    *tsnet.Server
	clientID  string
	roots     *x509.CertPool
	admin     string // the local tailnet's admin URL
	node      string // the kind node's container
	image     string // agnhost
	logs      *logCollector
	report    report

	podDeletions, operatorKills, objects int
	oauthSecret                          string
}

func TestChaos(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "tsingress chaos")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	id, secret := os.Getenv("TS_API_CLIENT_ID"), os.Getenv("TS_API_CLIENT_SECRET")
	suite.admin = os.Getenv("LOCALTAILNET_ADMIN_URL")
	cluster := os.Getenv("KIND_CLUSTER")
	Expect(id != "" && secret != "" && suite.admin != "" && cluster != "").To(BeTrue(),
		"run by make chaos: it needs the local tailnet (TS_API_CLIENT_ID, TS_API_CLIENT_SECRET, LOCALTAILNET_ADMIN_URL) and KIND_CLUSTER")
	suite.oauthSecret = secret
	suite.node = cluster + "-control-plane"
	suite.image = envOr("E2E_BACKEND_IMAGE", "registry.k8s.io/e2e-test-images/agnhost:2.53")
	suite.podDeletions, suite.operatorKills, suite.objects = envInt("CHAOS_POD_DELETIONS", 20), envInt("CHAOS_OPERATOR_KILLS", 50), envInt("CHAOS_OBJECTS", 30)
	suite.report.path = os.Getenv("CHAOS_REPORT")
	SetDefaultEventuallyTimeout(5 * time.Minute)
	EnforceDefaultTimeoutsWhenUsingContexts()
	SetDefaultEventuallyPollingInterval(500 * time.Millisecond)

	var err error
	suite.cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
	Expect(err).NotTo(HaveOccurred(), "kubeconfig")
	// Short timeouts: the suite takes the API server away and must notice at once.
	suite.cfg.Timeout = 15 * time.Second
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(tsv1alpha1.AddToScheme(scheme)).To(Succeed())
	suite.k8s, err = client.New(suite.cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	suite.clientset, err = kubernetes.NewForConfig(suite.cfg)
	Expect(err).NotTo(HaveOccurred())
	streams := rest.CopyConfig(suite.cfg)
	streams.Timeout = 0
	suite.logClient, err = kubernetes.NewForConfig(streams)
	Expect(err).NotTo(HaveOccurred())

	suite.roots = x509.NewCertPool()
	pem, err := os.ReadFile(os.Getenv("E2E_CA_FILE"))
	Expect(err).NotTo(HaveOccurred(), "E2E_CA_FILE")
	Expect(suite.roots.AppendCertsFromPEM(pem)).To(BeTrue())

	dir := GinkgoT().TempDir()
	idFile, secretFile := filepath.Join(dir, "client_id"), filepath.Join(dir, "client_secret")
	Expect(os.WriteFile(idFile, []byte(id), 0o600)).To(Succeed())
	Expect(os.WriteFile(secretFile, []byte(secret), 0o600)).To(Succeed())
	suite.api, err = tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: os.Getenv("TS_API_BASE_URL"), ClientIDFile: idFile, ClientSecretFile: secretFile})
	Expect(err).NotTo(HaveOccurred())
	key, err := suite.api.CreateAuthKey(ctx, tailnet.AuthKeyRequest{Tags: []string{"tag:k8s"}, Description: "tsingress chaos client", Expiry: 2 * time.Hour})
	Expect(err).NotTo(HaveOccurred())
	suite.client = &tsnet.Server{
		Dir: GinkgoT().TempDir(), Hostname: "tsingress-chaos-" + strings.ToLower(rand.Text()[:6]),
		ControlURL: os.Getenv("TS_CONTROL_URL"), AuthKey: key.Secret.Reveal(), Ephemeral: true,
		UserLogf: func(string, ...any) {},
	}
	upCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	st, err := suite.client.Up(upCtx)
	Expect(err).NotTo(HaveOccurred(), "the client joining the tailnet")
	suite.clientID = string(st.Self.ID)

	logDir := os.Getenv("CHAOS_LOG_DIR")
	if logDir == "" {
		logDir = GinkgoT().TempDir()
	}
	suite.logs = startLogCollector(logDir)
})

var _ = AfterSuite(func(ctx SpecContext) {
	if suite.client == nil {
		return
	}
	// tsnet's Close can hang in netstack (v1.102: aborting a connection while the outbound queue
	// is full, nobody draining it); the device is deleted below either way.
	closed := make(chan struct{})
	go func() { suite.client.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		GinkgoWriter.Println("the test client's tsnet node did not close within 30s; going on")
	}
	Expect(suite.api.DeleteDevice(ctx, suite.clientID)).To(Succeed(), "deleting the client's device")
	searchCredentials(ctx)
	Expect(suite.report.flush()).To(Succeed())
})

// On failure: the Events and Pods of the operator's namespace and the tail of every log.
var _ = AfterEach(func() {
	if !CurrentSpecReport().Failed() || suite.k8s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dumpState(ctx)
})

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// report collects the suite's figures as Markdown sections, in the order the specs ran.
type report struct {
	path     string
	sections []string
}

func (r *report) add(format string, a ...any) {
	r.sections = append(r.sections, strings.TrimSpace(fmt.Sprintf(format, a...))+"\n")
	GinkgoWriter.Println(fmt.Sprintf(format, a...))
}

func (r *report) flush() error {
	if r.path == "" || len(r.sections) == 0 {
		return nil
	}
	return os.WriteFile(r.path, []byte(strings.Join(r.sections, "\n")), 0o644)
}
