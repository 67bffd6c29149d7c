// Package l3 is the data path of the L3 proxy: tailnet packets reach a kernel TUN interface,
// and the kernel DNATs them (package firewall) to a Kubernetes Service's ClusterIP or to the
// resolved addresses of an ExternalName, all ports, TCP and UDP, and routes the replies back
// into the TUN.
//
// A Forwarder owns the TUN device, its addresses and routes, IP forwarding and the firewall
// rules of one network namespace. The caller hands TUN to tsnet.Server.Tun: with a TUN of its
// own, tsnet gives packets for the node's addresses that no tsnet listener or dial of its own
// claims to the TUN instead of its userspace stack, and sends what the kernel routes into the
// TUN over WireGuard. Once the node is up, SetTailnetIPs and SetMappings say what to forward.
//
// tsnet's userspace stack still answers the ports it uses itself on the node's addresses: the
// peer API (one TCP port) and any tsnet listener the caller opens.
package l3

import (
	"context"
	"errors"
	"fmt"
	"log"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/tailscale/wireguard-go/tun"
	"github.com/vishvananda/netlink"
	"tailscale.com/net/tstun"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/firewall"
)

// Resolver looks up DNS names; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configures New.
type Options struct {
	// NetNS is the path of the network namespace file (e.g. /run/netns/x) to create the TUN
	// and install rules in; "" means the caller's namespace.
	NetNS string
	// TunName is the TUN interface's name; "" means "tailscale0".
	TunName string
	// MTU of the TUN; 0 means tailscale's default (1280, or TS_DEBUG_MTU).
	MTU int
	// FirewallMode is the DNAT backend; "" means auto (firewall.DetectMode).
	FirewallMode contract.FirewallMode
	// Logf receives what the forwarder does; nil means log.Printf.
	Logf logger.Logf
	// Resolver resolves DNS-name destinations; nil means net.DefaultResolver.
	Resolver Resolver
	// ResolveInterval is how often DNS-name destinations are resolved again; 0 means a minute.
	ResolveInterval time.Duration
}

const (
	defaultResolveInterval = time.Minute
	lookupTimeout          = 10 * time.Second
)

// Forwarder forwards the traffic of tailnet addresses to destinations through the kernel. Its
// methods are safe for concurrent use.
type Forwarder struct {
	opts Options
	logf logger.Logf
	nl   *netlink.Handle
	dev  *device
	fw   firewall.Runner

	changed    chan struct{}
	stopLookup context.CancelFunc
	lookupDone chan struct{}

	// applyMu serialises everything that changes kernel state.
	applyMu    sync.Mutex
	closed     bool
	mappings   []Mapping
	resolved   map[string]resolution // by nameKey
	tailnetIPs []netip.Addr          // as last given to SetTailnetIPs
	linkErrs   [2]error              // per family, from the last configuration of the TUN
	linkSkip   [2]bool               // families left off the TUN as unusable

	mu     sync.Mutex
	status contract.FirewallStatus
}

