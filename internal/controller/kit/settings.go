package kit

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tsingress/tsingress/internal/acmebudget"
	"github.com/tsingress/tsingress/internal/contract"
)

// Settings are the operator-wide options every reconciler reads.
type Settings struct {
	// Namespace holds every proxy's child objects (Secrets, StatefulSets, RBAC).
	Namespace string
	// PrivilegedNamespace, when set, is where the Pods of proxies on the kernel data path run
	// (L3 Services' proxies, ProxyGroups a Service is on): root with NET_ADMIN, which Namespace
	// then need not admit. Their Secrets, Roles and mint records stay in Namespace; only the
	// StatefulSet, its ServiceAccount and metrics Service, and a copy of the CA bundle go there.
	// Empty: Namespace.
	PrivilegedNamespace string
	// IngressClassName is the IngressClass this operator serves.
	IngressClassName string
	// DefaultProxyClass applies to objects that name no ProxyClass.
	DefaultProxyClass string
	// DefaultTags are given to proxies that ask for none.
	DefaultTags []string
	// ProxyImage runs the proxies.
	ProxyImage string
	// FirewallMode is passed to L3 proxies: auto, nftables or iptables.
	FirewallMode contract.FirewallMode
	// DefaultLoadBalancer also serves LoadBalancer Services that have no loadBalancerClass.
	DefaultLoadBalancer bool
	// ControlURL is the tailnet's control server for the proxies; empty means Tailscale's.
	ControlURL string
	// ACMEDirectoryURL is the ACME directory proxies get certificates from unless their ProxyClass
	// picks Let's Encrypt's staging one: a private CA (step-ca, Pebble) for a tailnet on a control
	// server of one's own. Empty means Let's Encrypt.
	ACMEDirectoryURL string
	// ProxyCAConfigMap names a ConfigMap in Namespace whose PEM certificates every proxy trusts
	// besides the system roots: the root of a private ACME CA or control server.
	ProxyCAConfigMap string
	// ProxyNoLogs forbids every proxy to upload its logs (TS_NO_LOGS_NO_SUPPORT), even to
	// Tailscale's log server with Tailscale's control server. Proxies of another control server
	// never upload them.
	ProxyNoLogs bool
	// CertificateLimits are the ACME CA's rate limits the operator keeps proxies within; zero
	// means Let's Encrypt's.
	CertificateLimits acmebudget.Limits
	// Metrics receives the operator's metrics; nil means controller-runtime's registry, which
	// the manager's metrics endpoint serves.
	Metrics prometheus.Registerer
	// SharedServiceResync is how often the operator checks that it is still recorded among the
	// owners of each of its Tailscale Services, which other operators (clusters) may share, at
	// least (it waits up to twice as long); zero means five minutes.
	SharedServiceResync time.Duration
	// GroupShardBytes bounds the documents in one of a ProxyGroup's ConfigMaps, beyond which
	// they are spread over more; zero means 128 KiB.
	GroupShardBytes int
	// MaxGroupReplicas bounds a ProxyGroup's replicas, each a tailnet device with an auth key
	// of its own; zero means DefaultMaxGroupReplicas.
	MaxGroupReplicas int
	// FunnelNamespaces lists the namespaces whose objects may be served to the internet through
	// Funnel; nil means every namespace, empty none.
	FunnelNamespaces []string
}

// FunnelAllowed reports whether objects of namespace may turn Funnel on.
func (s *Settings) FunnelAllowed(namespace string) bool {
	return s.FunnelNamespaces == nil || slices.Contains(s.FunnelNamespaces, namespace)
}

// PodNamespace is where the Pods of a proxy run: kernel ones apart when the operator is told to.
func (s *Settings) PodNamespace(kernel bool) string {
	if kernel && s.PrivilegedNamespace != "" {
		return s.PrivilegedNamespace
	}
	return s.Namespace
}

// PodNamespaces lists the namespaces proxy Pods may run in: Namespace, then PrivilegedNamespace.
func (s *Settings) PodNamespaces() []string {
	if s.PrivilegedNamespace == "" || s.PrivilegedNamespace == s.Namespace {
		return []string{s.Namespace}
	}
	return []string{s.Namespace, s.PrivilegedNamespace}
}

// DefaultMaxGroupReplicas is the bound on a ProxyGroup's replicas unless the operator is given
// another.
const DefaultMaxGroupReplicas = 32

// GroupReplicasLimit is the most replicas a ProxyGroup may have.
func (s *Settings) GroupReplicasLimit() int {
	if s.MaxGroupReplicas > 0 {
		return s.MaxGroupReplicas
	}
	return DefaultMaxGroupReplicas
}

// Validate checks the settings at start-up, so a misconfigured operator fails at once.
func (s *Settings) Validate() error {
	var errs []error
	if s.Namespace == "" {
		errs = append(errs, errors.New("operator namespace is required"))
	}
	if s.IngressClassName == "" {
		errs = append(errs, errors.New("ingress class name is required"))
	}
	if s.ProxyImage == "" {
		errs = append(errs, errors.New("proxy image is required"))
	}
	if len(s.DefaultTags) == 0 {
		errs = append(errs, errors.New("at least one default proxy tag is required"))
	}
	for _, t := range s.DefaultTags {
		if !contract.ValidTag(t) {
			errs = append(errs, fmt.Errorf("default proxy tag %q must look like tag:name", t))
		}
	}
	if l := s.CertificateLimits; l != (acmebudget.Limits{}) && (l.PerDomain < 1 || l.PerName < 1 || l.Window <= 0) {
		errs = append(errs, fmt.Errorf("certificate limits must be positive: %d new per domain, %d per name, window %s", l.PerDomain, l.PerName, l.Window))
	}
	if s.ACMEDirectoryURL != "" {
		if u, err := url.Parse(s.ACMEDirectoryURL); err != nil || u.Scheme != "https" || u.Host == "" {
			errs = append(errs, fmt.Errorf("ACME directory URL %q must be an https URL", s.ACMEDirectoryURL))
		}
	}
	if s.ProxyCAConfigMap != "" && len(validation.IsDNS1123Subdomain(s.ProxyCAConfigMap)) > 0 {
		errs = append(errs, fmt.Errorf("proxy CA ConfigMap name %q is not a valid object name", s.ProxyCAConfigMap))
	}
	if s.PrivilegedNamespace != "" && len(validation.IsDNS1123Label(s.PrivilegedNamespace)) > 0 {
		errs = append(errs, fmt.Errorf("privileged proxy namespace %q is not a namespace name", s.PrivilegedNamespace))
	}
	for _, ns := range s.FunnelNamespaces {
		if len(validation.IsDNS1123Label(ns)) > 0 {
			errs = append(errs, fmt.Errorf("namespace %q allowed Funnel is not a namespace name", ns))
		}
	}
	if s.MaxGroupReplicas < 0 {
		errs = append(errs, fmt.Errorf("the maximum of a ProxyGroup's replicas, %d, must not be negative", s.MaxGroupReplicas))
	}
	switch s.FirewallMode {
	case contract.FirewallAuto, contract.FirewallNFTables, contract.FirewallIPTables:
	default:
		errs = append(errs, fmt.Errorf("firewall mode %q must be auto, nftables or iptables", s.FirewallMode))
	}
	return errors.Join(errs...)
}
