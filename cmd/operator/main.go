// Command operator runs the controllers that expose Ingresses and Services to a tailnet.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	uberzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/version"
)

// options are the command line; each setting also reads the environment variable the original
// operator used, so existing deployments' env keeps working.
type options struct {
	metricsAddr, probeAddr string
	pprofAddr              string
	leaderElect            bool
	settings               kit.Settings
	tags, firewallMode     string
	funnelNamespaces       string
	controlPlane           controlPlaneFlags
	showVersion            bool
}

type controlPlaneFlags struct {
	apiBaseURL, tailnet            string
	clientIDFile, clientSecretFile string
	// clientID and idTokenFile: workload identity federation, as the original's CLIENT_ID.
	clientID, idTokenFile string
}

// apiConfig is the control plane's client: with a client ID, workload identity federation (the
// original's CLIENT_ID), else the OAuth client's files.
func (c controlPlaneFlags) apiConfig(baseURL string) tailnet.APIConfig {
	cfg := tailnet.APIConfig{BaseURL: baseURL, Tailnet: c.tailnet}
	if c.clientID != "" {
		cfg.ClientID, cfg.IDTokenFile = c.clientID, c.idTokenFile
	} else {
		cfg.ClientIDFile, cfg.ClientSecretFile = c.clientIDFile, c.clientSecretFile
	}
	return cfg
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envBool(name string, def bool) bool {
	if b, err := strconv.ParseBool(os.Getenv(name)); err == nil {
		return b
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

// withEnv says in a flag's usage which environment variable sets its default.
func withEnv(usage, env string) string { return usage + " Environment: " + env + "." }

func parseFlags(fs *flag.FlagSet, args []string) (*options, error) {
	o := &options{}
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address of the metrics endpoint; 0 disables it.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	fs.BoolVar(&o.leaderElect, "leader-elect", envBool("OPERATOR_LEADER_ELECT", false), withEnv("Elect a leader, so that only one replica reconciles at a time.", "OPERATOR_LEADER_ELECT"))
	fs.StringVar(&o.settings.Namespace, "operator-namespace", envOr("OPERATOR_NAMESPACE", serviceAccountNamespace()), withEnv("Namespace of the operator and of every proxy's objects.", "OPERATOR_NAMESPACE"))
	fs.StringVar(&o.settings.PrivilegedNamespace, "privileged-proxy-namespace", envOr("OPERATOR_PRIVILEGED_PROXY_NAMESPACE", ""),
		withEnv("Namespace the Pods of kernel-path proxies (L3 Services, ProxyGroups a Service is on: root, NET_ADMIN) run in, so the operator's namespace can enforce the restricted Pod Security standard; their Secrets stay in the operator's. Empty: the operator's namespace.", "OPERATOR_PRIVILEGED_PROXY_NAMESPACE"))
	fs.StringVar(&o.settings.IngressClassName, "ingress-class-name", envOr("OPERATOR_INGRESS_CLASS_NAME", "tailscale"), withEnv("IngressClass this operator serves.", "OPERATOR_INGRESS_CLASS_NAME"))
	fs.StringVar(&o.settings.DefaultProxyClass, "default-proxy-class", envOr("PROXY_DEFAULT_CLASS", ""), withEnv("ProxyClass for objects that name none.", "PROXY_DEFAULT_CLASS"))
	fs.StringVar(&o.tags, "proxy-tags", envOr("PROXY_TAGS", "tag:k8s"), withEnv("Comma-separated tailnet tags for proxies that ask for none.", "PROXY_TAGS"))
	fs.StringVar(&o.settings.ProxyImage, "proxy-image", envOr("PROXY_IMAGE", "ghcr.io/tsingress/proxy:"+version.Version), withEnv("Image of the proxies.", "PROXY_IMAGE"))
	fs.StringVar(&o.firewallMode, "proxy-firewall-mode", envOr("PROXY_FIREWALL_MODE", "auto"), withEnv("Firewall backend of L3 proxies: auto, nftables or iptables.", "PROXY_FIREWALL_MODE"))
	fs.BoolVar(&o.settings.DefaultLoadBalancer, "default-load-balancer", envBool("OPERATOR_DEFAULT_LOAD_BALANCER", false), withEnv("Also serve LoadBalancer Services without a loadBalancerClass.", "OPERATOR_DEFAULT_LOAD_BALANCER"))
	fs.StringVar(&o.settings.ControlURL, "control-url", envOr("OPERATOR_LOGIN_SERVER", ""), withEnv("Control server the proxies log in to; empty means Tailscale's.", "OPERATOR_LOGIN_SERVER"))
	fs.StringVar(&o.controlPlane.apiBaseURL, "api-base-url", envOr("TS_API_BASE_URL", ""), withEnv("Tailscale API base URL; empty means the control URL when set, else Tailscale's API.", "TS_API_BASE_URL"))
	fs.StringVar(&o.controlPlane.tailnet, "tailnet", envOr("TS_TAILNET", "-"), withEnv("Tailnet name for API calls; - is the OAuth client's own.", "TS_TAILNET"))
	fs.StringVar(&o.controlPlane.clientIDFile, "client-id-file", envOr("CLIENT_ID_FILE", "/oauth/client_id"), withEnv("File holding the OAuth client ID.", "CLIENT_ID_FILE"))
	fs.StringVar(&o.controlPlane.clientSecretFile, "client-secret-file", envOr("CLIENT_SECRET_FILE", "/oauth/client_secret"), withEnv("File holding the OAuth client secret.", "CLIENT_SECRET_FILE"))
	fs.StringVar(&o.controlPlane.clientID, "client-id", envOr("CLIENT_ID", ""), withEnv("OAuth client ID for workload identity federation: the identity token in --id-token-file is exchanged for API tokens, and no client secret is read.", "CLIENT_ID"))
	fs.StringVar(&o.controlPlane.idTokenFile, "id-token-file", envOr("ID_TOKEN_FILE", "/var/run/secrets/tailscale/serviceaccount/token"),
		withEnv("Identity token (a projected ServiceAccount token) exchanged for API tokens with --client-id.", "ID_TOKEN_FILE"))
	fs.BoolVar(&o.settings.ProxyNoLogs, "proxy-no-logs", envBool("PROXY_NO_LOGS_NO_SUPPORT", false),
		withEnv("Forbid every proxy to upload its logs to Tailscale (TS_NO_LOGS_NO_SUPPORT). Proxies of a control server other than Tailscale's never do.", "PROXY_NO_LOGS_NO_SUPPORT"))
	fs.StringVar(&o.settings.ACMEDirectoryURL, "acme-directory-url", envOr("ACME_DIRECTORY_URL", ""), withEnv("ACME directory the proxies get certificates from unless their ProxyClass picks Let's Encrypt staging (a private CA); empty means Let's Encrypt.", "ACME_DIRECTORY_URL"))
	fs.StringVar(&o.settings.ProxyCAConfigMap, "proxy-ca-configmap", envOr("PROXY_CA_CONFIGMAP", ""), withEnv("ConfigMap in the operator namespace whose PEM certificates the proxies trust besides the system roots (a private ACME CA or control server).", "PROXY_CA_CONFIGMAP"))
	o.settings.CertificateLimits = acmebudget.LetsEncrypt
	fs.IntVar(&o.settings.CertificateLimits.PerDomain, "acme-new-certificates-per-week", envInt("ACME_NEW_CERTIFICATES_PER_WEEK", acmebudget.LetsEncrypt.PerDomain),
		withEnv("New certificates the tailnet's domain may get in any 7 days (Let's Encrypt: 50); lower it when other issuers share the domain.", "ACME_NEW_CERTIFICATES_PER_WEEK"))
	fs.IntVar(&o.settings.CertificateLimits.PerName, "acme-certificates-per-name-per-week", envInt("ACME_CERTIFICATES_PER_NAME_PER_WEEK", acmebudget.LetsEncrypt.PerName),
		withEnv("Certificates one name may get in any 7 days, renewals included (Let's Encrypt: 5).", "ACME_CERTIFICATES_PER_NAME_PER_WEEK"))
	fs.IntVar(&o.settings.MaxGroupReplicas, "max-proxygroup-replicas", envInt("OPERATOR_MAX_PROXYGROUP_REPLICAS", kit.DefaultMaxGroupReplicas),
		withEnv("Most replicas a ProxyGroup may have (each is a tailnet device with an auth key of its own); a group asking for more is refused and left as it is.", "OPERATOR_MAX_PROXYGROUP_REPLICAS"))
	fs.StringVar(&o.funnelNamespaces, "funnel-namespaces", envOr("OPERATOR_FUNNEL_NAMESPACES", "*"),
		withEnv("Comma-separated namespaces whose Ingresses may be served to the internet through Funnel; * for every namespace, empty for none.", "OPERATOR_FUNNEL_NAMESPACES"))
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", envOr("OPERATOR_PPROF_BIND_ADDRESS", ""), withEnv("Address of the Go profiler's endpoints (/debug/pprof); empty disables them.", "OPERATOR_PPROF_BIND_ADDRESS"))
	fs.BoolVar(&o.showVersion, "version", false, "Print the version and exit.")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	for _, t := range strings.Split(o.tags, ",") {
		if t = strings.TrimSpace(t); t != "" {
			o.settings.DefaultTags = append(o.settings.DefaultTags, t)
		}
	}
	o.settings.FirewallMode = contract.FirewallMode(o.firewallMode)
	o.settings.FunnelNamespaces = funnelNamespaces(o.funnelNamespaces)
	if o.showVersion {
		return o, nil
	}
	return o, o.settings.Validate()
}

// funnelNamespaces reads --funnel-namespaces: nil (every namespace) for "*", else the list,
// empty but not nil when it names none.
func funnelNamespaces(v string) []string {
	if strings.TrimSpace(v) == "*" {
		return nil
	}
	out := []string{}
	for _, ns := range strings.Split(v, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			out = append(out, ns)
		}
	}
	return out
}

func usage(fs *flag.FlagSet) {
	fmt.Fprint(fs.Output(), `Usage: operator [flags]

Runs the controllers against the cluster of KUBECONFIG, else of the Pod it runs in, else of
~/.kube/config. A setting that names an environment variable takes its default from it; a flag
given wins.

`)
	fs.PrintDefaults()
}

// serviceAccountNamespace is the namespace the operator's Pod runs in, when it runs in one.
func serviceAccountNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func main() {
	zapOpts := zap.Options{}
	fs := flag.NewFlagSet("operator", flag.ExitOnError)
	fs.Usage = func() { usage(fs) }
	zapOpts.BindFlags(fs)
	o, err := parseFlags(fs, os.Args[1:])
	if o != nil && o.showVersion {
		fmt.Println(version.Version)
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "invalid settings: %v\n", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts),
		zap.RawZapOpts(uberzap.WrapCore(func(c zapcore.Core) zapcore.Core { return lazyFields{c} }))))
	err = run(o)
	if leaseLost(err) {
		ctrl.Log.Info("lost the leader lease (the API server unreachable for longer than the renewal deadline, or another replica took it); starting over", "renewDeadline", renewDeadline)
		err = startOver()
	}
	if err != nil {
		ctrl.Log.Error(err, "operator stopped")
		os.Exit(1)
	}
}

