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
//	E2E_IP_FAMILY                             the cluster's IP family: ipv4 (the default), ipv6 or dual
//	E2E_PRIVILEGED_NAMESPACE                  where kernel-path proxies' Pods run apart (the restricted overlay); none by default
//	E2E_OPERATOR_LOG, E2E_PROXY_LOG           log files of an operator and proxies run outside Pods
//	E2E_LOCAL_BACKEND                         host:port of a backend for Ingresses where no workload Pods run
//	E2E_SKIP_L3                               why L3 Services cannot be served here
//	E2E_BACKEND_IMAGE                         agnhost image of the backend Deployment; agnhost:2.53 by default
//	E2E_PROXYPROTOCOL_IMAGE                   image of test/backends/proxyprotocol-echo; the PROXY protocol specs skip without it
//	E2E_FUNNEL_ADDR                           the local tailnet's Funnel listener (port 443 of its relays); the internet otherwise
//	E2E_TIMEOUT                               how long a spec waits for the operator and proxies; 5m by default
package e2e

import (
	"context"
	"crypto/x509"
	"maps"
	"net/netip"
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tsingress/tsingress/internal/testing/credsearch"
	"github.com/tsingress/tsingress/test/framework"
)

// suite is what every spec uses: the cluster, the tailnet's API and a client on the tailnet.
var suite struct {
	*framework.Cluster
	*framework.Tailnet
	roots *x509.CertPool
	opNS  string
	// privNS is where the operator runs kernel-path proxies' Pods apart from its own namespace
	// (the restricted overlay); empty when they run in opNS.
	privNS string
	// ipFamily is the cluster's: ipv4, ipv6 or dual.
	ipFamily string
	timeout  time.Duration

	operatorLog, proxyLog string
	localBackend          string
	backendImage          string
	proxyProtocolImage    string
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
	suite.opNS = framework.EnvOr("E2E_OPERATOR_NAMESPACE", "tailscale")
	suite.privNS = os.Getenv("E2E_PRIVILEGED_NAMESPACE")
	suite.ipFamily = framework.EnvOr("E2E_IP_FAMILY", "ipv4")
	suite.operatorLog, suite.proxyLog = os.Getenv("E2E_OPERATOR_LOG"), os.Getenv("E2E_PROXY_LOG")
	suite.localBackend = os.Getenv("E2E_LOCAL_BACKEND")
	suite.backendImage = framework.EnvOr("E2E_BACKEND_IMAGE", framework.DefaultBackendImage)
	suite.proxyProtocolImage = os.Getenv("E2E_PROXYPROTOCOL_IMAGE")
	suite.skipL3 = os.Getenv("E2E_SKIP_L3")
	var err error
	suite.timeout, err = time.ParseDuration(framework.EnvOr("E2E_TIMEOUT", "5m"))
	Expect(err).NotTo(HaveOccurred(), "E2E_TIMEOUT")
	framework.SetDefaults(suite.timeout)
	suite.Cluster = framework.Connect(0)
	suite.roots = framework.CARoots()
	suite.Tailnet = framework.JoinTailnet(ctx, "e2e", time.Hour)
})

var _ = AfterSuite(func(ctx SpecContext) {
	if suite.Tailnet == nil {
		return
	}
	suite.Leave(ctx)
	searchCredentials(ctx)
})

// searchCredentials looks for the tailnet's OAuth client secret and every auth key or client
// secret (tskey-), as written and base64 at every alignment, in the operator's and the proxies'
// logs (the files of a local environment, or what the kubelet keeps of the operator namespace's
// containers), every Event, every Pod's spec and the status and annotations of every object the
// operator reads or writes. A credential planted first must be found.
func searchCredentials(ctx context.Context) {
	GinkgoHelper()
	needles := credsearch.New()
	needles.Add("tskey-", "an auth key or OAuth client secret (tskey-)")
	needles.Add(suite.oauthSecret, "the tailnet's OAuth client secret")
	logs := map[string][]byte{}
	for _, f := range []string{suite.operatorLog, suite.proxyLog} {
		if f != "" {
			b, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			logs[f] = b
		}
	}
	if len(logs) == 0 {
		for _, ns := range proxyNamespaces() {
			nsLogs, err := credsearch.PodLogs(ctx, suite.Clientset, ns)
			Expect(err).NotTo(HaveOccurred())
			maps.Copy(logs, nsLogs)
		}
		Expect(logs).NotTo(BeEmpty(), "container logs of %v", proxyNamespaces())
	}
	r, err := credsearch.SearchCluster(ctx, suite.K8s, suite.opNS, needles, logs)
	Expect(err).NotTo(HaveOccurred())
	plantedHits, hits := r.PlantedHits, r.Hits
	GinkgoWriter.Printf("credential search: %d logs, %d Events and the objects searched; the planted credential found %d times; %d hits\n",
		len(logs), r.Events, len(plantedHits), len(hits))
	Expect(plantedHits).To(ContainElements(ContainSubstring("in "+credsearch.InEvents), ContainSubstring("in "+credsearch.InAnnotations)),
		"the planted credential: the search must find what it looks for")
	Expect(hits).To(BeEmpty(), "credentials found")
}

// inServiceFamily reports whether a tailnet address is of the family a Service of the cluster has
// by default (IPv6 on an IPv6-only cluster, IPv4 otherwise), which the proxy forwards it in.
func inServiceFamily(a netip.Addr) bool {
	if suite.ipFamily == "ipv6" {
		return a.Is6()
	}
	return a.Is4()
}

// proxyNamespaces are the namespaces proxy Pods run in.
func proxyNamespaces() []string { return framework.ProxyNamespaces(suite.opNS) }

// On failure: the Events and Pods (as kubectl describe shows their state) of the spec's namespace
// and of the operator's, and the operator's and the proxies' logs.
var _ = AfterEach(func() {
	if !CurrentSpecReport().Failed() || suite.Cluster == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ns := range append([]string{suite.SpecNamespace}, proxyNamespaces()...) {
		if ns != "" {
			suite.DumpEvents(ctx, ns)
			suite.DumpPods(ctx, ns)
		}
	}
	dumpLogs(ctx, "operator", suite.operatorLog, "app.kubernetes.io/component=operator")
	dumpLogs(ctx, "proxies", suite.proxyLog, "app.kubernetes.io/name=tsingress-proxy")
})
