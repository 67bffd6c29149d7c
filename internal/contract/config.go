package contract

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// ProxyKind says what a proxy serves.
type ProxyKind string

const (
	// KindIngress is a standalone L7 proxy for one Ingress: Serve config inline in Serve.
	KindIngress ProxyKind = "ingress"
	// KindService is a standalone L3 proxy for one Service: DNAT to Forward.
	KindService ProxyKind = "service"
	// KindProxyGroup is a replica of an ingress ProxyGroup: its Serve config and DNAT mappings
	// come from the group's ConfigMap (ServeConfig and DNATConfig documents).
	KindProxyGroup ProxyKind = "proxygroup"
)

// FirewallMode selects the kernel firewall backend of an L3 proxy.
type FirewallMode string

const (
	FirewallAuto     FirewallMode = "auto" // detect from the rules already on the node
	FirewallNFTables FirewallMode = "nftables"
	FirewallIPTables FirewallMode = "iptables"
)

// CertShareMode says whether a ProxyGroup replica issues certificates or reads them.
type CertShareMode string

const (
	// CertIssuer replicas (ordinal 0) obtain and renew certificates and store them in Secrets.
	CertIssuer CertShareMode = "issuer"
	// CertReader replicas only load certificates that the issuer stored.
	CertReader CertShareMode = "reader"
)

// ProxyConfig is the proxy config document, written by the operator into a proxy's config
// Secret. It is the in-memory form of the newest schema version.
type ProxyConfig struct {
	// Version is the schema version of the stored document.
	Version int       `json:"version"`
	Kind    ProxyKind `json:"kind"`
	// Hostname of the proxy's tailnet device (a DNS label).
	Hostname string `json:"hostname"`
	// Tags of the device, requested at login.
	Tags []string `json:"tags,omitempty"`
	// ControlURL of the tailnet's control server; empty means Tailscale's.
	ControlURL string `json:"controlURL,omitempty"`
	// AuthKey logs the device in. The operator removes it once the device has authenticated.
	AuthKey string `json:"authKey,omitempty"`
	// AcceptRoutes accepts subnet routes from other tailnet nodes.
	AcceptRoutes bool `json:"acceptRoutes,omitempty"`
	// StateSecret names the Secret (in the proxy's namespace) where the proxy keeps its tailnet
	// state and reports its status (see the State* keys).
	StateSecret string `json:"stateSecret"`

	TLS      TLSConfig      `json:"tls,omitzero"`
	Firewall FirewallConfig `json:"firewall,omitzero"`

	// Serve is the L7 Serve config of a standalone Ingress proxy.
	Serve *WebService `json:"serve,omitempty"`
	// Forward is the destination of a standalone L3 Service proxy.
	Forward *Destination `json:"forward,omitempty"`
	// AdvertiseServices lists the Tailscale Services a ProxyGroup replica may advertise, up to
	// version 3. The replica advertises each one only once it can serve it. From version 4 a
	// replica may advertise every service its group's documents name, and the list is not
	// written: it grew with the group in every replica's config (see AdvertisesDocuments).
	AdvertiseServices []string `json:"advertiseServices,omitempty"`
	// Metrics makes the proxy serve Prometheus metrics at /metrics on its health address (a
	// ProxyClass's metrics.enable). Optional in any version: an older proxy ignores it and serves
	// none, and turning it on or off needs no restart.
	Metrics bool `json:"metrics,omitempty"`
}

// TLSConfig configures certificate issuance.
type TLSConfig struct {
	// ACMEDirectoryURL overrides the ACME directory (for example Let's Encrypt staging).
	ACMEDirectoryURL string `json:"acmeDirectoryURL,omitempty"`
	// CertShareMode is set for ProxyGroup replicas.
	CertShareMode CertShareMode `json:"certShareMode,omitempty"`
}

// FirewallConfig configures L3 DNAT.
type FirewallConfig struct {
	Mode FirewallMode `json:"mode,omitempty"`
}

// Destination is where an L3 proxy sends the traffic of a tailnet address: IPs (a Service's
// ClusterIPs, IPv4 and/or IPv6) or a DNS name that the proxy resolves (ExternalName Services).
type Destination struct {
	IPs     []string `json:"ips,omitempty"`
	DNSName string   `json:"dnsName,omitempty"`
	// ProxyProtocol (1 or 2; proxy config v7, DNAT config v2) relays the connections to Ports
	// in userspace, each opened with a PROXY protocol header of that version naming the client's
	// tailnet address, in place of DNAT. 0: everything DNATed, no header.
	ProxyProtocol int `json:"proxyProtocol,omitempty"`
	// Ports are the ports relayed with ProxyProtocol, each to the same port of the destination.
	Ports []Port `json:"ports,omitempty"`
}

