package firewall

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// Detection is the outcome of DetectMode.
type Detection struct {
	// Mode is ModeNFTables or ModeIPTables.
	Mode Mode
	// Legacy is set when the iptables rules live in legacy x_tables rather than nf_tables, so
	// iptables mode drives iptables-legacy.
	Legacy bool
	// Reason says which rule decided.
	Reason string

	ours ours
}

// ours says where rules of this package were found.
type ours struct {
	nft, xtNFT, xtLegacy bool
}

// xtablesTables are the tables iptables-nft creates, in families ip and ip6.
var xtablesTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}

// census counts the rules of others in a namespace; ours are never counted, so a restarted
// proxy decides as it did before.
type census struct {
	native   int // nftables rules of families ip, ip6 and inet outside iptables' tables
	xtNFT    int // iptables rules kept in nf_tables (iptables-nft)
	xtLegacy int // iptables rules kept in legacy x_tables (iptables-legacy)

	kubeNFT      bool // kube-proxy's nftables table
	kubeXTNFT    bool // kube-proxy's KUBE-SERVICES chain, iptables-nft
	kubeXTLegacy bool // kube-proxy's KUBE-SERVICES chain, iptables-legacy

	ours ours
}

// DetectMode picks the backend whose rules already govern the network namespace at netns (""
// means the caller's), so that our DNAT sits beside kube-proxy's and the node's:
//
//  1. a KUBE-SERVICES chain in iptables (either flavour): iptables, as kube-proxy runs in
//     iptables mode;
//  2. otherwise a "kube-proxy" nftables table: nftables, as kube-proxy runs in nftables mode;
//  3. otherwise count rules: iptables rules (nf_tables tables named filter, nat, mangle, raw or
//     security in families ip and ip6, which iptables-nft owns, plus legacy x_tables rules)
//     against every other nftables rule of families ip, ip6 and inet. Strictly more iptables
//     rules: iptables; otherwise, an empty namespace included, nftables, which needs no binary;
//  4. iptables without an iptables binary: nftables.
//
// In iptables mode, Legacy is set when legacy x_tables holds more rules (or the only
// KUBE-SERVICES chain) than nf_tables does. Our own tables, chains and jumps are not counted;
// where they are is noted for New, which removes those of the mode not chosen.
func DetectMode(ctx context.Context, netns string) (Detection, error) {
	var c census
	if err := c.countNFT(netns); err != nil {
		return Detection{}, fmt.Errorf("detect firewall mode: nftables: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Detection{}, err
	}
	if err := netnamespace.Run(netns, c.countLegacy); err != nil {
		return Detection{}, fmt.Errorf("detect firewall mode: iptables-legacy: %w", err)
	}
	d := c.decide()
	if d.Mode == ModeIPTables {
		if _, err := exec.LookPath(iptBinaries(d.Legacy)[ipv4]); err != nil {
			d = Detection{Mode: ModeNFTables, Reason: d.Reason + ", but there is no iptables binary"}
		}
	}
	d.ours = c.ours
	return d, nil
}

func (c census) decide() Detection {
	legacy := c.xtLegacy > c.xtNFT || (c.kubeXTLegacy && !c.kubeXTNFT)
	switch {
	case c.kubeXTNFT || c.kubeXTLegacy:
		return Detection{Mode: ModeIPTables, Legacy: legacy, Reason: "kube-proxy's KUBE-SERVICES chain is in iptables"}
	case c.kubeNFT:
		return Detection{Mode: ModeNFTables, Reason: "kube-proxy's nftables table exists"}
	case c.xtNFT+c.xtLegacy > c.native:
		return Detection{Mode: ModeIPTables, Legacy: legacy,
			Reason: fmt.Sprintf("%d iptables rules outnumber %d nftables rules", c.xtNFT+c.xtLegacy, c.native)}
	}
	return Detection{Mode: ModeNFTables, Reason: fmt.Sprintf("%d nftables rules, %d iptables rules", c.native, c.xtNFT+c.xtLegacy)}
}

func (c *census) countNFT(netns string) error {
	fd, done, err := openNetNS(netns)
	if err != nil {
		return err
	}
	defer done()
	conn, _ := nftables.New(nftables.WithNetNSFd(fd)) // cannot fail without AsLasting
	chains, err := conn.ListChains()
	if err != nil {
		return err
	}
	for _, ch := range chains {
		fam, table := ch.Table.Family, ch.Table.Name
		if fam != nftables.TableFamilyIPv4 && fam != nftables.TableFamilyIPv6 && fam != nftables.TableFamilyINet {
			continue
		}
		xt := fam != nftables.TableFamilyINet && xtablesTables[table]
		if table == nftTable && fam != nftables.TableFamilyINet {
			c.ours.nft = true
			continue
		}
		if xt && strings.HasPrefix(ch.Name, iptPrefix) {
			c.ours.xtNFT = true
			continue
		}
		rules, err := conn.GetRules(ch.Table, ch)
		if err != nil {
			return fmt.Errorf("list %s %s: %w", table, ch.Name, err)
		}
		if !xt {
			c.kubeNFT = c.kubeNFT || table == "kube-proxy"
			c.native += len(rules)
			continue
		}
		c.kubeXTNFT = c.kubeXTNFT || ch.Name == "KUBE-SERVICES"
		for _, r := range rules {
			if !jumpsToOurs(r.Exprs) {
				c.xtNFT++
			}
		}
	}
	return nil
}

func jumpsToOurs(exprs []expr.Any) bool {
	for _, e := range exprs {
		if v, ok := e.(*expr.Verdict); ok && strings.HasPrefix(v.Chain, iptPrefix) {
			return true
		}
	}
	return false
}

// countLegacy counts legacy x_tables rules. It runs in the namespace, and lists only the tables
// the kernel says exist there: listing others would make the kernel create them.
func (c *census) countLegacy() error {
	for _, f := range families {
		names, bin := "ip_tables_names", "iptables-legacy"
		if f == ipv6 {
			names, bin = "ip6_tables_names", "ip6tables-legacy"
		}
		// thread-self, not self: this thread may be in another namespace than the process.
		b, err := os.ReadFile("/proc/thread-self/net/" + names)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		tables := strings.Fields(string(b))
		if len(tables) == 0 {
			continue
		}
		if _, err := exec.LookPath(bin); err != nil {
			continue // nothing here could drive those rules, nor need to
		}
		ipt, err := newIPT(f, bin)
		if err != nil {
			return err
		}
		for _, table := range tables {
			chains, err := ipt.ListChains(table)
			if err != nil {
				return err
			}
			for _, ch := range chains {
				c.kubeXTLegacy = c.kubeXTLegacy || ch == "KUBE-SERVICES"
				if strings.HasPrefix(ch, iptPrefix) {
					c.ours.xtLegacy = true
					continue
				}
				rules, err := ipt.List(table, ch)
				if err != nil {
					return err
				}
				for _, l := range rules {
					if strings.HasPrefix(l, "-A ") && !strings.Contains(l, " -j "+iptPrefix) {
						c.xtLegacy++
					}
				}
			}
		}
	}
	return nil
}
