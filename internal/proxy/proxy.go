// Package proxy runs a tsingress proxy: it reads its config (contract.ProxyConfig) from a
// Kubernetes Secret or a directory, joins the tailnet, serves what the config says, and reports
// its state back (contract.ProxyState).
//
// Every kind of proxy runs on one core (core.go: storage, the node, the watchers, the restart
// policy, the state report, readiness, retries, shutdown); the config's kind picks the unit it
// serves: ingress (standalone L7), service (standalone L3, kernel TUN and DNAT) or proxygroup
// (a ProxyGroup replica serving Tailscale Services).
//
// # Certificates
//
// The certificate of each tailnet name served (the proxy's own, or a Tailscale Service's) is
// obtained through tailscaled's ACME flow as soon as the name is served, not on a first
// request, and renewed at two thirds of its lifetime whether requests come or not; failures
// are retried with jittered backoff, and tailscaled's ACME client waits out a CA's Retry-After
// within an attempt. Under an issuance hold (WebService.TLS.Hold) the CA is never asked, and an
// attempt under way ends: a cached certificate, validated as tailscaled validates its cache, is
// served, or none. tailscaled caches certificates in the state Secret
// when it runs in a Pod (secretstore implements its ReadTLSCertAndKey/WriteTLSCertAndKey), in
// files under StateDir otherwise.
//
// In a ProxyGroup sharing certificates (tls.certShareMode), the issuer keeps the certificate
// of each name in the kubernetes.io/tls Secret contract.GroupCertSecret(name), which the
// operator creates: tailscaled reads and writes it there (the proxy copies it there when
// tailscaled does not run as in a Pod), and the ACME account key stays in the issuer's state
// Secret. Readers never ask the CA: they load that Secret, watch it, and advertise a service
// only while they hold a valid certificate for it. The tailnet offers a node a service's
// certificate only while the node advertises the service, so an issuer advertises a name it
// has no certificate for yet and asks for one at once: handshakes fail for one issuance.
//
// Bring-your-own certificates (WebService.TLS.Certificates) come from kubernetes.io/tls
// Secrets, each watched by name, and are served by SNI; a Secret that cannot serve a host
// leaves that host alone unserved. Without the Kubernetes API they are reported unsupported.
//
// The state key certificates reports, per name served, the certificate presented (source,
// serial, validity) only once it is presented, or why there is none.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
)

// ErrRestartRequired is returned by Run when the config changed in a way that needs a new
// tailnet login (hostname, tags, control URL, state Secret, kind, or an auth key while not yet
// logged in). The caller exits so that the kubelet (or whatever supervises the process) starts
// the proxy again, which then logs in with the new settings: the device stays the same, since
// its identity is in the state Secret.
var ErrRestartRequired = errors.New("the config changed in a way that needs a restart")

// ConfigError reports that the proxy config could not be read or is invalid.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// Options configures Run.
type Options struct {
	// ConfigSecret names the Secret holding the proxy config, read and watched through the API
	// (Kubernetes mode). Otherwise ConfigDir is a directory holding it, polled for changes.
	ConfigSecret string
	ConfigDir    string
	// ConfigPollInterval is how often ConfigDir is read; one second by default.
	ConfigPollInterval time.Duration

	// Kube reaches the API server. It is required with ConfigSecret; with ConfigDir it is
	// optional and, when set, the state goes to the config's state Secret as in Kubernetes mode.
	// Without it the tailnet state is a file in StateDir and the state keys go to
	// StateDir/<stateSecret>/proxy-state.json.
	Kube *rest.Config
	// Namespace of the config and state Secrets.
	Namespace string
	// PodUID is reported as pod_uid, so the operator can tell current state from stale.
	PodUID string

	// StateDir holds the tailnet client's working files (and, without Kube, its state), in a
	// subdirectory per proxy.
	StateDir string

	// HealthAddr is where /healthz and /readyz are served, and /metrics when the config enables
	// them; empty serves nothing.
	// HealthListener, if set, is used instead.
	HealthAddr     string
	HealthListener net.Listener

	// CertSource issues the certificates of tailnet names in place of the tailnet's certificate
	// flow (tests); nil uses the tailnet's.
	CertSource CertSource

	// TailnetPort is the UDP port for WireGuard; 0 picks one at random. A fixed port lets peers
	// reach a restarted proxy at the address they knew: tailscaled trusts a peer's last direct
	// address for a few seconds after the peer changed, so a new port costs a 5s handshake retry.
	TailnetPort uint16

	// DrainTimeout bounds how long shutdown waits for requests in flight; 10s by default.
	DrainTimeout time.Duration

	// Logger receives the proxy's logs; nil uses slog.Default().
	Logger *slog.Logger
	// TailnetLogf receives the tailnet client's verbose logs; nil discards them.
	TailnetLogf logger.Logf

	// NetNS is the network namespace file (e.g. /run/netns/x) an L3 proxy puts its TUN device
	// and DNAT rules in; "" means the proxy's own.
	NetNS string

	// GroupConfigMap names the ConfigMap with a ProxyGroup's Serve and DNAT documents, which a
	// proxygroup replica watches through the API.
	GroupConfigMap string
	// GroupL7Only runs a proxygroup replica without a kernel data path (no TUN device, no DNAT),
	// as the operator starts the replicas of a group that serves no L3 Service: unprivileged.
	GroupL7Only bool
	// BackendCheckInterval is how often a proxygroup replica checks that each L7 service has a
	// reachable backend (it advertises only those that do); 10s by default.
	BackendCheckInterval time.Duration
	// GroupWithdrawWait is how long a proxygroup replica keeps serving at shutdown after it
	// stopped advertising, so that clients move to other replicas first; 5s by default.
	GroupWithdrawWait time.Duration

	metrics *proxyMetrics // Run's
}

