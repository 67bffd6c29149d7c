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
	"crypto/x509"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tsingress/tsingress/test/framework"
)

const opNS = "tailscale"

// proxyNS are the namespaces proxy Pods run in: opNS, and the privileged one where kernel-path
// proxies run apart under the restricted overlay.
func proxyNS() []string { return framework.ProxyNamespaces(opNS) }

var suite struct {
	*framework.Cluster
	*framework.Tailnet
	logClient kubernetes.Interface // without a timeout, for streams
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
	Expect(id != "" && secret != "" && suite.admin != "" && os.Getenv("E2E_CA_FILE") != "" && cluster != "").To(BeTrue(),
		"run by make chaos: it needs the local tailnet (TS_API_CLIENT_ID, TS_API_CLIENT_SECRET, LOCALTAILNET_ADMIN_URL, E2E_CA_FILE) and KIND_CLUSTER")
	suite.oauthSecret = secret
	suite.node = cluster + "-control-plane"
	suite.image = framework.EnvOr("E2E_BACKEND_IMAGE", framework.DefaultBackendImage)
	suite.podDeletions, suite.operatorKills, suite.objects = envInt("CHAOS_POD_DELETIONS", 20), envInt("CHAOS_OPERATOR_KILLS", 50), envInt("CHAOS_OBJECTS", 30)
	suite.report.path = os.Getenv("CHAOS_REPORT")
	framework.SetDefaults(5 * time.Minute)

	// Short timeouts: the suite takes the API server away and must notice at once.
	suite.Cluster = framework.Connect(15 * time.Second)
	streams := rest.CopyConfig(suite.Config)
	streams.Timeout = 0
	var err error
	suite.logClient, err = kubernetes.NewForConfig(streams)
	Expect(err).NotTo(HaveOccurred())
	suite.roots = framework.CARoots()
	suite.Tailnet = framework.JoinTailnet(ctx, "chaos", 2*time.Hour)

	logDir := os.Getenv("CHAOS_LOG_DIR")
	if logDir == "" {
		logDir = GinkgoT().TempDir()
	}
	suite.logs = startLogCollector(logDir)
})

var _ = AfterSuite(func(ctx SpecContext) {
	if suite.Tailnet == nil {
		return
	}
	suite.Leave(ctx)
	searchCredentials(ctx)
	reportKeysMinted()
	Expect(suite.report.flush()).To(Succeed())
})

// On failure: the Events and Pods of the operator's namespace and the tail of every log.
var _ = AfterEach(func() {
	if !CurrentSpecReport().Failed() || suite.Cluster == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ns := range proxyNS() {
		suite.DumpEvents(ctx, ns)
		suite.DumpPods(ctx, ns)
	}
	if suite.logs != nil {
		suite.logs.dumpTails(300)
	}
})

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
