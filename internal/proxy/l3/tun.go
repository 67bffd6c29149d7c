package l3

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/tailscale/wireguard-go/tun"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"tailscale.com/net/tsaddr"

	"github.com/tsingress/tsingress/internal/proxy/netnamespace"
)

// device is the kernel TUN as tsnet sees it. wireguard-go asks a TUN for its MTU through a
// socket opened on the calling thread, which names the wrong namespace when the TUN lives in
// another one; MTU asks the TUN's own namespace over netlink instead. Everything else is the
// native device, whose file descriptor works from any thread.
type device struct {
	*tun.NativeTun
	nl    *netlink.Handle
	name  string
	index int
}

func (d *device) MTU() (int, error) {
	l, err := d.nl.LinkByIndex(d.index)
	if err != nil {
		return 0, err
	}
	return l.Attrs().MTU, nil
}

// createTUN creates the TUN interface name in the namespace at path and brings it up.
func createTUN(path, name string, mtu int, nl *netlink.Handle) (*device, error) {
	var dev tun.Device
	err := netnamespace.Run(path, func() (err error) {
		dev, err = tun.CreateTUN(name, mtu)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create TUN device %s: %w", name, err)
	}
	d := &device{NativeTun: dev.(*tun.NativeTun), nl: nl, name: name}
	link, err := nl.LinkByName(name)
	if err == nil {
		d.index = link.Attrs().Index
		err = nl.LinkSetUp(link)
	}
	if err != nil {
		_ = dev.Close()
		return nil, fmt.Errorf("bring up TUN device %s: %w", name, err)
	}
	return d, nil
}

// tailnetRanges are routed into the TUN, per family, so that replies to tailnet clients go
// back through the tunnel.
var tailnetRanges = [2]netip.Prefix{tsaddr.CGNATRange(), tsaddr.TailscaleULARange()}

func familyIndex(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}

// syncLink gives the TUN exactly the host addresses ips (link-local ones the kernel made
// aside) and routes the tailnet range of each family to it, addresses or not: traffic for the
// tailnet, ICMP errors to tailnet clients included, goes into the tunnel and never to the Pod's
// default gateway. A family marked in skip gets no address and no route (its addresses and
// route go, where the kernel still has them). It returns each family's failure; one family
// failing does not stop the other.
func (d *device) syncLink(ips []netip.Addr, skip [2]bool) (errs [2]error) {
	link, err := d.nl.LinkByIndex(d.index)
	if err != nil {
		return [2]error{err, err}
	}
	have, err := d.nl.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		err = fmt.Errorf("list addresses: %w", err)
		return [2]error{err, err}
	}
	add := func(i int, err error) { errs[i] = errors.Join(errs[i], err) }
	want := map[netip.Prefix]bool{}
	for _, ip := range ips {
		ip = ip.Unmap()
		if !skip[familyIndex(ip)] {
			want[netip.PrefixFrom(ip, ip.BitLen())] = true
		}
	}
	for _, a := range have {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip.Unmap(), ones)
		switch {
		case ip.IsLinkLocalUnicast():
		case want[p]:
			delete(want, p)
		default:
			if err := d.nl.AddrDel(link, &a); err != nil {
				add(familyIndex(p.Addr()), fmt.Errorf("remove address %s: %w", p, err))
			}
		}
	}
	for p := range want {
		a := &netlink.Addr{IPNet: prefixNet(p)}
		if p.Addr().Is6() {
			// A tunnel has no neighbours to detect duplicates with; DAD would only delay use.
			a.Flags = unix.IFA_F_NODAD
		}
		if err := d.nl.AddrAdd(link, a); err != nil {
			add(familyIndex(p.Addr()), fmt.Errorf("add address %s: %w", p, err))
		}
	}
	for i, r := range tailnetRanges {
		route := &netlink.Route{LinkIndex: d.index, Dst: prefixNet(r)}
		if r.Addr().Is4() {
			route.Scope = netlink.SCOPE_LINK // as ip route picks for a route without gateway
		}
		if skip[i] {
			d.nl.RouteDel(route) //nolint:errcheck // none there, or none possible in a disabled family
			continue
		}
		if err := d.nl.RouteReplace(route); err != nil {
			add(i, fmt.Errorf("route %s: %w", r, err))
		}
	}
	return errs
}

// remove closes the TUN, which makes the kernel delete the interface once the last reference
// to the file goes (a pending read holds one briefly), and waits for that. Close's own error is
// not the measure: wireguard-go's Close races with its link listener over a wake-up pipe and
// may report EPIPE while closing the device all the same.
func (d *device) remove() error {
	closeErr := d.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := d.nl.LinkByIndex(d.index)
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return nil
		}
		if time.Now().After(deadline) {
			if closeErr != nil {
				return fmt.Errorf("TUN interface %s still exists after closing it (%w)", d.name, closeErr)
			}
			return fmt.Errorf("TUN interface %s still exists after closing it", d.name)
		}
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
