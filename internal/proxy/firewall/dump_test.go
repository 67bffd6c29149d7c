package firewall

import (
	"fmt"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
	"github.com/tsingress/tsingress/internal/testing/netnstest"
)

// nftDump lists every table, chain and rule of families ip, ip6 and inet in ns, rules with
// their handle (new on every re-creation) and comment.
func nftDump(t *testing.T, ns netnstest.NS) []string {
	t.Helper()
	fd, done, err := openNetNS(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatalf("list chains: %v", err)
	}
	fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6", nftables.TableFamilyINet: "inet"}
	var out []string
	for _, tb := range tables {
		if f, ok := fam[tb.Family]; ok {
			out = append(out, fmt.Sprintf("table %s %s", f, tb.Name))
		}
	}
	for _, ch := range chains {
		f, ok := fam[ch.Table.Family]
		if !ok {
			continue
		}
		out = append(out, fmt.Sprintf("chain %s %s %s", f, ch.Table.Name, ch.Name))
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatalf("list rules of %s %s: %v", ch.Table.Name, ch.Name, err)
		}
		for _, r := range rules {
			tag, _ := userdata.GetString(r.UserData, userdata.TypeComment)
			out = append(out, fmt.Sprintf("rule %s %s %s handle=%d exprs=%d comment=%q", f, ch.Table.Name, ch.Name, r.Handle, len(r.Exprs), tag))
		}
	}
	return out
}

// iptDump lists the nat and mangle tables of both families in ns as iptables -S does.
func iptDump(t *testing.T, ns netnstest.NS, legacy bool) []string {
	t.Helper()
	var out []string
	err := netnamespace.Run(ns.Path, func() error {
		for _, f := range families {
			ipt, err := newIPT(f, iptBinaries(legacy)[f])
			if err != nil {
				return err
			}
			for _, table := range []string{"nat", "mangle"} {
				chains, err := ipt.ListChains(table)
				if err != nil {
					return err
				}
				for _, ch := range chains {
					rules, err := ipt.List(table, ch)
					if err != nil {
						return err
					}
					for _, r := range rules {
						out = append(out, fmt.Sprintf("%s %s: %s", f, table, r))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("iptables listing: %v", err)
	}
	return out
}
