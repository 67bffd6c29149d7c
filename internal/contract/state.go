package contract

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Keys the proxy writes into its state Secret. The tailnet client's own state (machine key,
// profiles, certificates) lives in the same Secret under keys of its own.
const (
	StateDeviceID      = "device_id"      // stable node ID; set once the device has authenticated
	StateDeviceFQDN    = "device_fqdn"    // MagicDNS name, no trailing dot
	StateDeviceIPs     = "device_ips"     // JSON array of tailnet IPs
	StateConfigVersion = "config_version" // proxy config schema version the proxy runs
	StatePodUID        = "pod_uid"        // UID of the Pod that wrote these keys
	StateHTTPSEndpoint = "https_endpoint" // name served over HTTPS, once Serve config is applied
	StateFirewall      = "firewall_status"
	StateAdvertised    = "advertised_services" // JSON array of Tailscale Services now advertised
	StateProxyVersion  = "proxy_version"
	StateCertificates  = "certificates" // JSON: served name → CertificateStatus
	StateFunnel        = "funnel"       // JSON: name served with Funnel asked for → FunnelStatus
	StateLogin         = "login"        // LoginNeeded while the tailnet client waits for an interactive login
	StateWebPorts      = "web_ports"    // JSON array of the ports a standalone L7 proxy listens on, once it serves
)

// LoginNeeded is the login key while the node cannot log in by itself (no usable auth key: none,
// or one spent, revoked or expired; no stored login the control server accepts) and waits for
// someone to open its login URL, which the proxy never prints.
const LoginNeeded = "NeedsLogin"

// StateTailnetProfile is the tailnet client's current-profile key as the proxy stores it (the
// "ts." prefix, see docs/contract.md). It is written once the device has logged in and, unlike
// device_id, which every new Pod clears until it is up, it survives restarts.
const StateTailnetProfile = "ts._current-profile"

// LoggedIn reports whether a state Secret's data show a device that has logged in, so that no
// new auth key is needed: a restarting proxy logs in again with its stored identity.
func LoggedIn(data map[string][]byte) bool {
	return len(data[StateDeviceID]) > 0 || len(data[StateTailnetProfile]) > 0
}

// ProxyState is what a proxy reports about itself.
type ProxyState struct {
	DeviceID      string
	FQDN          string
	TailnetIPs    []string
	ConfigVersion int
	PodUID        string
	HTTPSEndpoint string
	Firewall      *FirewallStatus
	Advertised    []string
	ProxyVersion  string
	// Certificates, per served name (tailnet names and bring-your-own hosts).
	Certificates map[string]CertificateStatus
	// Funnel, per tailnet name whose web service asks for Funnel.
	Funnel map[string]FunnelStatus
	// Login is LoginNeeded while the node waits for an interactive login, else "".
	Login string
	// WebPorts are the ports a standalone L7 proxy listens on, once it serves its web service:
	// what says that a service without HTTPS (no HTTPSEndpoint to wait for) is served.
	WebPorts []int
}

