// Package firewall installs the kernel DNAT of the L3 proxy: packets addressed to a tailnet IP
// (the proxy's own, or a Tailscale Service VIP) are rewritten to a destination IP (a Service
// ClusterIP, or the resolved addresses of an ExternalName), all protocols and ports; the
// connections so DNATed leave with the proxy's own address (masquerade), since the destination
// routes replies through its default gateway, which knows nothing of the tailnet; and TCP MSS is
// clamped to the path MTU on traffic forwarded in and out of the tunnel interface.
//
// Two backends produce the same rules: nftables (netlink, no binary needed) and iptables (the
// iptables/ip6tables binaries, nf_tables or legacy flavour). Every rule carries a comment
// "tsingress/<owner>/<hash>" naming the mapping it belongs to and a hash of its content, so a
// restarted process finds its rules again and rewrites only those that changed.
//
// Layout. nftables: tables "ip tsingress" and "ip6 tsingress", each with a "prerouting" chain
// (nat hook, priority dstnat), a "postrouting" chain (nat hook, priority srcnat) and a "forward"
// chain (filter hook, priority mangle). iptables: chains TSINGRESS-PREROUTING and
// TSINGRESS-POSTROUTING in the nat table, jumped to from the top of PREROUTING and POSTROUTING,
// and chain TSINGRESS-FORWARD in the mangle table, jumped to from the top of FORWARD. A family's
// tables or chains exist only while some mapping uses that family.
package firewall

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/sys/unix"
)

// Mode selects the firewall backend.
type Mode string

const (
	ModeAuto     Mode = "auto" // see DetectMode
	ModeNFTables Mode = "nftables"
	ModeIPTables Mode = "iptables"
)

// ParseMode accepts "", "auto", "nftables" and "iptables"; "" means auto.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeAuto, nil
	case ModeAuto, ModeNFTables, ModeIPTables:
		return m, nil
	}
	return "", fmt.Errorf("firewall mode %q: want auto, nftables or iptables", s)
}

// Mapping is one exposed destination. Each tailnet IP is DNATed to the destinations of its own
// address family; a tailnet IP with no destination of its family is left alone. With several
// destinations of a family, each new connection picks one of them.
type Mapping struct {
	// Name identifies the mapping in rule comments and in Status, e.g. "svc:web" or
	// "standalone". Letters, digits and ":._-", at most 100 characters.
	Name         string
	TailnetIPs   []netip.Addr
	Destinations []netip.Addr
}

// Status is what Apply left installed.
type Status struct {
	Mode Mode `json:"mode"`
	// Mappings is keyed by Mapping.Name.
	Mappings map[string]MappingStatus `json:"mappings"`
}

// MappingStatus describes one mapping. Its rules are installed exactly when Error is empty.
type MappingStatus struct {
	// TailnetIPs and Destinations are the addresses in use: those with a partner of their family,
	// in a family whose rules are in place.
	TailnetIPs   []netip.Addr `json:"tailnetIPs"`
	Destinations []netip.Addr `json:"destinations"`
	Error        string       `json:"error,omitempty"`
	// FamilyErrors says, per family ("ipv4", "ipv6"), why that family's rules are not in place.
	FamilyErrors map[string]string `json:"familyErrors,omitempty"`
}

// Runner owns the package's rules in one network namespace. Its methods are safe for
// concurrent use.
type Runner interface {
	// Mode is the backend in use: ModeNFTables or ModeIPTables.
	Mode() Mode
	// Apply makes the installed rules exactly those of mappings. Rules already as wanted are not
	// touched; a mapping whose update fails keeps its previous rules and reports the error in
	// Status, and Apply then returns an error too.
	Apply(ctx context.Context, mappings []Mapping) (Status, error)
	// Cleanup removes every table, chain and rule this backend ever installed.
	Cleanup(ctx context.Context) error
}

// Options configures New.
type Options struct {
	// Mode is the backend; "" means ModeAuto.
	Mode Mode
	// NetNS is the path of a network namespace file (e.g. /run/netns/x) to work in; "" means the
	// caller's namespace. nftables talks to it over netlink sockets opened inside it; iptables
	// binaries are started from an OS thread that has joined it.
	NetNS string
	// TunName is the tunnel interface for MSS clamping; "" means "tailscale0".
	TunName string
}

// New returns a Runner for the backend that opts.Mode selects. In auto mode DetectMode picks
// it; in iptables mode detection still picks the nf_tables or legacy flavour. New also removes
// what a runner of another backend or flavour left in the namespace (after a change of mode),
// so that two sets of DNAT rules never compete.
func New(ctx context.Context, opts Options) (Runner, error) {
	mode, err := ParseMode(string(opts.Mode))
	if err != nil {
		return nil, err
	}
	opts.Mode = mode
	if opts.TunName == "" {
		opts.TunName = "tailscale0"
	}
	if len(opts.TunName) >= unix.IFNAMSIZ || strings.ContainsAny(opts.TunName, "/ \t\n") {
		return nil, fmt.Errorf("tunnel interface name %q is not a valid interface name", opts.TunName)
	}
	d, err := DetectMode(ctx, opts.NetNS)
	switch {
	case err == nil && opts.Mode != ModeAuto:
		d.Mode = opts.Mode
	case err != nil && opts.Mode == ModeAuto:
		return nil, err
	case err != nil:
		// A forced mode works without detection, which only adds the iptables flavour (nf_tables
		// is the usual one) and the leftovers to remove.
		d = Detection{Mode: opts.Mode}
	}
	if err := removeLeftovers(ctx, opts, d); err != nil {
		return nil, fmt.Errorf("remove rules of another firewall mode: %w", err)
	}
	if d.Mode == ModeNFTables {
		return newNFTRunner(opts), nil
	}
	r, err := newIPTRunner(opts, d.Legacy)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// removeLeftovers deletes our rules from the backends that d did not choose.
func removeLeftovers(ctx context.Context, opts Options, d Detection) error {
	var errs []error
	if d.Mode != ModeNFTables && d.ours.nft {
		errs = append(errs, newNFTRunner(opts).Cleanup(ctx))
	}
	for _, legacy := range []bool{false, true} {
		ours := d.ours.xtNFT
		if legacy {
			ours = d.ours.xtLegacy
		}
		if !ours || (d.Mode == ModeIPTables && d.Legacy == legacy) {
			continue
		}
		r, err := newIPTRunner(opts, legacy)
		if err == nil {
			err = r.Cleanup(ctx)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
