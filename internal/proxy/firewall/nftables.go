package firewall

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

const (
	nftTable   = "tsingress"
	nftNAT     = "prerouting"
	nftSNAT    = "postrouting"
	nftForward = "forward"
)

type nftRunner struct {
	mu   sync.Mutex
	opts Options
}

func newNFTRunner(opts Options) *nftRunner { return &nftRunner{opts: opts} }

func (r *nftRunner) Mode() Mode { return ModeNFTables }

func nftFamily(f family) nftables.TableFamily {
	if f == ipv4 {
		return nftables.TableFamilyIPv4
	}
	return nftables.TableFamilyIPv6
}

// session opens the runner's namespace for one Apply or Cleanup; conn returns a fresh
// connection on it. Connections are not "lasting": every operation gets its own netlink
// socket, and every batch its own Conn, so neither unread replies nor half-queued messages of
// a failed batch can reach the next one.
func (r *nftRunner) session() (conn func() *nftables.Conn, done func(), err error) {
	fd, done, err := openNetNS(r.opts.NetNS)
	if err != nil {
		return nil, nil, err
	}
	return func() *nftables.Conn {
		c, _ := nftables.New(nftables.WithNetNSFd(fd)) // cannot fail without AsLasting
		return c
	}, done, nil
}

func (r *nftRunner) Apply(ctx context.Context, mappings []Mapping) (Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := buildPlan(mappings, r.opts.TunName)
	conn, done, err := r.session()
	if err != nil {
		for _, f := range families {
			p.failFamily(f, err)
		}
	} else {
		defer done()
		for _, f := range families {
			if err := ctx.Err(); err != nil {
				p.failFamily(f, err)
				continue
			}
			applyNFTFamily(conn, f, &p)
		}
	}
	return Status{Mode: ModeNFTables, Mappings: p.status}, errors.Join(p.errs...)
}

// ourTable returns family f's table of ours, and whether it exists.
func ourTable(c *nftables.Conn, f family) (*nftables.Table, bool, error) {
	tables, err := c.ListTablesOfFamily(nftFamily(f))
	if err != nil {
		return nil, false, err
	}
	for _, t := range tables {
		if t.Name == nftTable {
			return t, true, nil
		}
	}
	return &nftables.Table{Name: nftTable, Family: nftFamily(f)}, false, nil
}

func applyNFTFamily(conn func() *nftables.Conn, f family, p *plan) {
	fp := p.fams[f]
	t, exists, err := ourTable(conn(), f)
	if err != nil {
		p.failFamily(f, err)
		return
	}
	if fp.empty() {
		if exists {
			c := conn()
			c.DelTable(t)
			if err := c.Flush(); err != nil {
				p.errs = append(p.errs, fmt.Errorf("%s: delete table: %w", f, err))
			}
		}
		return
	}
	nat, snat, fwd, err := ensureChains(conn(), t, exists)
	if err != nil {
		p.failFamily(f, err)
		return
	}
	// The clamp serves every mapping of the family, so its failure fails them all.
	var clampErr error
	err = reconcileNFT(conn, fwd, fp.clampWants(), func(c *nftables.Conn, i int) error {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: clampExprs(fp.clamp[i]), UserData: comment(fp.clamp[i].tag)})
		return nil
	}, func(_ int, err error) { clampErr = errors.Join(clampErr, err) })
	if err = errors.Join(clampErr, err); err != nil {
		p.failFamily(f, fmt.Errorf("mss clamp: %w", err))
	}

	// Source NAT goes in before the DNAT it serves, so that no DNATed connection leaves without.
	var masqErr error
	err = reconcileNFT(conn, snat, fp.masq, func(c *nftables.Conn, _ int) error {
		c.AddRule(&nftables.Rule{Table: t, Chain: snat, Exprs: snatExprs(p.tun), UserData: comment(fp.masq[0].tag)})
		return nil
	}, func(_ int, err error) { masqErr = errors.Join(masqErr, err) })
	if err = errors.Join(masqErr, err); err != nil {
		p.failFamily(f, fmt.Errorf("source NAT: %w", err))
	}

	err = reconcileNFT(conn, nat, fp.dnatWants(), func(c *nftables.Conn, i int) error {
		o := fp.dnat[i]
		for j, d := range o.rules {
			exprs, set, elems := dnatExprs(t, d, uint32(j+1))
			if set != nil {
				if err := c.AddSet(set, elems); err != nil {
					return err
				}
			}
			c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: exprs, UserData: comment(o.tag)})
		}
		return nil
	}, func(i int, err error) { p.fail(fp.dnat[i].name, f, err) })
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s: %w", f, err))
	}
}

// ensureChains creates our table and chains where missing, so a second Apply adds nothing.
func ensureChains(c *nftables.Conn, t *nftables.Table, exists bool) (nat, snat, fwd *nftables.Chain, err error) {
	accept := nftables.ChainPolicyAccept
	nat = &nftables.Chain{Name: nftNAT, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept}
	snat = &nftables.Chain{Name: nftSNAT, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept}
	fwd = &nftables.Chain{Name: nftForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityMangle, Policy: &accept}
	have := map[string]bool{}
	if exists {
		chains, err := c.ListChainsOfTableFamily(t.Family)
		if err != nil {
			return nil, nil, nil, err
		}
		for _, ch := range chains {
			if ch.Table.Name == t.Name {
				have[ch.Name] = true
			}
		}
	} else {
		c.AddTable(t)
	}
	for _, ch := range []*nftables.Chain{nat, snat, fwd} {
		if !have[ch.Name] {
			c.AddChain(ch)
		}
	}
	return nat, snat, fwd, c.Flush()
}

