// Command devenv runs the whole product on one machine, with no cluster and no Tailscale
// account: a real kube-apiserver, etcd and kube-controller-manager, a local tailnet with a real
// ACME CA, the operator, and the proxies its StatefulSets ask for (run here as in-process
// "Pods", since no kubelet runs): standalone L7 and L3 proxies and ProxyGroup replicas. It
// installs config/samples, proves each served object with a request from a tailnet client, and
// runs until interrupted, or, given a command, runs that command against the environment (the
// e2e suite: `make test-e2e-local`) and exits with its status. L3 proxies need root; without it
// they are skipped, with a message. Run it from the repository root (`make dev`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/lifeline"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/testenv"
)

const operatorNamespace = "tailscale"

func main() {
	// Its own flags: the global set holds controller-runtime's -kubeconfig, which devenv does
	// not read.
	flags := flag.NewFlagSet("devenv", flag.ContinueOnError)
	once := flags.Bool("once", false, "Prove the samples, then shut down (for CI and smoke tests).")
	verbose := flags.Bool("v", false, "Show the operator's and the proxies' logs on stdout too.")
	logDir := flags.String("logs", filepath.Join("bin", "devenv-logs"), "Directory for the operator's and the proxies' logs, kept after exit and replaced by the next run.")
	flags.Usage = func() {
		fmt.Fprintf(flags.Output(), `Usage: devenv [-once] [-v] [-logs dir] [-- command [args...]]

With a command, devenv runs it once the samples are proved, with the environment described in
its env file (KUBECONFIG, TS_* and E2E_* variables), then stops everything and exits with the
command's status.

Ctrl-C, SIGTERM, SIGHUP, the end of its parent and the close of the pipe its output goes to all
stop everything and remove what it made; a watchdog process does the same if devenv itself is
killed.

`)
		flags.PrintDefaults()
	}
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	// Nothing here may leave the machine: tsnet would otherwise upload its logs to Tailscale.
	_ = os.Setenv("TS_NO_LOGS_NO_SUPPORT", "true") // fails only on a name with = or NUL
	ctx, stop := stopContext()
	defer stop()
	code, err := run(ctx, *once || flags.NArg() > 0, *verbose, *logDir, flags.Args())
	if err != nil {
		fmt.Fprintf(os.Stderr, "devenv: %v\n", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

func init() {
	// The end of the parent (make, a shell, go run) stops devenv as SIGTERM does. Set here, on
	// the main thread, which Go keeps for the process's life: the setting is per thread.
	_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0)
}

// stopContext is done when devenv should stop: on SIGINT (Ctrl-C), SIGTERM, SIGHUP (the
// terminal went) and the close of stdout's pipe (`make dev | tee log`, tee gone: it may come
// while devenv writes nothing). SIGPIPE is ignored rather than watched: once watched, Go sends
// it for a broken pipe on any descriptor, so a proxy's closed connection would stop everything;
// a write to the closed stdout then just fails. Later signals are ignored: shutting down takes
// a few seconds, and what a SIGKILL leaves the lifeline removes.
func stopContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Ignore(syscall.SIGPIPE)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		var why error
		select {
		case sig := <-sigs:
			why = fmt.Errorf("got %v", sig)
		case <-stdoutClosed():
			why = errors.New("the pipe of its output closed")
		case <-ctx.Done():
			return
		}
		fmt.Fprintf(os.Stderr, "devenv: stopping (%v)\n", why)
		cancel(why)
	}()
	return ctx, func() { cancel(nil) }
}

// stdoutClosed is closed when stdout is a pipe and its reader has gone; nil otherwise.
func stdoutClosed() <-chan struct{} {
	var st unix.Stat_t
	if err := unix.Fstat(1, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil
	}
	closed := make(chan struct{})
	go func() {
		// A pipe's write end polls POLLERR once no reader is left; no events are asked for, so
		// the poll waits for that alone.
		fds := []unix.PollFd{{Fd: 1}}
		for {
			n, err := unix.Poll(fds, -1)
			if err == unix.EINTR {
				continue
			}
			if err == nil && n > 0 {
				close(closed)
			}
			return
		}
	}()
	return closed
}

// step prints progress: what is starting, then how long it took.
func step(what string) func() {
	start := time.Now()
	fmt.Printf("  … %s\n", what)
	return func() { fmt.Printf("  ✓ %s (%s)\n", what, time.Since(start).Round(time.Millisecond)) }
}

// shutdown stops what was started, last first, and shows it.
type shutdown []func()

