package proxy

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/backoff"
	"github.com/tsingress/tsingress/internal/proxy/l3"
)

// maxDNATBackoff bounds the wait between attempts at the DNAT rules; a family that stays
// unusable (IPv6 disabled) is tried, and logged, that often.
const maxDNATBackoff = 5 * time.Minute

// dnat is a kernel data path (a TUN device and DNAT rules) and the attempts at its mappings,
// which the L3 units share.
type dnat struct {
	c       *core
	fwd     *l3.Forwarder
	applied []l3.Mapping // as last given to the forwarder; nil before
	err     error        // the last attempt's failure, tried again after backoff
	retry   backoff.Backoff
}

func newDNAT(ctx context.Context, c *core) (*dnat, error) {
	fwd, err := l3.New(ctx, l3.Options{
		NetNS:        c.opts.NetNS,
		FirewallMode: c.cfg.cfg.Firewall.Mode,
		Logf: func(format string, args ...any) {
			c.log.Info(fmt.Sprintf(format, args...), "component", "l3")
		},
	})
	if err != nil {
		return nil, err
	}
	return &dnat{c: c, fwd: fwd, retry: backoff.Backoff{Min: time.Second, Max: maxDNATBackoff}}, nil
}

// watch wakes the loop whenever the rules changed on their own: a DNS answer moved.
func (d *dnat) watch(ctx context.Context) {
	go func() {
		for {
			select {
			case <-d.fwd.Changed():
				d.c.wake(ctx)
			case <-ctx.Done():
				return
			}
		}
	}()
}

// firewallRestart says why cfg needs a restart: the backend is chosen once, when the forwarder
// starts.
func firewallRestart(old, cfg *contract.ProxyConfig) string {
	if o, n := firewallMode(old), firewallMode(cfg); o != n {
		return fmt.Sprintf("firewall mode changed from %s to %s", o, n)
	}
	return ""
}

func firewallMode(c *contract.ProxyConfig) contract.FirewallMode {
	if c.Firewall.Mode == "" {
		return contract.FirewallAuto
	}
	return c.Firewall.Mode
}

// needed reports whether mappings are to be given to the forwarder: they changed, or a failed
// attempt is due again.
func (d *dnat) needed(mappings []l3.Mapping) bool {
	return !reflect.DeepEqual(d.applied, mappings) || (d.err != nil && d.retry.Due(time.Now()))
}

// install gives the forwarder mappings; linkErr is the failure of giving the TUN its addresses
// first. A mapping that fails is installed as far as it goes and carries its error in the
// forwarder's status; the attempt is made again after backoff.
func (d *dnat) install(ctx context.Context, mappings []l3.Mapping, linkErr error) error {
	err := errors.Join(linkErr, d.fwd.SetMappings(ctx, mappings))
	d.applied, d.err = mappings, err
	if err != nil {
		wait := d.retry.Fail(time.Now())
		time.AfterFunc(wait, func() { d.c.wake(ctx) })
		d.c.log.Error("installing the DNAT rules failed; trying again", "attempt", d.retry.Attempts(), "retryIn", wait, "err", err)
		return err
	}
	if n := d.retry.Reset(); n > 0 {
		d.c.log.Info("the DNAT rules are in place after failed attempts", "attempts", n)
	}
	return nil
}

// close removes the TUN device and every rule; the node must have closed, since it uses the TUN
// until it does.
func (d *dnat) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), d.c.opts.DrainTimeout)
	defer cancel()
	if err := d.fwd.Close(ctx); err != nil {
		d.c.log.Error("removing the TUN device and DNAT rules failed", "err", err)
		return err
	}
	d.c.log.Info("removed the TUN device and DNAT rules")
	return nil
}
