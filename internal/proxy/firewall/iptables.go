package firewall

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/coreos/go-iptables/iptables"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

const (
	iptNATChain  = "TSINGRESS-PREROUTING"  // in nat, jumped to from PREROUTING
	iptSNATChain = "TSINGRESS-POSTROUTING" // in nat, jumped to from POSTROUTING
	iptFwdChain  = "TSINGRESS-FORWARD"     // in mangle, jumped to from FORWARD
	iptPrefix    = "TSINGRESS-"
	jumpTag      = "tsingress/jump"
)

// iptChains are our chains: table, built-in parent chain, our chain.
var iptChains = [][3]string{
	{"nat", "PREROUTING", iptNATChain},
	{"nat", "POSTROUTING", iptSNATChain},
	{"mangle", "FORWARD", iptFwdChain},
}

type iptRunner struct {
	mu   sync.Mutex
	opts Options
	ipt  [2]*iptables.IPTables
	// newErr explains a nil ipt entry, e.g. no ip6tables binary.
	newErr [2]error
}

// iptBinaries returns the iptables and ip6tables commands of the wanted flavour, preferring
// the explicitly named ones over whatever "iptables" points to.
func iptBinaries(legacy bool) [2]string {
	suffix := "-nft"
	if legacy {
		suffix = "-legacy"
	}
	var out [2]string
	for i, base := range []string{"iptables", "ip6tables"} {
		out[i] = base
		if _, err := exec.LookPath(base + suffix); err == nil {
			out[i] = base + suffix
		}
	}
	return out
}

func newIPTRunner(opts Options, legacy bool) (*iptRunner, error) {
	r := &iptRunner{opts: opts}
	bins := iptBinaries(legacy)
	for _, f := range families {
		r.ipt[f], r.newErr[f] = newIPT(f, bins[f])
	}
	if r.ipt[ipv4] == nil {
		return nil, fmt.Errorf("iptables: %w", r.newErr[ipv4])
	}
	return r, nil
}

// newIPT returns a handle on binary bin for family f.
func newIPT(f family, bin string) (*iptables.IPTables, error) {
	proto := iptables.ProtocolIPv4
	if f == ipv6 {
		proto = iptables.ProtocolIPv6
	}
	// --wait bounds how long we queue behind other users of the xtables lock.
	return iptables.New(iptables.IPFamily(proto), iptables.Path(bin), iptables.Timeout(10))
}

func (r *iptRunner) Mode() Mode { return ModeIPTables }

// ipv6Usable reports whether the kernel has IPv6; without it ip6tables fails on every call
// and there can be nothing of ours to find.
func ipv6Usable() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}

// handle returns the iptables handle of family f, or nil when the family cannot be used.
func (r *iptRunner) handle(f family) (*iptables.IPTables, error) {
	if f == ipv6 && !ipv6Usable() {
		return nil, errors.New("the kernel has no IPv6")
	}
	return r.ipt[f], r.newErr[f]
}

// Apply runs in the runner's namespace on one locked thread: go-iptables starts the binaries
// from the calling goroutine, and a child process inherits that thread's namespace.
func (r *iptRunner) Apply(ctx context.Context, mappings []Mapping) (Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := buildPlan(mappings, r.opts.TunName)
	err := netnamespace.Run(r.opts.NetNS, func() error {
		for _, f := range families {
			if err := ctx.Err(); err != nil {
				p.failFamily(f, err)
				continue
			}
			r.applyFamily(f, &p)
		}
		return nil
	})
	if err != nil {
		for _, f := range families {
			p.failFamily(f, err)
		}
	}
	return Status{Mode: ModeIPTables, Mappings: p.status}, errors.Join(p.errs...)
}

func (r *iptRunner) applyFamily(f family, p *plan) {
	fp := p.fams[f]
	ipt, err := r.handle(f)
	if fp.empty() {
		if ipt != nil {
			if err := removeChains(ipt); err != nil {
				p.errs = append(p.errs, fmt.Errorf("%s: %w", f, err))
			}
		}
		return
	}
	if err != nil {
		p.failFamily(f, err)
		return
	}
	for _, c := range iptChains {
		if err := ensureChain(ipt, c[0], c[1], c[2]); err != nil {
			p.failFamily(f, err)
			return
		}
	}
	var clampErr error
	err = reconcileIPT(ipt, "mangle", iptFwdChain, fp.clampWants(), func(i int) [][]string {
		return [][]string{clampSpec(fp.clamp[i])}
	}, func(_ int, err error) { clampErr = errors.Join(clampErr, err) })
	if err = errors.Join(clampErr, err); err != nil {
		p.failFamily(f, fmt.Errorf("mss clamp: %w", err))
	}

	// Source NAT goes in before the DNAT it serves, so that no DNATed connection leaves without.
	err = reconcileIPT(ipt, "nat", iptSNATChain, fp.snatWants(), func(i int) [][]string {
		var specs [][]string
		for _, d := range fp.dnat[i].rules {
			specs = append(specs, snatSpec(d.from, p.tun, fp.dnat[i].snatTag))
		}
		return specs
	}, func(i int, err error) { p.fail(fp.dnat[i].name, f, fmt.Errorf("source NAT: %w", err)) })
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", f, err))
	}

	dnatWants := make([]want, len(fp.dnat))
	specs := make([][][]string, len(fp.dnat))
	for i, o := range fp.dnat {
		for _, d := range o.rules {
			specs[i] = append(specs[i], dnatSpecs(d, o.tag)...)
		}
		dnatWants[i] = want{owner: o.name, tag: o.tag, n: len(specs[i])}
	}
	err = reconcileIPT(ipt, "nat", iptNATChain, dnatWants, func(i int) [][]string { return specs[i] },
		func(i int, err error) { p.fail(fp.dnat[i].name, f, err) })
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", f, err))
	}
}