func (s *shutdown) add(what string, stop func() error) {
	*s = append(*s, func() {
		done := step(what)
		if err := stop(); err != nil {
			fmt.Printf("  ! %s: %v\n", what, err)
			return
		}
		done()
	})
}

func (s shutdown) run() {
	for _, f := range slices.Backward(s) {
		f()
	}
}

func run(ctx context.Context, once, verbose bool, logDir string, command []string) (code int, err error) {
	// Everything devenv and its children make goes under runDir, their TMPDIR, which goes at the
	// end; the lifeline removes it, and kills what names it, if devenv cannot.
	runDir, err := os.MkdirTemp("", "devenv-")
	if err != nil {
		return 1, err
	}
	life, err := lifeline.Start(runDir)
	if err != nil {
		_ = os.RemoveAll(runDir) // best effort, when everything has stopped
		return 1, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(runDir), life.Close()) }()
	_ = os.Setenv("TMPDIR", runDir) // fails only on a name with = or NUL
	operatorLog, proxyLog, err := openLogs(logDir, verbose)
	if err != nil {
		return 1, err
	}
	defer func() {
		_ = operatorLog.Close() // the logs are for a person to read; nothing depends on them
		_ = proxyLog.Close()
		if err != nil || code != 0 {
			fmt.Printf("Logs: %s, %s\n", operatorLog.Name(), proxyLog.Name())
		}
	}()
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(operatorLog)))
	// The tailnet libraries log through the standard logger.
	log.SetOutput(proxyLog)

	noL3 := l3Unavailable()
	if noL3 == "" {
		if n, err := removeStaleNetns(); err != nil {
			return 1, err
		} else if n > 0 {
			fmt.Printf("Removed %d network namespaces that an earlier devenv left.\n", n)
		}
	}
	fmt.Println("Starting the local environment:")
	var stops shutdown
	defer func() {
		fmt.Println("Shutting down:")
		stops.run()
		if left := ownNetns(); len(left) > 0 {
			err = errors.Join(err, fmt.Errorf("network namespaces left behind: %s", strings.Join(left, " ")))
		}
	}()

	done := step("local tailnet: control server, DERP, DNS, API, ACME CA and Funnel relay on 127.0.0.1")
	// The policy grants the proxies' tag Funnel, so that Ingresses annotated for it are public
	// (to this machine: E2E_FUNNEL_ADDR stands for the relays' port 443).
	lt, err := localtailnet.Start(context.Background(), localtailnet.Options{ACME: true, Funnel: true,
		NodeAttrs: []localtailnet.NodeAttr{{Target: []string{"tag:k8s"}, Attr: []string{"funnel"}}}})
	if err != nil {
		return 1, err
	}
	stops.add("local tailnet", lt.Close)
	// tailscaled's ACME client (in the in-process proxies) must trust the local CA's API.
	if err := lt.ACME.UseInProcess(func(k, v string) { _ = os.Setenv(k, v) }); err != nil {
		return 1, err
	}
	done()

	done = step("Kubernetes control plane: kube-apiserver, etcd, kube-controller-manager")
	cp, err := testenv.Start(filepath.Join("config", "crd", "bases"))
	if err != nil {
		return 1, fmt.Errorf("%w (run from the repository root, after `make envtest`, with KUBEBUILDER_ASSETS set; `make dev` does both)", err)
	}
	stops.add("Kubernetes control plane", cp.Stop)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return 1, err
	}
	if err := tsv1alpha1.AddToScheme(scheme); err != nil {
		return 1, err
	}
	k8s, err := client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		return 1, err
	}
	if err := applyFile(ctx, k8s, filepath.Join("config", "ingressclass", "ingressclass.yaml"), &networkingv1.IngressClass{}); err != nil {
		return 1, err
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}); err != nil {
		return 1, err
	}
	done()

	what := "operator, and a kubelet stand-in that runs proxy Pods in-process"
	if noL3 != "" {
		what += " (L7 only)"
	} else {
		what += " (L3 ones in network namespaces)"
	}
	done = step(what)
	idFile, secretFile, err := lt.WriteOAuthFiles(runDir)
	if err != nil {
		return 1, err
	}
	api, err := tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: lt.APIBaseURL, ClientIDFile: idFile, ClientSecretFile: secretFile})
	if err != nil {
		return 1, err
	}
	settings := kit.Settings{
		Namespace: operatorNamespace, IngressClassName: "tailscale", DefaultTags: []string{"tag:k8s"},
		ProxyImage: "in-process", FirewallMode: contract.FirewallAuto, ControlURL: lt.ControlURL,
	}
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache: controller.CacheOptions(settings),
	})
	if err != nil {
		return 1, err
	}
	if err := controller.Setup(mgr, settings, api); err != nil {
		return 1, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var operator, kubelet sync.WaitGroup
	stops.add("operator", func() error { cancel(); operator.Wait(); return nil })
	operator.Go(func() {
		if err := mgr.Start(runCtx); err != nil {
			fmt.Fprintf(os.Stderr, "operator stopped: %v\n", err)
		}
	})
	podsCtx, stopPods := context.WithCancel(runCtx)
	pods := &podRunner{k8s: k8s, kube: cp.Config, logs: proxyLog, noL3: noL3, acmeDirectory: lt.ACME.DirectoryURL, print: func(f string, a ...any) { fmt.Printf(f, a...) }}
	kubelet.Go(func() { pods.run(podsCtx) })
	// Proxies first: they withdraw and report through the API as they stop.
	stops.add("proxy Pods (and their network namespaces)", func() error { stopPods(); kubelet.Wait(); return nil })
	if noL3 != "" {
		fmt.Printf("  ! L3 skipped (%s): L3 proxies need root for a network namespace, a TUN device and DNAT rules\n", noL3)
	}
	done()

	done = step("samples: config/samples, with in-process backends")
	backend, err := loopbackBackend()
	if err != nil {
		return 1, err
	}
	defer backend.Close()
	objs, err := loadSamples(filepath.Join("config", "samples"), scheme)
	if err != nil {
		return 1, err
	}
	demos, notes, err := installSamples(ctx, k8s, objs, backend.Addr().(*net.TCPAddr).Port, noL3)
	if err != nil {
		return 1, err
	}
	for _, n := range notes {
		fmt.Printf("    %s\n", n)
	}
	done()

	done = step("waiting for the proxies to join the tailnet (and get certificates)")
	if err := each(demos, func(d *demo) error {
		start := time.Now()
		if err := waitServed(ctx, k8s, d); err != nil {
			return err
		}
		fmt.Printf("    %s: %s (%s)\n", d, d.fqdn, time.Since(start).Round(time.Millisecond))
		return nil
	}); err != nil {
		return 1, err
	}
	done()

	done = step("proving each from a tailnet client")
	clientDir, err := os.MkdirTemp(runDir, "client-")
	if err != nil {
		return 1, err
	}
	cl, err := joinClient(ctx, lt, clientDir)
	if err != nil {
		return 1, err
	}
	defer cl.Close() //nolint:errcheck // the client device leaves with the environment
	if err := each(demos, func(d *demo) error { return prove(ctx, cl, lt.ACME.Roots(), d) }); err != nil {
		return 1, err
	}
	done()

	envFile := filepath.Join(runDir, "e2e.env")
	env := e2eEnv(cp, lt, operatorLog.Name(), proxyLog.Name(), backend.Addr().(*net.TCPAddr).Port, noL3)
	if err := writeEnvFile(envFile, env); err != nil {
		return 1, err
	}
	fmt.Printf("\nServed on tailnet %s, proved from device your-laptop (you@example.com):\n", lt.Domain)
	for _, d := range demos {
		fmt.Printf("  %-32s ", d)
		switch {
		case d.skip != "":
			fmt.Printf("skipped (%s)\n", d.skip)
		case d.kind == "L3":
			fmt.Printf("%s (%s)\n  %32s %s\n", d.fqdn, d.ip, "", d.proof)
		default:
			fmt.Printf("https://%s/\n  %32s %q, certificate by %q\n", d.fqdn, "", d.proof, d.issuer)
		}
	}
	fmt.Printf(`
Point things at this environment:
  kubeconfig:     %s   (kubectl --kubeconfig %[1]s get ingress -A)
  control server: %s   (tsnet ControlURL, or tailscale up --login-server)
  Tailscale API:  %s   (OAuth client in %s and %s)
  CA roots:       %s
  logs:           %s, %s   (kept after exit; the next run replaces them)
  e2e suite:      (set -a; . %s; go test -tags e2e ./test/e2e/)
`, cp.Kubeconfig, lt.ControlURL, lt.APIBaseURL, idFile, secretFile, lt.ACME.RootsFile,
		operatorLog.Name(), proxyLog.Name(), envFile)
	if len(command) > 0 {
		fmt.Printf("\nRunning %s\n", strings.Join(command, " "))
		code, err := runCommand(ctx, command, env)
		if err != nil {
			return code, err
		}
		if code != 0 {
			return code, fmt.Errorf("%s exited with status %d", command[0], code)
		}
		return 0, nil
	}
	if once {
		return 0, nil
	}
	fmt.Println("\nRunning; Ctrl-C stops everything.")
	<-ctx.Done()
	return 0, nil
}

