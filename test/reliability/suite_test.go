// Package reliability runs the operator in-process against a real control plane (envtest:
// kube-apiserver, etcd, kube-controller-manager) and the local tailnet, and feeds it what users
// and clusters get wrong: bad annotations, missing or wrong references, broken certificates,
// documents edited by hand. Every case must end in its stable reason while everything else keeps
// working, with no panic, no hot loop and no credential in a log or an Event. It also checks the
// RBAC the operator gives its proxies: a proxy's ServiceAccount reaches its own Secrets only.
//
// With RELIABILITY_REPORT set to a file, the suite writes its figures there as Markdown
// (`make chaos` collects them into docs/reliability.md).
package reliability

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
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
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/credsearch"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/localtailnet/localtailnettest"
	"github.com/tsingress/tsingress/internal/testing/testenv"
)

const opNS = "tailscale"

var (
	cfg      *rest.Config
	k8s      client.Client
	cp       *testenv.ControlPlane
	lt       *localtailnet.LocalTailnet
	tsAPI    *tailnet.APIClient
	scheme   = runtime.NewScheme()
	opLog    = newOperatorLog()
	settings = kit.Settings{
		Namespace:        opNS,
		IngressClassName: "tailscale",
		DefaultTags:      []string{"tag:k8s"},
		ProxyImage:       "proxy:test",
		FirewallMode:     "auto",
	}
	stopOperator context.CancelFunc
	operatorDone = make(chan error, 1)
	report       reportWriter
)

func TestReliability(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Reliability Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(logr.New(opLog.sink()))
	SetDefaultEventuallyTimeout(30 * time.Second)
	SetDefaultEventuallyPollingInterval(200 * time.Millisecond)
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(tsv1alpha1.AddToScheme(scheme)).To(Succeed())

	var err error
	cp, err = testenv.Start(filepath.Join("..", "..", "config", "crd", "bases"))
	Expect(err).NotTo(HaveOccurred())
	cfg = cp.Config
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opNS}})).To(Succeed())

	lt, tsAPI = localtailnettest.Start(GinkgoTB(), localtailnet.Options{HTTPS: true})

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   controller.CacheOptions(settings),
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(controller.Setup(mgr, settings, tsAPI)).To(Succeed())
	var opCtx context.Context
	opCtx, stopOperator = context.WithCancel(context.Background())
	go func() { operatorDone <- mgr.Start(opCtx) }()
	report.path = os.Getenv("RELIABILITY_REPORT")
})

var _ = AfterSuite(func() {
	if k8s != nil && lt != nil {
		searchCredentials()
	}
	if stopOperator != nil {
		stopOperator()
		Eventually(operatorDone).WithTimeout(time.Minute).Should(Receive(Not(HaveOccurred())), "the operator stopped cleanly")
	}
	if lt != nil {
		Expect(lt.Close()).To(Succeed())
	}
	if cp != nil {
		Expect(cp.Stop()).To(Succeed())
	}
	Expect(report.flush()).To(Succeed())
})

// operatorStillRunning fails when the in-process operator has stopped (a crash or a fatal
// error would end mgr.Start).
func operatorStillRunning() {
	GinkgoHelper()
	select {
	case err := <-operatorDone:
		Fail(fmt.Sprintf("the operator stopped: %v", err))
	default:
	}
}

// operatorLog receives everything the operator logs. It counts the reconciles of each object
// (controller-runtime logs "Reconciling" at V(5) with the controller, namespace and name) and the
// panics its controllers recovered from, and keeps the rest of the text for the credential
// search. Lines up to V(4) also go to GinkgoWriter, shown for failed specs.
type operatorLog struct {
	mu         sync.Mutex
	reconciles map[string]int // "controller namespace/name"
	panics     []string
	text       bytes.Buffer
}

func newOperatorLog() *operatorLog { return &operatorLog{reconciles: map[string]int{}} }

func (l *operatorLog) sink() logr.LogSink { return &logSink{log: l} }

// reconcileCounts returns a copy of the counts.
func (l *operatorLog) reconcileCounts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.reconciles))
	for k, v := range l.reconciles {
		out[k] = v
	}
	return out
}

func (l *operatorLog) panicsSeen() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.panics)
}

func (l *operatorLog) contents() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.String()
}

type logSink struct {
	log  *operatorLog
	name string
	kv   []any
}

