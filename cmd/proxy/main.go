// Command proxy joins the tailnet and serves what its config says: HTTPS reverse proxying for
// an Ingress, kernel DNAT for a Service, or both for a ProxyGroup replica.
//
// In a Pod it runs with --config-secret=<Secret> and the env POD_NAMESPACE and POD_UID (from
// the downward API); its service account needs get, list, watch and patch on its config and
// state Secrets. `proxy sysctl`, an L3 proxy Pod's privileged init container, turns IP
// forwarding on. SIGTERM drains requests in flight; a config change that needs a new login
// (hostname, tags, control URL) makes it exit with status 0 for the kubelet to restart it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy"
	"github.com/tsingress/tsingress/internal/version"
)

const defaultConfigDir = "/etc/tsingress/config"

// serviceAccountNamespace is where a Pod finds its namespace when POD_NAMESPACE is not set.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "sysctl" {
		return runSysctl(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configSecret := fs.String("config-secret", os.Getenv("TS_PROXY_CONFIG_SECRET"), "Secret holding the proxy config, read and watched through the Kubernetes API (in-cluster, or KUBECONFIG). Environment: TS_PROXY_CONFIG_SECRET.")
	configDir := fs.String("config-dir", os.Getenv("TS_PROXY_CONFIG_DIR"), "Directory holding the proxy config, polled for changes; "+defaultConfigDir+" when no config Secret is set. Environment: TS_PROXY_CONFIG_DIR.")
	groupConfigMap := fs.String("group-configmap", os.Getenv("TS_PROXY_GROUP_CONFIGMAP"), "ConfigMap with a ProxyGroup's Serve and DNAT documents, watched by a proxygroup replica through the Kubernetes API. Environment: TS_PROXY_GROUP_CONFIGMAP.")
	groupL7Only := fs.Bool("group-l7-only", false, "Run a proxygroup replica without a kernel data path (no TUN device, no DNAT rules), unprivileged: for a group that serves no L3 Service.")
	namespace := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "Namespace of the config and state Secrets; by default the Pod's, or the kubeconfig context's. Environment: POD_NAMESPACE.")
	healthAddr := fs.String("health-addr", ":9002", "Address of /healthz and /readyz; empty for none.")
	stateDir := fs.String("state-dir", envOr("TS_PROXY_STATE_DIR", filepath.Join(os.TempDir(), "tsingress-proxy")), "Directory for the tailnet client's files (and its state outside Kubernetes). Environment: TS_PROXY_STATE_DIR.")
	debugAddr := fs.String("debug-addr", "", "Address of the pprof endpoints (/debug/pprof/); empty for none.")
	tailnetPort := fs.Uint("tailnet-port", uint(envInt("PORT", 41641)), "UDP port for WireGuard; fixed, so that peers reach a restarted proxy at the address they knew. 0 picks one at random. Environment: PORT.")
	verbose := fs.Bool("verbose", false, "Log at debug level, with the tailnet client's own logs.")
	checkOnly := fs.Bool("check-config", false, "Validate the config, print a summary and exit.")
	showVersion := fs.Bool("version", false, "Print the version and exit.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.Version)
		return 0
	}
	if *configSecret != "" && *configDir != "" {
		fmt.Fprintln(stderr, "proxy: set either --config-secret or --config-dir, not both")
		return 2
	}
	if *configSecret == "" && *configDir == "" {
		*configDir = defaultConfigDir
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if *tailnetPort > 65535 {
		fmt.Fprintf(stderr, "--tailnet-port %d is not a port\n", *tailnetPort)
		return 2
	}
	opts := proxy.Options{
		ConfigSecret:   *configSecret,
		ConfigDir:      *configDir,
		GroupConfigMap: *groupConfigMap,
		GroupL7Only:    *groupL7Only,
		Namespace:      *namespace,
		PodUID:         os.Getenv("POD_UID"),
		StateDir:       *stateDir,
		HealthAddr:     *healthAddr,
		TailnetPort:    uint16(*tailnetPort),
		Logger:         log,
	}
	if *verbose {
		opts.TailnetLogf = func(format string, args ...any) {
			log.Debug(fmt.Sprintf(format, args...), "component", "tailnet-client")
		}
	}
	kube, kubeNamespace, err := kubeConfig()
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "proxy: Kubernetes client config: %v\n", err)
		return 1
	case kube == nil && *configSecret != "":
		fmt.Fprintln(stderr, "proxy: --config-secret needs the Kubernetes API: run in a Pod, or set KUBECONFIG")
		return 1
	}
	opts.Kube = kube
	if opts.Namespace == "" {
		opts.Namespace = kubeNamespace
	}

	if *checkOnly {
		cfg, v, err := proxy.LoadConfig(ctx, opts)
		if err != nil {
			return failed(stderr, err)
		}
		fmt.Fprintf(stdout, "config v%d ok: %s\n", v, cfg)
		return 0
	}
	if *debugAddr != "" {
		go serveDebug(*debugAddr, log)
	}
	err = proxy.Run(ctx, opts)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, proxy.ErrRestartRequired):
		// A planned exit: whatever supervises the proxy starts it again with the new config.
		log.Info("exiting for a restart", "reason", err)
		return 0
	}
	return failed(stderr, err)
}

func failed(stderr io.Writer, err error) int {
	if _, ok := errors.AsType[*proxy.ConfigError](err); ok {
		fmt.Fprintf(stderr, "proxy: cannot load config: %v\n", err)
	} else {
		fmt.Fprintf(stderr, "proxy: %v\n", err)
	}
	if errors.Is(err, contract.ErrNoSupportedVersion) {
		fmt.Fprintln(stderr, "proxy: the operator writes config versions this proxy image does not read; use a proxy image that matches the operator")
	}
	return 1
}

// kubeConfig finds the Kubernetes API: the kubeconfig named by KUBECONFIG (as in the local
// development environment, where proxies run as processes), or the Pod's service account. It
// returns nil outside Kubernetes, and the namespace that config implies.
func kubeConfig() (*rest.Config, string, error) {
	if os.Getenv("KUBECONFIG") != "" {
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), nil)
		cfg, err := cc.ClientConfig()
		if err != nil {
			return nil, "", err
		}
		ns, _, err := cc.Namespace()
		return cfg, ns, err
	}
	cfg, err := rest.InClusterConfig()
	if errors.Is(err, rest.ErrNotInCluster) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	if ns, err := os.ReadFile(serviceAccountNamespace); err == nil {
		return cfg, strings.TrimSpace(string(ns)), nil
	}
	return cfg, "", nil // POD_NAMESPACE or --namespace must say
}

func serveDebug(addr string, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		log.Error("debug endpoint stopped", "err", err)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}