// FunnelStatus says whether a tailnet name takes connections from the internet, or why not.
type FunnelStatus struct {
	// Public is set while the proxy takes Funnel connections for the name.
	Public  bool   `json:"public,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Stable reasons a proxy reports for a name not served over Funnel.
const (
	// FunnelNotPermitted: the tailnet does not let the proxy use Funnel: its policy grants the
	// proxy's tags no "funnel" node attribute, or HTTPS is off. The message is tailscaled's.
	FunnelNotPermitted = "NotPermitted"
	// FunnelFailed: the proxy could not set Funnel up.
	FunnelFailed = "Failed"
)

// Certificate sources reported in CertificateStatus.
const (
	CertSourceACME   = "acme"   // issued through the tailnet's ACME flow
	CertSourceSecret = "secret" // read from a kubernetes.io/tls Secret (shared or bring-your-own)
)

// Stable reasons a proxy reports for a name it has no certificate for.
const (
	CertReasonIssuanceHeld   = "IssuanceHeld"   // the operator's rate-limit guard holds issuance
	CertReasonIssuanceFailed = "IssuanceFailed" // the CA or the control plane refused or was unreachable
	CertReasonSecretInvalid  = "SecretInvalid"  // a certificate Secret is missing, malformed, expired or for other hosts
	CertReasonWaiting        = "WaitingForIssuer"
)

// CertificateStatus is the certificate a proxy serves for one name, or why it has none.
type CertificateStatus struct {
	Source string `json:"source,omitempty"`
	// Serial (hex) identifies an issuance: the operator counts each serial once against the
	// CA's rate limits.
	Serial    string    `json:"serial,omitempty"`
	NotBefore time.Time `json:"notBefore,omitzero"`
	NotAfter  time.Time `json:"notAfter,omitzero"`
	Reason    string    `json:"reason,omitempty"`
	Message   string    `json:"message,omitempty"`
}

// Valid reports whether the status describes a certificate valid at now.
func (c CertificateStatus) Valid(now time.Time) bool {
	return c.Serial != "" && now.After(c.NotBefore) && now.Before(c.NotAfter)
}

// RenewAt is when a certificate valid from notBefore to notAfter is due for renewal: after two
// thirds of its lifetime, as Let's Encrypt recommends and tailscaled does. The proxy renews then
// and the operator's rate-limit guard reserves the renewal then, so both read the rule here.
func RenewAt(notBefore, notAfter time.Time) time.Time {
	return notBefore.Add(notAfter.Sub(notBefore) * 2 / 3)
}

// RenewDue reports whether the proxy will ask the CA for this name at now: it has no valid
// certificate, or the one it has is due for renewal.
func (c CertificateStatus) RenewDue(now time.Time) bool {
	return !c.Valid(now) || !now.Before(RenewAt(c.NotBefore, c.NotAfter))
}

// FirewallStatus reports the DNAT rules a replica has in place, per mapping name (a Tailscale
// Service name, or StandaloneMapping). The operator compares it with what it asked for before it
// lets a replica advertise a service.
type FirewallStatus struct {
	// Mode is the backend in use: nftables or iptables.
	Mode FirewallMode `json:"mode"`
	// PodUID ties the status to the Pod that installed the rules.
	PodUID   string                 `json:"podUID"`
	Mappings map[string]AppliedDNAT `json:"mappings"`
	// Families says, per address family (FamilyIPv4, FamilyIPv6), what keeps the proxy from
	// forwarding that family at all. A family that works is absent.
	Families map[string]FamilyProblem `json:"families,omitempty"`
}

// Address families as FirewallStatus and AppliedDNAT name them.
const (
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
)

// Stable reasons of a FamilyProblem.
const (
	// FamilyForwardingOff: the family's IP forwarding is off in the proxy's network namespace and
	// the proxy cannot turn it on (a read-only /proc/sys without the init container or sysctl).
	FamilyForwardingOff = "ForwardingOff"
	// FamilyDisabled: the family is disabled in the proxy's network namespace or kernel
	// (net.ipv6.conf.all.disable_ipv6=1, as Docker and some CNIs set it).
	FamilyDisabled = "FamilyDisabled"
	// FamilyLinkFailed: the tunnel interface could not take the family's address or route.
	FamilyLinkFailed = "LinkFailed"
)

// FamilyProblem is why a proxy cannot forward one address family.
type FamilyProblem struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// StandaloneMapping names the single mapping of a standalone L3 proxy.
const StandaloneMapping = "standalone"

// AppliedDNAT is one mapping as installed.
type AppliedDNAT struct {
	// TailnetIPs and Destinations are what is forwarded now: the addresses of the families
	// whose rules are in place.
	TailnetIPs   []string `json:"tailnetIPs"`
	Destinations []string `json:"destinations"`
	// Error is set when the mapping, or a family of it, could not be installed.
	Error string `json:"error,omitempty"`
	// FamilyErrors says, per address family the mapping needs (one with a tailnet IP and a
	// destination), why that family is not forwarded.
	FamilyErrors map[string]string `json:"familyErrors,omitempty"`
}

// Data renders every key, empty ones included, so that writing it replaces stale values left
// by a previous Pod.
func (s *ProxyState) Data() (map[string][]byte, error) {
	d := map[string][]byte{
		StateDeviceID:      []byte(s.DeviceID),
		StateDeviceFQDN:    []byte(strings.TrimSuffix(s.FQDN, ".")),
		StatePodUID:        []byte(s.PodUID),
		StateHTTPSEndpoint: []byte(s.HTTPSEndpoint),
		StateProxyVersion:  []byte(s.ProxyVersion),
		StateLogin:         []byte(s.Login),
		StateConfigVersion: nil,
		StateDeviceIPs:     nil,
		StateFirewall:      nil,
		StateAdvertised:    nil,
		StateCertificates:  nil,
		StateFunnel:        nil,
		StateWebPorts:      nil,
	}
	if s.ConfigVersion > 0 {
		d[StateConfigVersion] = []byte(strconv.Itoa(s.ConfigVersion))
	}
	for key, v := range map[string]any{StateDeviceIPs: s.TailnetIPs, StateAdvertised: s.Advertised, StateFirewall: s.Firewall, StateCertificates: s.Certificates, StateFunnel: s.Funnel, StateWebPorts: s.WebPorts} {
		if isEmpty(v) {
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", key, err)
		}
		d[key] = b
	}
	return d, nil
}

func isEmpty(v any) bool {
	switch v := v.(type) {
	case []string:
		return len(v) == 0
	case []int:
		return len(v) == 0
	case *FirewallStatus:
		return v == nil
	case map[string]CertificateStatus:
		return len(v) == 0
	case map[string]FunnelStatus:
		return len(v) == 0
	}
	return false
}

// ParseState reads a state Secret's data. Missing keys give zero values; malformed values are an
// error naming the key.
func ParseState(data map[string][]byte) (*ProxyState, error) {
	s := &ProxyState{
		DeviceID:      string(data[StateDeviceID]),
		FQDN:          strings.TrimSuffix(string(data[StateDeviceFQDN]), "."),
		PodUID:        string(data[StatePodUID]),
		HTTPSEndpoint: string(data[StateHTTPSEndpoint]),
		ProxyVersion:  string(data[StateProxyVersion]),
		Login:         string(data[StateLogin]),
	}
	if v := data[StateConfigVersion]; len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil {
			return nil, fmt.Errorf("state key %s: %w", StateConfigVersion, err)
		}
		s.ConfigVersion = n
	}
	for key, dst := range map[string]any{StateDeviceIPs: &s.TailnetIPs, StateAdvertised: &s.Advertised, StateFirewall: &s.Firewall, StateCertificates: &s.Certificates, StateFunnel: &s.Funnel, StateWebPorts: &s.WebPorts} {
		if v := data[key]; len(v) > 0 {
			if err := json.Unmarshal(v, dst); err != nil {
				return nil, fmt.Errorf("state key %s: %w", key, err)
			}
		}
	}
	return s, nil
}

// CurrentFor returns the state only if it was written by the Pod with the given UID: values a
// previous Pod left behind do not describe the running proxy.
func (s *ProxyState) CurrentFor(podUID string) bool {
	return podUID != "" && s.PodUID == podUID
}