// Run runs the proxy until ctx ends (then it shuts down gracefully and returns nil), the config
// needs a restart (ErrRestartRequired), or it fails.
func Run(ctx context.Context, opts Options) error {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ConfigPollInterval <= 0 {
		opts.ConfigPollInterval = time.Second
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 10 * time.Second
	}
	if opts.StateDir == "" {
		opts.StateDir = filepath.Join(os.TempDir(), "tsingress-proxy")
	}
	kube, src, err := source(opts)
	if err != nil {
		return err
	}
	opts.metrics = newProxyMetrics()
	src = countingSource{src, opts.metrics}
	// Health first: while the config cannot be read, /readyz says why.
	hl := newHealth(opts.metrics)
	stopHealth, err := hl.serve(opts)
	if err != nil {
		return err
	}
	defer stopHealth()
	var cfg *contract.ProxyConfig
	var version int
	if err := untilDone(ctx, opts, hl, "reading the config", func(ctx context.Context) (err error) {
		cfg, version, err = src.load(ctx)
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return &ConfigError{err}
	}
	opts.Logger.Info("config loaded", "config", cfg.String(), "version", version)
	limitTailscaleContact(cfg.ControlURL, opts.Logger)
	portMapperOffByDefault()
	var mk newUnit
	switch cfg.Kind {
	case contract.KindIngress:
		mk = newIngress
	case contract.KindService:
		mk = newService
	case contract.KindProxyGroup:
		mk = newReplica
	default:
		return fmt.Errorf("proxy kind %q is not supported by this proxy build yet", cfg.Kind)
	}
	return run(ctx, opts, kube, src, hl, newUpdate(cfg, version, nil), mk)
}

// LoadConfig reads the proxy config once, from where opts say, as Run does first.
func LoadConfig(ctx context.Context, opts Options) (*contract.ProxyConfig, int, error) {
	_, src, err := source(opts)
	if err != nil {
		return nil, 0, err
	}
	cfg, v, err := src.load(ctx)
	if err != nil {
		return nil, 0, &ConfigError{err}
	}
	return cfg, v, nil
}

func source(opts Options) (kubernetes.Interface, configSource, error) {
	var kube kubernetes.Interface
	if opts.Kube != nil {
		if opts.Namespace == "" {
			return nil, nil, errors.New("a namespace is required to use the Kubernetes API")
		}
		var err error
		if kube, err = kubernetes.NewForConfig(opts.Kube); err != nil {
			return nil, nil, err
		}
	}
	switch {
	case opts.ConfigSecret != "" && opts.ConfigDir != "":
		return nil, nil, errors.New("set either a config Secret or a config directory, not both")
	case opts.ConfigSecret != "":
		if kube == nil {
			return nil, nil, errors.New("a config Secret needs access to the Kubernetes API")
		}
		return kube, &secretSource{client: kube, namespace: opts.Namespace, name: opts.ConfigSecret, log: opts.Logger}, nil
	case opts.ConfigDir != "":
		return kube, &dirSource{dir: opts.ConfigDir, interval: opts.ConfigPollInterval}, nil
	}
	return nil, nil, errors.New("no config Secret or config directory")
}
