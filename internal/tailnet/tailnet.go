package tailnet

import (
	"context"
	"net/netip"
	"time"
)

// Client is what the controllers need from the tailnet's control plane.
type Client interface {
	// CreateAuthKey mints a single-use, pre-authorized auth key.
	CreateAuthKey(ctx context.Context, req AuthKeyRequest) (AuthKey, error)
	// AuthKeys lists the auth keys not yet revoked, spent or expired, with their descriptions.
	// The API lists keys by ID only, so this costs a call per key: for rare sweeps.
	AuthKeys(ctx context.Context) ([]AuthKeyInfo, error)
	// DeleteAuthKey revokes an auth key; one already gone is not an error.
	DeleteAuthKey(ctx context.Context, id string) error

	// Device returns the device with the given stable node ID.
	Device(ctx context.Context, id string) (Device, error)
	// Devices lists every device the client can see.
	Devices(ctx context.Context) ([]Device, error)
	// DeleteDevice removes a device; a device that is already gone is not an error.
	DeleteDevice(ctx context.Context, id string) error

	// Service returns the Tailscale Service with the given name ("svc:<label>").
	Service(ctx context.Context, name string) (Service, error)
	// PutService creates or updates a Tailscale Service and returns it as stored,
	// with the addresses the control plane assigned.
	PutService(ctx context.Context, svc Service) (Service, error)
	// DeleteService removes a Tailscale Service; one that is already gone is not an error.
	DeleteService(ctx context.Context, name string) error
	// Services lists every Tailscale Service.
	Services(ctx context.Context) ([]Service, error)

	// TailnetInfo reports the tailnet-wide settings that decide whether proxies can serve HTTPS.
	TailnetInfo(ctx context.Context) (TailnetInfo, error)
}

// AuthKeyRequest describes an auth key to mint.
type AuthKeyRequest struct {
	// Tags are given to the device that logs in with the key; at least one is required,
	// and the OAuth client must own each of them.
	Tags []string
	// Description is shown in the admin console, e.g. "tsingress proxy default/web-0".
	Description string
	// Expiry is how long the key stays usable; zero means the control plane's default.
	Expiry time.Duration
}

// MaxKeyDescription is the longest description the control plane takes for an auth key.
const MaxKeyDescription = 50

// AuthKeyInfo describes an auth key, without its secret.
type AuthKeyInfo struct {
	ID, Description string
	Created         time.Time
}

// AuthKey is a minted auth key.
type AuthKey struct {
	ID      string
	Secret  Secret
	Expires time.Time
	// Created is when the control plane minted it, by the clock that dates its devices.
	Created time.Time
}

// Secret holds a credential. It formats as [REDACTED] so that it cannot reach logs, errors or
// events by accident; Reveal returns the value for the one place that needs it.
type Secret struct{ v string }

// NewSecret wraps a credential.
func NewSecret(v string) Secret { return Secret{v} }

// Reveal returns the credential itself.
func (s Secret) Reveal() string { return s.v }

func (Secret) String() string   { return "[REDACTED]" }
func (Secret) GoString() string { return "[REDACTED]" }

// Device is a node of the tailnet.
type Device struct {
	// ID is the stable node ID, the form the proxies record as their device ID.
	ID string
	// Name is the MagicDNS name, without the trailing dot.
	Name      string
	Hostname  string
	Tags      []string
	Addresses []netip.Addr
	// Created is when the device was added to the tailnet.
	Created time.Time
}

// Service is a Tailscale Service: a name with stable virtual addresses, served by the
// devices that advertise it.
type Service struct {
	// Name is "svc:" followed by a DNS label.
	Name string
	// Addrs are the service's IPv4 and IPv6 addresses, assigned by the control plane.
	Addrs []netip.Addr
	// Ports are "tcp:443"-style entries, or "do-not-validate".
	Ports       []string
	Tags        []string
	Comment     string
	Annotations map[string]string
}

// TailnetInfo holds the tailnet settings the operator cares about.
type TailnetInfo struct {
	HTTPSEnabled bool
	MagicDNS     bool
	// Domain is the tailnet's MagicDNS domain, e.g. "tail1234.ts.net", or empty when the API
	// does not reveal it (it is read off the devices' names, so a tailnet without devices has none).
	Domain string
}

// CertsAvailable reports whether devices can get HTTPS certificates: it takes both HTTPS and
// MagicDNS to be on.
func (t TailnetInfo) CertsAvailable() bool { return t.HTTPSEnabled && t.MagicDNS }
