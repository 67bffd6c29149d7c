package controller

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/testenv"
)

// The suite runs the reconcilers against a real kube-apiserver and etcd (built from source by
// `make envtest`; KUBEBUILDER_ASSETS points at them).
var (
	cfg       *rest.Config
	k8s       client.Client
	cp        *testenv.ControlPlane
	tsnet     *localtailnet.LocalTailnet
	tsClient  *tailnet.APIClient
	ctx       context.Context
	cancel    context.CancelFunc
	scheme    = runtime.NewScheme()
	testSetup = kit.Settings{
		Namespace:        "tailscale",
		IngressClassName: "tailscale",
		DefaultTags:      []string{"tag:k8s"},
		ProxyImage:       "proxy:test",
		FirewallMode:     "auto",
		// Small, so that a group of some dozens of objects spreads over several ConfigMaps.
		GroupShardBytes: 16 << 10,
		// Let's Encrypt's limits but for the domain's: the suite's Ingresses share the domain
		// tailnet.test, and are more than 50.
		CertificateLimits: acmebudget.Limits{PerDomain: 200, PerName: acmebudget.LetsEncrypt.PerName, Window: acmebudget.LetsEncrypt.Window},
	}
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	ctx, cancel = context.WithCancel(context.Background())
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(tsv1alpha1.AddToScheme(scheme)).To(Succeed())

	var err error
	cp, err = testenv.Start(filepath.Join("..", "..", "config", "crd", "bases"))
	Expect(err).NotTo(HaveOccurred())
	cfg = cp.Config
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testSetup.Namespace}})).To(Succeed())

	// A real control plane for the tailnet: keys the operator mints are real keys.
	tsnet, err = localtailnet.Start(ctx, localtailnet.Options{HTTPS: true})
	Expect(err).NotTo(HaveOccurred())
	idFile, secretFile, err := tsnet.WriteOAuthFiles(GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	tsClient, err = tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: tsnet.APIBaseURL, ClientIDFile: idFile, ClientSecretFile: secretFile})
	Expect(err).NotTo(HaveOccurred())

	// The operator runs as make deploy installs it: a user bound to exactly the generated
	// ClusterRole and Role, not an admin, so that a permission the code needs and the markers
	// lack fails here. Its bindings go with the control plane.
	operatorCfg, _, _ := bindGeneratedRBAC(operatorUser)
	createTLSSecretReaderRole()
	mgr, err := ctrl.NewManager(operatorCfg, ctrl.Options{
		Scheme:         scheme,
		Metrics:        metricsserver.Options{BindAddress: "0"},
		Cache:          CacheOptions(testSetup),
		MapperProvider: kit.MapperProvider,
		NewClient:      applyFaults.client,
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(Setup(mgr, testSetup, tsClient)).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
})

var _ = AfterSuite(func() {
	cancel()
	Expect(tsnet.Close()).To(Succeed())
	Expect(cp.Stop()).To(Succeed())
})

func init() {
	SetDefaultEventuallyTimeout(20 * time.Second)
	SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
}