func (s *logSink) Init(logr.RuntimeInfo) {}
func (s *logSink) Enabled(int) bool      { return true }

func (s *logSink) Info(level int, msg string, kv ...any) { s.write(level, msg, nil, kv) }

func (s *logSink) Error(err error, msg string, kv ...any) { s.write(0, msg, err, kv) }

func (s *logSink) WithValues(kv ...any) logr.LogSink {
	return &logSink{log: s.log, name: s.name, kv: append(slices.Clone(s.kv), kv...)}
}

func (s *logSink) WithName(name string) logr.LogSink {
	n := name
	if s.name != "" {
		n = s.name + "." + name
	}
	return &logSink{log: s.log, name: n, kv: s.kv}
}

func (s *logSink) write(level int, msg string, err error, kv []any) {
	all := append(slices.Clone(s.kv), kv...)
	l := s.log
	l.mu.Lock()
	defer l.mu.Unlock()
	if msg == "Reconciling" {
		l.reconciles[value(all, "controller")+" "+value(all, "namespace")+"/"+value(all, "name")]++
		return
	}
	if strings.HasPrefix(msg, "Observed a panic") {
		l.panics = append(l.panics, msg)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s V(%d) %s: %s", time.Now().Format("15:04:05.000"), level, s.name, msg)
	if err != nil {
		fmt.Fprintf(&b, " err=%v", err)
	}
	for i := 0; i+1 < len(all); i += 2 {
		fmt.Fprintf(&b, " %v=%v", all[i], all[i+1])
	}
	b.WriteByte('\n')
	l.text.WriteString(b.String())
	if level <= 4 {
		GinkgoWriter.Print(b.String())
	}
}

func value(kv []any, key string) string {
	for i := 0; i+1 < len(kv); i += 2 {
		if k, ok := kv[i].(string); ok && k == key {
			return fmt.Sprint(kv[i+1])
		}
	}
	return ""
}

// reportWriter collects the suite's figures as Markdown sections.
type reportWriter struct {
	path     string
	mu       sync.Mutex
	sections []string
}

func (r *reportWriter) add(section string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sections = append(r.sections, strings.TrimSpace(section)+"\n")
}

func (r *reportWriter) flush() error {
	if r.path == "" || len(r.sections) == 0 {
		return nil
	}
	return os.WriteFile(r.path, []byte(strings.Join(r.sections, "\n")), 0o644)
}

// searchCredentials looks for the run's credentials in everything the operator logged, in
// every Event, every Pod's spec and the status and annotations of every object: auth keys and
// OAuth client secrets (all "tskey-"), the tailnet's OAuth client secret, and the TLS private keys
// the specs made; each as written and base64-encoded at every alignment. A credential planted
// first must be found.
func searchCredentials() {
	GinkgoHelper()
	ctx := context.Background()
	needles := credsearch.New()
	needles.Add("tskey-", "an auth key or OAuth client secret")
	needles.Add(lt.OAuthClientSecret.Reveal(), "the OAuth client secret")
	for i, k := range privateKeys {
		needles.Add(pemBody(k), fmt.Sprintf("TLS private key %d", i))
	}
	opLogText := []byte(opLog.contents())
	r, err := credsearch.SearchCluster(ctx, k8s, "default", needles, map[string][]byte{"the operator's log": opLogText})
	Expect(err).NotTo(HaveOccurred())
	size, plantedHits, hits, eventCount := r.Bytes, r.PlantedHits, r.Hits, r.Events
	Expect(size).To(BeNumerically(">", 1000), "the text searched")
	Expect(plantedHits).To(ContainElements(ContainSubstring("in "+credsearch.InEvents), ContainSubstring("in "+credsearch.InAnnotations)),
		"the planted credential: the search must find what it looks for")
	Expect(hits).To(BeEmpty(), "credentials in logs, Events or objects")
	report.add(fmt.Sprintf("### Credentials (envtest)\n\n%d KiB of operator log, %d Events, every Pod's spec and every object's "+
		"status and annotations searched for %d credentials, as written and base64 at every alignment (every auth key and OAuth "+
		"secret by their tskey- prefix, the tailnet's OAuth client secret, %d TLS private keys): %d hits. A credential planted "+
		"first, in an annotation and base64 in an Event, was found %d times.\n",
		len(opLogText)>>10, eventCount, len(privateKeys)+2, len(privateKeys), len(hits), len(plantedHits)))
}