// New creates the TUN device in opts.NetNS, enables IP forwarding there where it can and
// prepares the firewall backend. Until SetMappings, nothing is forwarded. A family that cannot
// be forwarded (forwarding off and /proc/sys read-only, IPv6 disabled) is no error: Status
// reports it, and every later change checks it again.
func New(ctx context.Context, opts Options) (_ *Forwarder, err error) {
	if opts.TunName == "" {
		opts.TunName = "tailscale0"
	}
	if opts.MTU == 0 {
		opts.MTU = int(tstun.DefaultTUNMTU())
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.ResolveInterval <= 0 {
		opts.ResolveInterval = defaultResolveInterval
	}
	f := &Forwarder{
		opts:       opts,
		logf:       opts.Logf,
		changed:    make(chan struct{}, 1),
		lookupDone: make(chan struct{}),
		resolved:   map[string]resolution{},
	}
	if f.logf == nil {
		f.logf = log.Printf
	}
	if f.nl, err = netlinkHandle(opts.NetNS); err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer func() {
		if err != nil {
			f.nl.Close()
		}
	}()
	// The firewall checks the interface name before anything is created.
	if f.fw, err = firewall.New(ctx, firewall.Options{Mode: firewall.Mode(opts.FirewallMode), NetNS: opts.NetNS, TunName: opts.TunName}); err != nil {
		return nil, err
	}
	if f.dev, err = createTUN(opts.NetNS, opts.TunName, opts.MTU, f.nl); err != nil {
		return nil, err
	}
	// The tailnet ranges route into the TUN before the node starts: what the kernel sends
	// there meanwhile (an ICMP error about a packet of the node's, say) must not go to the
	// Pod's default gateway. A family that fails is in the status.
	f.syncLink() //nolint:errcheck // recorded in f.linkErrs
	f.status = contract.FirewallStatus{Mode: contract.FirewallMode(f.fw.Mode()), Mappings: map[string]contract.AppliedDNAT{},
		Families: f.checkFamilies()}
	lookupCtx, cancel := context.WithCancel(context.Background())
	f.stopLookup = cancel
	go f.lookupLoop(lookupCtx)
	f.logf("l3: TUN %s up (MTU %d), firewall mode %s", opts.TunName, opts.MTU, f.fw.Mode())
	return f, nil
}

// checkFamilies finds what keeps each family from being forwarded, logs what changed since the
// last check, and returns it as the status reports it. applyMu is held, or f is not shared yet.
func (f *Forwarder) checkFamilies() map[string]contract.FamilyProblem {
	problems := f.familyProblems(f.linkErrs)
	out := map[string]contract.FamilyProblem{}
	for i, p := range problems {
		name := familyNames[i]
		prev, had := f.status.Families[name]
		switch {
		case p != nil && (!had || prev != *p):
			f.logf("l3: %s traffic cannot be forwarded: %s", name, p.Message)
		case p == nil && had:
			f.logf("l3: %s traffic can be forwarded again", name)
		}
		if p != nil {
			out[name] = *p
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// TUN is the device to set as tsnet.Server.Tun. tsnet closes it when it shuts down, and the
// kernel then deletes the interface with its addresses and routes.
func (f *Forwarder) TUN() tun.Device { return f.dev }

// SetTailnetIPs gives the TUN interface the node's tailnet addresses; the tailnet ranges
// (100.64.0.0/10, fd7a:115c:a1e0::/48) route to it from New on, so that replies to tailnet
// clients go back into the tunnel. Call it whenever the node's addresses change. A family that
// fails leaves the other configured; the error names it, the status reports it, and the next
// SetMappings tries again. A family disabled in the namespace is left out, and reported.
func (f *Forwarder) SetTailnetIPs(ips []netip.Addr) error {
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	if f.closed {
		return errors.New("l3: forwarder is closed")
	}
	for _, ip := range ips {
		if ip = ip.Unmap(); !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() {
			return fmt.Errorf("l3: %v is not a usable tailnet address", ip)
		}
	}
	f.tailnetIPs = slices.Clone(ips)
	err := f.syncLink()
	f.setStatus(f.statusWith(f.checkFamilies()))
	return err
}

// syncLink configures the TUN for f.tailnetIPs, leaving out a family that is disabled, and
// records each family's outcome, which the status reports. applyMu is held, or f is not
// shared yet.
func (f *Forwarder) syncLink() error {
	f.linkSkip = [2]bool{false, f.ipv6Disabled() != ""}
	f.linkErrs = f.dev.syncLink(f.tailnetIPs, f.linkSkip)
	var errs []error
	for i, err := range f.linkErrs {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", familyNames[i], err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("l3: configure %s: %w", f.opts.TunName, err)
	}
	return nil
}

// statusWith is the current status with families' problems replaced.
func (f *Forwarder) statusWith(families map[string]contract.FamilyProblem) contract.FirewallStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return contract.FirewallStatus{Mode: f.status.Mode, Mappings: f.status.Mappings, Families: families}
}

// SetMappings makes the installed DNAT exactly that of mappings. DNS names not resolved yet are
// resolved first; from then on every ResolveInterval, and rules change only when an answer
// does (a failed lookup keeps the last answer). A mapping that cannot be installed carries the
// error in Status, and the errors are returned too; a failed kernel update keeps the mapping's
// previous rules.
func (f *Forwarder) SetMappings(ctx context.Context, mappings []Mapping) error {
	seen := map[string]bool{}
	for _, m := range mappings {
		if seen[m.Name] {
			return fmt.Errorf("l3: duplicate mapping name %q", m.Name)
		}
		seen[m.Name] = true
	}
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	if f.closed {
		return errors.New("l3: forwarder is closed")
	}
	f.mappings = slices.Clone(mappings)
	names := dnsNames(mappings)
	resolved := map[string]resolution{}
	for _, name := range names {
		r := f.resolved[name]
		if len(r.addrs) == 0 {
			r, _ = f.lookup(ctx, name, r)
		}
		resolved[name] = r
	}
	f.resolved = resolved
	return f.apply(ctx)
}

// lookup resolves name and returns what to use next, and whether that changes the rules.
func (f *Forwarder) lookup(ctx context.Context, name string, prev resolution) (resolution, bool) {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	// Absolute, as the CNAME that an ExternalName Service stands for: no search domains.
	answer, err := f.opts.Resolver.LookupNetIP(ctx, "ip", name+".")
	if errors.Is(ctx.Err(), context.Canceled) {
		return prev, false // closing
	}
	next, changed := prev.next(answer, err)
	switch {
	case err != nil && len(prev.addrs) > 0:
		f.logf("l3: resolve %s: %v; keeping %v", name, err, prev.addrs)
	case err != nil:
		f.logf("l3: resolve %s: %v", name, err)
	case changed:
		f.logf("l3: %s resolves to %v", name, next.addrs)
	}
	return next, changed
}

// lookupLoop resolves the DNS names in use every ResolveInterval and reapplies the rules when
// an answer changed.
func (f *Forwarder) lookupLoop(ctx context.Context) {
	defer close(f.lookupDone)
	t := time.NewTicker(f.opts.ResolveInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.applyMu.Lock()
		prev := maps.Clone(f.resolved)
		f.applyMu.Unlock()
		// Look up without the lock, so that a slow DNS server does not hold up SetMappings.
		next := map[string]resolution{}
		changed := false
		for name, p := range prev {
			r, c := f.lookup(ctx, name, p)
			next[name], changed = r, changed || c
		}
		if !changed || ctx.Err() != nil {
			continue
		}
		f.applyMu.Lock()
		for name, r := range next {
			// Names that SetMappings dropped meanwhile stay dropped.
			if _, ok := f.resolved[name]; ok {
				f.resolved[name] = r
			}
		}
		if err := f.apply(ctx); err != nil {
			f.logf("l3: %v", err)
		}
		f.applyMu.Unlock()
	}
}

// apply installs the rules of f.mappings, for the families that can be forwarded, and publishes
// the status. A family that cannot is an error for every mapping that needs it, so that the
// caller tries again later. applyMu is held.
func (f *Forwarder) apply(ctx context.Context) error {
	var linkErr error
	if f.linkErrs != [2]error{} || f.linkSkip[1] != (f.ipv6Disabled() != "") {
		linkErr = f.syncLink()
	}
	families := f.checkFamilies()
	fms, errs := firewallMappings(f.mappings, f.resolved)
	fms, famErrs := withoutFamilies(fms, families, errs)
	st, err := f.fw.Apply(ctx, fms)
	cs := contractStatus(f.fw.Mode(), f.mappings, errs, famErrs, st)
	cs.Families = families
	f.setStatus(cs)
	all := []error{linkErr, err}
	for _, name := range slices.Sorted(maps.Keys(errs)) {
		all = append(all, fmt.Errorf("mapping %s: %w", name, errs[name]))
	}
	for _, name := range slices.Sorted(maps.Keys(famErrs)) {
		if _, failed := errs[name]; !failed {
			for _, fam := range slices.Sorted(maps.Keys(famErrs[name])) {
				all = append(all, fmt.Errorf("mapping %s: %s: %s", name, fam, famErrs[name][fam]))
			}
		}
	}
	if err := errors.Join(all...); err != nil {
		return fmt.Errorf("l3: %w", err)
	}
	return nil
}

func (f *Forwarder) setStatus(st contract.FirewallStatus) {
	f.mu.Lock()
	same := reflect.DeepEqual(f.status, st)
	f.status = st
	f.mu.Unlock()
	if !same {
		select {
		case f.changed <- struct{}{}:
		default: // a notification is pending already
		}
	}
}

// Status reports the firewall mode, the families that cannot be forwarded and why, and, per
// mapping name, the tailnet IPs and destinations installed or the errors that kept them out.
// PodUID is left for the caller to fill in.
func (f *Forwarder) Status() contract.FirewallStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return contract.FirewallStatus{Mode: f.status.Mode, Mappings: maps.Clone(f.status.Mappings), Families: maps.Clone(f.status.Families)}
}

// Changed receives a value after Status changes; changes that come before the value is taken
// are folded into one.
func (f *Forwarder) Changed() <-chan struct{} { return f.changed }

// Close removes every rule of the firewall backend and the TUN interface. A tsnet node still
// running on the TUN loses it, so shut the node down first.
func (f *Forwarder) Close(ctx context.Context) error {
	f.stopLookup()
	<-f.lookupDone
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	err := errors.Join(f.fw.Cleanup(ctx), f.dev.remove())
	f.nl.Close()
	f.setStatus(contract.FirewallStatus{Mode: contract.FirewallMode(f.fw.Mode()), Mappings: map[string]contract.AppliedDNAT{}})
	if err != nil {
		return fmt.Errorf("l3: close: %w", err)
	}
	return nil
}