// ensureChain creates chain in table and the jump to it at the top of parent, where missing.
func ensureChain(ipt *iptables.IPTables, table, parent, chain string) error {
	ok, err := ipt.ChainExists(table, chain)
	if err == nil && !ok {
		err = ipt.NewChain(table, chain)
	}
	if err != nil {
		return err
	}
	jump := []string{"-m", "comment", "--comment", jumpTag, "-j", chain}
	if ok, err = ipt.Exists(table, parent, jump...); err == nil && !ok {
		err = ipt.Insert(table, parent, 1, jump...)
	}
	return err
}

// removeChains deletes our jumps and chains of one family, where present.
func removeChains(ipt *iptables.IPTables) error {
	var errs []error
	for _, c := range iptChains {
		table, parent, chain := c[0], c[1], c[2]
		// A jump cannot exist without its target chain, so a missing chain means nothing to do.
		ok, err := ipt.ChainExists(table, chain)
		if err != nil || !ok {
			errs = append(errs, err)
			continue
		}
		jump := []string{"-m", "comment", "--comment", jumpTag, "-j", chain}
		for err == nil && ok {
			if ok, err = ipt.Exists(table, parent, jump...); err == nil && ok {
				err = ipt.Delete(table, parent, jump...)
			}
		}
		if err == nil {
			err = ipt.ClearAndDeleteChain(table, chain)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

var commentRE = regexp.MustCompile(`--comment "?([^"\s]*)`)

// reconcileIPT makes chain hold exactly wants. An owner's new rules are appended before its old
// ones are deleted, so traffic always finds one or the other; when an append fails the new rules
// added so far are removed instead, the old ones stay and onErr hears of it, as it does of a
// failure to list the chain. The error returned is that of removing rules. Rule numbers found
// by listing stay valid while appending, and deleting from the highest down keeps them valid.
func reconcileIPT(ipt *iptables.IPTables, table, chain string, wants []want, specs func(i int) [][]string, onErr func(i int, err error)) error {
	lines, err := ipt.List(table, chain)
	if err != nil {
		for i := range wants {
			onErr(i, fmt.Errorf("list %s %s: %w", table, chain, err))
		}
		return nil
	}
	var rules []found
	for _, l := range lines {
		if !strings.HasPrefix(l, "-A ") {
			continue
		}
		r := found{id: uint64(len(rules) + 1)}
		if m := commentRE.FindStringSubmatch(l); m != nil {
			r.tag = m[1]
		}
		rules = append(rules, r)
	}
	d := diffChain(rules, wants)
	drop := d.stale
	next := uint64(len(rules) + 1)
	for _, i := range d.install {
		first := next
		var err error
		for _, spec := range specs(i) {
			if err = ipt.Append(table, chain, spec...); err != nil {
				break
			}
			next++
		}
		if err != nil {
			onErr(i, err)
			for id := first; id < next; id++ {
				drop = append(drop, id)
			}
			continue
		}
		drop = append(drop, d.replaced[i]...)
	}
	slices.Sort(drop)
	for _, id := range slices.Backward(drop) {
		if err := ipt.DeleteById(table, chain, int(id)); err != nil {
			return fmt.Errorf("delete rule %d of %s %s: %w", id, table, chain, err)
		}
	}
	return nil
}

// dnatSpecs renders one DNAT as iptables rules. With n destinations, rule i takes every
// (n-i)th new connection of those that reach it and the last takes the rest, which spreads
// connections evenly in turn. Only a connection's first packet passes the nat table.
func dnatSpecs(d dnat, tag string) [][]string {
	dst := netip.PrefixFrom(d.from, d.from.BitLen()).String()
	var out [][]string
	for i, to := range d.to {
		spec := []string{"-d", dst}
		if rest := len(d.to) - i; rest > 1 {
			spec = append(spec, "-m", "statistic", "--mode", "nth", "--every", strconv.Itoa(rest), "--packet", "0")
		}
		out = append(out, append(spec, "-m", "comment", "--comment", tag, "-j", "DNAT", "--to-destination", to.String()))
	}
	return out
}

// snatSpec masquerades the connections DNATed from tailnet IP from (see snatExprs). iptables
// cannot match the input interface in POSTROUTING; the original destination says the same.
func snatSpec(from netip.Addr, tun, tag string) []string {
	return []string{"!", "-o", tun, "-m", "conntrack", "--ctstate", "DNAT",
		"--ctorigdst", netip.PrefixFrom(from, from.BitLen()).String(),
		"-m", "comment", "--comment", tag, "-j", "MASQUERADE"}
}

func clampSpec(cr clampRule) []string {
	dir := "-o"
	if cr.in {
		dir = "-i"
	}
	return []string{dir, cr.ifName, "-p", "tcp", "-m", "tcp", "--tcp-flags", "SYN,RST", "SYN",
		"-m", "comment", "--comment", cr.tag, "-j", "TCPMSS", "--clamp-mss-to-pmtu"}
}

func (r *iptRunner) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return netnamespace.Run(r.opts.NetNS, func() error {
		var errs []error
		for _, f := range families {
			if err := ctx.Err(); err != nil {
				return err
			}
			// Without a usable family there can be nothing of ours in it.
			if ipt, _ := r.handle(f); ipt != nil {
				errs = append(errs, removeChains(ipt))
			}
		}
		return errors.Join(errs...)
	})
}