// openLogs empties or creates the operator's and the proxies' log files in dir, which one run
// at a time may use; with verbose they go to stdout too. The operator's log holds the lock.
func openLogs(dir string, verbose bool) (operator, proxies *logFile, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = lock.Close()
		return nil, nil, fmt.Errorf("another devenv writes its logs to %s: give this one -logs <another directory>", dir)
	}
	if operator, err = newLogFile(filepath.Join(dir, "operator.log"), verbose); err != nil {
		_ = lock.Close()
		return nil, nil, err
	}
	operator.lock = lock
	if proxies, err = newLogFile(filepath.Join(dir, "proxies.log"), verbose); err != nil {
		_ = operator.Close()
		return nil, nil, err
	}
	return operator, proxies, nil
}

// logFile is a log written from many goroutines, and echoed to stdout if asked.
type logFile struct {
	mu   sync.Mutex
	f    *os.File
	echo bool
	lock *os.File // the log directory's lock, released on Close
}

func newLogFile(path string, echo bool) (*logFile, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &logFile{f: f, echo: echo}, nil
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.echo {
		_, _ = os.Stdout.Write(p) // the file is the record; the terminal only echoes it
	}
	return l.f.Write(p)
}

func (l *logFile) Name() string { return l.f.Name() }
func (l *logFile) Close() error {
	if l.lock != nil {
		defer l.lock.Close() //nolint:errcheck // closing lets the lock go, whatever it reports
	}
	return l.f.Close()
}