// reconcileNFT makes chain ch hold exactly wants. Each owner to (re)install gets one batch that
// deletes its old rules and adds the new ones (queued by add), so the swap is atomic and a
// failure leaves the old rules in place; onErr hears of it, as it does of a failure to list the
// chain. The error returned is that of removing stale rules.
func reconcileNFT(conn func() *nftables.Conn, ch *nftables.Chain, wants []want, add func(c *nftables.Conn, i int) error, onErr func(i int, err error)) error {
	rules, err := conn().GetRules(ch.Table, ch)
	if err != nil {
		for i := range wants {
			onErr(i, fmt.Errorf("list chain %s: %w", ch.Name, err))
		}
		return nil
	}
	found := make([]found, len(rules))
	for i, rule := range rules {
		found[i].id = rule.Handle
		found[i].tag, _ = userdata.GetString(rule.UserData, userdata.TypeComment)
	}
	d := diffChain(found, wants)
	for _, i := range d.install {
		c := conn()
		err := add(c, i)
		for _, h := range d.replaced[i] {
			if err == nil {
				err = c.DelRule(&nftables.Rule{Table: ch.Table, Chain: ch, Handle: h})
			}
		}
		if err == nil {
			err = c.Flush()
		}
		if err != nil {
			onErr(i, err)
		}
	}
	if len(d.stale) == 0 {
		return nil
	}
	c := conn()
	for _, h := range d.stale {
		if err := c.DelRule(&nftables.Rule{Table: ch.Table, Chain: ch, Handle: h}); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove stale rules from %s: %w", ch.Name, err)
	}
	return nil
}

func comment(tag string) []byte { return userdata.AppendString(nil, userdata.TypeComment, tag) }

// dnatExprs builds "ip daddr FROM dnat to TO", or with several destinations
// "ip daddr FROM dnat to numgen random mod N map { 0 : TO0, ... }". The anonymous map is
// returned to be added in the same batch as the rule, under setID (unique within the batch);
// the kernel deletes it together with the rule.
func dnatExprs(t *nftables.Table, d dnat, setID uint32) ([]expr.Any, *nftables.Set, []nftables.SetElement) {
	offset, natFamily, addrType := uint32(16), uint32(unix.NFPROTO_IPV4), nftables.TypeIPAddr
	if !d.from.Is4() {
		offset, natFamily, addrType = 24, unix.NFPROTO_IPV6, nftables.TypeIP6Addr
	}
	exprs := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(d.from.BitLen() / 8)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: d.from.AsSlice()},
	}
	nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: natFamily, RegAddrMin: 1}
	if len(d.to) == 1 {
		return append(exprs, &expr.Immediate{Register: 1, Data: d.to[0].AsSlice()}, nat), nil, nil
	}
	set := &nftables.Set{Table: t, ID: setID, Name: "__map%d", Anonymous: true, Constant: true, IsMap: true,
		KeyType: nftables.TypeInteger, DataType: addrType}
	elems := make([]nftables.SetElement, len(d.to))
	for i, a := range d.to {
		elems[i] = nftables.SetElement{Key: binaryutil.BigEndian.PutUint32(uint32(i)), Val: a.AsSlice()}
	}
	exprs = append(exprs,
		&expr.Numgen{Register: 1, Modulus: uint32(len(d.to)), Type: unix.NFT_NG_RANDOM},
		// numgen yields a host-endian number; the library marks anonymous map keys big-endian,
		// so convert, or nft would list key 1 as 16777216 on little-endian machines.
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetID: set.ID, SetName: set.Name},
		nat,
	)
	return exprs, set, elems
}

// snatExprs builds `iifname TUN oifname != TUN ct status dnat masquerade`: a connection that
// came in through the tunnel and was DNATed leaves with the address of the interface it leaves
// by, so that the destination's replies come back to this namespace, which alone can undo the
// DNAT. Without it the destination answers the tailnet client's address through its own
// default route, which knows nothing of the tailnet. For forwarded packets the kernel gives
// the postrouting hook the input interface.
func snatExprs(tun string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(tun)},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(tun)},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Masq{},
	}
}

const ipsDstNAT = 1 << 5 // IPS_DST_NAT in the conntrack status bits

// clampExprs builds `[io]ifname TUN tcp flags & (syn|rst) == syn tcp option maxseg size set rt mtu`.
func clampExprs(cr clampRule) []expr.Any {
	key := expr.MetaKeyOIFNAME
	if cr.in {
		key = expr.MetaKeyIIFNAME
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(cr.ifName)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{tcpSYN | tcpRST}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{tcpSYN}},
		&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
		&expr.Exthdr{SourceRegister: 1, Type: tcpOptMaxSeg, Offset: 2, Len: 2, Op: expr.ExthdrOpTcpopt},
	}
}

const (
	tcpSYN       = 0x02
	tcpRST       = 0x04
	tcpOptMaxSeg = 2
)

// ifname pads an interface name to IFNAMSIZ, as the kernel compares it.
func ifname(s string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, s)
	return b
}

func (r *nftRunner) Cleanup(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	conn, done, err := r.session()
	if err != nil {
		return err
	}
	defer done()
	c := conn()
	for _, f := range families {
		if err := ctx.Err(); err != nil {
			return err
		}
		t, exists, err := ourTable(c, f)
		if err != nil {
			return err
		}
		if exists {
			c.DelTable(t)
		}
	}
	return c.Flush()
}
