package contract

import (
	"errors"
	"fmt"
	"net/netip"
)

// DNATConfig is a ProxyGroup's L3 document in its ConfigMap: for each Tailscale Service, the
// VIP addresses a replica DNATs, and the destination.
type DNATConfig struct {
	Version  int                    `json:"version"`
	Services map[string]DNATService `json:"services"`
}

// DNATService maps a Tailscale Service's VIPs to a destination. Each VIP is DNATed to the
// destination addresses of its own family.
type DNATService struct {
	VIPs        []string    `json:"vips"`
	Destination Destination `json:"destination"`
}

// Validate checks every mapping.
func (d *DNATConfig) Validate() error {
	var errs []error
	for name, svc := range d.Services {
		if !ValidServiceName(name) {
			errs = append(errs, fmt.Errorf("service name %q must look like svc:name", name))
		}
		if len(svc.VIPs) == 0 {
			errs = append(errs, fmt.Errorf("%s: no VIPs", name))
		}
		for _, ip := range svc.VIPs {
			if _, err := netip.ParseAddr(ip); err != nil {
				errs = append(errs, fmt.Errorf("%s: VIP %q: %w", name, ip, err))
			}
		}
		if err := svc.Destination.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		for _, p := range svc.Destination.Ports {
			if p.Protocol == "UDP" {
				// A replica can bind a VIP's UDP port only once it hosts the VIP, after it
				// advertises: the relay would start too late.
				errs = append(errs, fmt.Errorf("%s: port %d/UDP: a replica relays TCP ports only", name, p.Port))
			}
		}
	}
	return errors.Join(errs...)
}

// relays reports whether a service relays with a PROXY protocol header, which version 2 added:
// an older replica would DNAT without the header the backend expects.
func (d *DNATConfig) relays() bool {
	for _, svc := range d.Services {
		if svc.Destination.ProxyProtocol != 0 {
			return true
		}
	}
	return false
}

// DNATConfigs stores DNATConfig documents. Version 2 added the PROXY protocol relay.
var DNATConfigs = codec[DNATConfig]{
	name: "dnat-config",
	encode: map[int]func(*DNATConfig) ([]byte, error){
		1: onlyIf(func(c *DNATConfig) bool { return !c.relays() },
			jsonEncoder(1, func(c *DNATConfig, v int) { c.Version = v })),
		2: jsonEncoder(2, func(c *DNATConfig, v int) { c.Version = v }),
	},
	decode: map[int]func([]byte) (*DNATConfig, error){
		1: jsonDecoder(1, func(c *DNATConfig) int { return c.Version }, (*DNATConfig).Validate),
		2: jsonDecoder(2, func(c *DNATConfig) int { return c.Version }, (*DNATConfig).Validate),
	},
}