// Port is a port and its transport protocol.
type Port struct {
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"` // TCP or UDP
}

var (
	dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	dnsName  = regexp.MustCompile(`^([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.?$`)
	tagRE    = regexp.MustCompile(`^tag:[a-zA-Z][a-zA-Z0-9-]*$`)
	svcName  = regexp.MustCompile(`^svc:[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// ValidDNSName reports whether s is a DNS name such as "app.example.com".
func ValidDNSName(s string) bool { return dnsName.MatchString(s) && !strings.HasSuffix(s, ".") }

// ValidHostname reports whether s can be a tailnet device or service hostname.
func ValidHostname(s string) bool { return dnsLabel.MatchString(s) }

// ValidTag reports whether s is a tailnet ACL tag such as "tag:k8s".
func ValidTag(s string) bool { return tagRE.MatchString(s) }

// ValidServiceName reports whether s is a Tailscale Service name such as "svc:web".
func ValidServiceName(s string) bool { return svcName.MatchString(s) }

// Validate checks the document; every problem is reported, joined.
func (c *ProxyConfig) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !ValidHostname(c.Hostname) {
		add("hostname %q is not a valid DNS label", c.Hostname)
	}
	for _, t := range c.Tags {
		if !ValidTag(t) {
			add("tag %q must look like tag:name", t)
		}
	}
	if c.StateSecret == "" {
		add("stateSecret is required")
	}
	switch c.Firewall.Mode {
	case "", FirewallAuto, FirewallNFTables, FirewallIPTables:
	default:
		add("firewall mode %q must be auto, nftables or iptables", c.Firewall.Mode)
	}
	switch c.TLS.CertShareMode {
	case "", CertIssuer, CertReader:
	default:
		add("certShareMode %q must be issuer or reader", c.TLS.CertShareMode)
	}
	switch c.Kind {
	case KindIngress:
		if c.Serve == nil {
			add("an ingress proxy needs serve")
		} else if err := c.Serve.Validate(); err != nil {
			add("serve: %w", err)
		}
	case KindService:
		if c.Forward == nil {
			add("a service proxy needs forward")
		} else if err := c.Forward.Validate(); err != nil {
			add("forward: %w", err)
		}
	case KindProxyGroup:
		if c.Serve != nil || c.Forward != nil {
			add("a proxygroup replica takes serve and forward from the group's ConfigMap, not its config")
		}
		if c.AdvertisesDocuments() && len(c.AdvertiseServices) > 0 {
			add("advertiseServices is not read from version 4: a replica advertises the services of its group's documents")
		}
		for _, s := range c.AdvertiseServices {
			if !ValidServiceName(s) {
				add("advertised service %q must look like svc:name", s)
			}
		}
	default:
		add("kind %q must be ingress, service or proxygroup", c.Kind)
	}
	return errors.Join(errs...)
}

// Validate checks a destination: IPs or a DNS name, not both.
func (d *Destination) Validate() error {
	switch {
	case len(d.IPs) == 0 && d.DNSName == "":
		return errors.New("no destination IPs or DNS name")
	case len(d.IPs) > 0 && d.DNSName != "":
		return errors.New("destination has both IPs and a DNS name")
	case d.DNSName != "" && !dnsName.MatchString(d.DNSName):
		return fmt.Errorf("destination DNS name %q is not valid", d.DNSName)
	}
	var errs []error
	for _, ip := range d.IPs {
		if _, err := netip.ParseAddr(ip); err != nil {
			errs = append(errs, fmt.Errorf("destination IP %q: %w", ip, err))
		}
	}
	return errors.Join(append(errs, d.validateProxyProtocol()...)...)
}

func (d *Destination) validateProxyProtocol() []error {
	switch d.ProxyProtocol {
	case 0:
		if len(d.Ports) > 0 {
			return []error{errors.New("ports are relayed only with a PROXY protocol version")}
		}
		return nil
	case 1, 2:
	default:
		return []error{fmt.Errorf("PROXY protocol version %d must be 1 or 2", d.ProxyProtocol)}
	}
	if len(d.Ports) == 0 {
		return []error{errors.New("a PROXY protocol relay needs ports")}
	}
	var errs []error
	seen := map[Port]bool{}
	for _, p := range d.Ports {
		switch {
		case p.Port == 0:
			errs = append(errs, errors.New("port 0"))
		case p.Protocol != "TCP" && p.Protocol != "UDP":
			errs = append(errs, fmt.Errorf("port %d: protocol %q must be TCP or UDP", p.Port, p.Protocol))
		case p.Protocol == "UDP" && d.ProxyProtocol == 1:
			errs = append(errs, fmt.Errorf("port %d: PROXY protocol v1 has no UDP form", p.Port))
		case seen[p]:
			errs = append(errs, fmt.Errorf("port %d/%s twice", p.Port, p.Protocol))
		}
		seen[p] = true
	}
	return errs
}

// ProxyConfigs stores ProxyConfig documents. The operator writes every version in its encode
// set that can express the document; the proxy reads the newest version it understands.
// Version 2 added the Serve config's certificate settings and route hosts, version 3 wildcard
// hosts (see ServeConfigs), version 4 a replica advertising its group's documents, version 5
// app capabilities and backend protocols (ServeConfigs v4), version 6 backend CAs and server
// names (ServeConfigs v5), version 7 a service proxy's PROXY protocol relay, version 8 method,
// header and query matches, header edits, redirects, rewrites, splits and timeouts (ServeConfigs v6),
// version 9 regular expressions, mirrors and backends answering a fixed status (ServeConfigs v7),
// version 10 ports (ServeConfigs v8).
var ProxyConfigs = codec[ProxyConfig]{
	name: "proxy-config",
	encode: map[int]func(*ProxyConfig) ([]byte, error){
		1: onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 1 },
			jsonEncoder(1, func(c *ProxyConfig, v int) { c.Version = v })),
		2: onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 2 },
			jsonEncoder(2, func(c *ProxyConfig, v int) { c.Version = v })),
		3: onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 3 },
			jsonEncoder(3, func(c *ProxyConfig, v int) { c.Version = v })),
		4:  onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 4 }, advertisingDocuments(4)),
		5:  onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 5 }, advertisingDocuments(5)),
		6:  onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 6 }, advertisingDocuments(6)),
		7:  onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 7 }, advertisingDocuments(7)),
		8:  onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 8 }, advertisingDocuments(8)),
		9:  onlyIf(func(c *ProxyConfig) bool { return c.minVersion() <= 9 }, advertisingDocuments(9)),
		10: advertisingDocuments(10),
	},
	decode: map[int]func([]byte) (*ProxyConfig, error){
		1:  jsonDecoder(1, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		2:  jsonDecoder(2, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		3:  jsonDecoder(3, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		4:  jsonDecoder(4, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		5:  jsonDecoder(5, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		6:  jsonDecoder(6, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		7:  jsonDecoder(7, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		8:  jsonDecoder(8, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		9:  jsonDecoder(9, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
		10: jsonDecoder(10, func(c *ProxyConfig) int { return c.Version }, (*ProxyConfig).Validate),
	},
}

// advertisingDocuments encodes version v (4 on), in which a replica advertises its group's
// documents rather than a list.
func advertisingDocuments(v int) func(*ProxyConfig) ([]byte, error) {
	return jsonEncoder(v, func(c *ProxyConfig, v int) {
		c.Version = v
		if c.Kind == KindProxyGroup {
			c.AdvertiseServices = nil
		}
	})
}

// AdvertisesDocuments reports whether a ProxyGroup replica may advertise every service its
// group's documents name (version 4 on) rather than only those AdvertiseServices lists.
func (c *ProxyConfig) AdvertisesDocuments() bool { return c.Version >= 4 }

func (c *ProxyConfig) minVersion() int {
	if c.Forward != nil && c.Forward.ProxyProtocol != 0 {
		return 7 // an older proxy would DNAT without the header the backend expects
	}
	if c.Serve == nil {
		return 1
	}
	switch v := c.Serve.minVersion(); {
	case v >= 6:
		return v + 2 // the Serve config's v6 came with the proxy config's v8 (v7 is the relay's), v7 with v9, v8 with v10
	case v >= 4:
		return v + 1 // the Serve config's v4 came with the proxy config's v5, v5 with v6
	default:
		return v
	}
}

// Redacted returns a copy safe to log: the auth key is replaced by a marker.
func (c ProxyConfig) Redacted() ProxyConfig {
	if c.AuthKey != "" {
		c.AuthKey = "REDACTED"
	}
	return c
}

// String never prints the auth key, so a config passed to a logger by mistake leaks nothing.
func (c ProxyConfig) String() string {
	r := c.Redacted()
	return fmt.Sprintf("ProxyConfig{v%d %s %s tags=%s authKey=%s}", r.Version, r.Kind, r.Hostname,
		strings.Join(r.Tags, ","), r.AuthKey)
}