func run(o *options) error {
	log := ctrl.Log.WithName("setup")
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(tsv1alpha1.AddToScheme(scheme))

	cfg := ctrl.GetConfigOrDie()
	ctx := ctrl.SetupSignalHandler()
	if err := waitForAPIServer(ctx, cfg, o.probeAddr); err != nil {
		return err
	}
	const leaderElectionID = "tsingress-operator.tailscale.com"
	var lock resourcelock.Interface
	if o.leaderElect {
		identity, err := leaderIdentity()
		if err != nil {
			return err
		}
		if lock, err = leaderLock(cfg, o.settings.Namespace, leaderElectionID, identity); err != nil {
			return fmt.Errorf("leader election lock: %w", err)
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Metrics: metricsserver.Options{
			BindAddress:    o.metricsAddr,
			SecureServing:  true,
			FilterProvider: filters.WithAuthenticationAndAuthorization,
		},
		HealthProbeBindAddress:  o.probeAddr,
		PprofBindAddress:        o.pprofAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        leaderElectionID,
		LeaderElectionNamespace: o.settings.Namespace,
		// The lease's timing and the holder's identity: leader.go.
		LeaderElectionResourceLockInterface: lock,
		LeaseDuration:                       ptr.To(leaseDuration),
		RenewDeadline:                       ptr.To(renewDeadline),
		RetryPeriod:                         ptr.To(retryPeriod),
		LeaderElectionReleaseOnCancel:       true,
		Cache:                               controller.CacheOptions(o.settings),
		MapperProvider:                      kit.MapperProvider,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	baseURL := o.controlPlane.apiBaseURL
	if baseURL == "" {
		baseURL = o.settings.ControlURL
	}
	tc, err := tailnet.NewAPIClient(o.controlPlane.apiConfig(baseURL))
	if err != nil {
		return fmt.Errorf("control-plane client: %w", err)
	}
	if err := controller.Setup(mgr, o.settings, tc); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	log.Info("starting operator", "version", version.Version, "namespace", o.settings.Namespace,
		"ingressClass", o.settings.IngressClassName)
	return mgr.Start(ctx)
}