// each runs f on every demo that is not skipped, at once, and joins the errors.
func each(demos []*demo, f func(*demo) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(demos))
	for i, d := range demos {
		if d.skip == "" {
			wg.Go(func() { errs[i] = f(d) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

func applyFile(ctx context.Context, k8s client.Client, path string, obj client.Object) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(b, obj); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return k8s.Create(ctx, obj)
}

// e2eEnv describes the environment to the e2e suite (test/e2e reads these variables).
func e2eEnv(cp *testenv.ControlPlane, lt *localtailnet.LocalTailnet, operatorLog, proxyLog string, backendPort int, noL3 string) []string {
	env := []string{
		"KUBECONFIG=" + cp.Kubeconfig,
		"TS_CONTROL_URL=" + lt.ControlURL,
		"TS_API_BASE_URL=" + lt.APIBaseURL,
		"TS_API_CLIENT_ID=" + lt.OAuthClientID,
		"TS_API_CLIENT_SECRET=" + lt.OAuthClientSecret.Reveal(),
		"E2E_CA_FILE=" + lt.ACME.RootsFile,
		"E2E_OPERATOR_NAMESPACE=" + operatorNamespace,
		"E2E_OPERATOR_LOG=" + operatorLog,
		"E2E_PROXY_LOG=" + proxyLog,
		// No workload Pods run here: Ingress backends are ExternalName Services for this
		// loopback backend, and every ClusterIP of an L3 proxy's cluster network answers.
		fmt.Sprintf("E2E_LOCAL_BACKEND=localhost:%d", backendPort),
		"E2E_FUNNEL_ADDR=" + lt.FunnelAddr,
	}
	if noL3 != "" {
		env = append(env, "E2E_SKIP_L3=the local environment runs no L3 proxies: "+noL3)
	}
	return env
}

// writeEnvFile writes the variables for `set -a; . file`; it holds the local tailnet's OAuth
// secret, so only its owner may read it.
func writeEnvFile(path string, env []string) error {
	var b strings.Builder
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "%s='%s'\n", k, strings.ReplaceAll(v, "'", `'\''`))
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// runCommand runs command with env added, in a process group of its own so that an interrupt
// reaches it once, from here: it then has a minute to clean up through the environment, which
// stays up until it exits.
func runCommand(ctx context.Context, command, env []string) (int, error) {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 1, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		// Kill fails only when the group has gone, which Wait then reports.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done //nolint:errcheck // killed: the error below says more than Wait's
			return 1, errors.New("the command did not stop within a minute of the interrupt")
		}
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return max(exit.ExitCode(), 1), nil
	}
	return 0, err
}

// ownNetns lists the network namespaces of this run that still exist.
func ownNetns() []string {
	var names []string
	for name, pid := range devenvNetns() {
		if pid == os.Getpid() {
			names = append(names, name)
		}
	}
	return names
}
