package proxies

import (
	"strings"
	"testing"
	"time"

	"github.com/tsingress/tsingress/internal/tailnet"
)

// What the tailnet API shows of a device decides whether it can have logged in with a key the
// operator minted: created after the key (within the clocks' skew), the key's tags, the
// proxy's hostname.
func TestMintRecordMismatch(t *testing.T) {
	minted := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := mintRecord{KeyID: "k1", Created: minted, Tags: []string{"tag:a", "tag:b"}, Hostname: "web"}
	own := tailnet.Device{ID: "n1", Created: minted.Add(time.Minute), Tags: []string{"tag:b", "tag:a"}, Hostname: "web"}
	for _, tc := range []struct {
		name   string
		change func(*tailnet.Device)
		want   string // in the mismatch; "" for none
	}{
		{"the device the key logged in", func(*tailnet.Device) {}, ""},
		{"created within the clocks' skew before the key", func(d *tailnet.Device) { d.Created = minted.Add(-30 * time.Second) }, ""},
		{"created before the key", func(d *tailnet.Device) { d.Created = minted.Add(-time.Hour) }, "before key k1"},
		{"other tags", func(d *tailnet.Device) { d.Tags = []string{"tag:a"} }, "tags"},
		{"more tags", func(d *tailnet.Device) { d.Tags = []string{"tag:a", "tag:b", "tag:c"} }, "tags"},
		{"untagged", func(d *tailnet.Device) { d.Tags = nil }, "tags"},
		{"another hostname", func(d *tailnet.Device) { d.Hostname = "db" }, "hostname"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := own
			tc.change(&d)
			got := rec.mismatch(d)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("mismatch = %q, want one about %q", got, tc.want)
			}
		})
	}
}
