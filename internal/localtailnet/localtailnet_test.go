package localtailnet_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/tsingress/tsingress/internal/localtailnet"
)

// Two nodes join with keys minted through the operator's API backend and talk over the
// tailnet, by address and by MagicDNS name; the API lists them as the nodes see themselves.
func TestJoinAndTalk(t *testing.T) {
	t.Parallel()
	lt := startTailnet(t, localtailnet.Options{})
	c := apiClient(t, lt, nil)

	a := joinNode(t, lt, "alpha", mintKey(t, c, "alpha"))
	b := joinNode(t, lt, "beta", mintKey(t, c, "beta"))

	ln, err := a.Listen("tcp", ":80")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, ln, "alpha")
	a4, _ := a.TailscaleIPs()
	if got := roundTrip(t, b, netip.AddrPortFrom(a4, 80).String(), "by ip"); got != "alpha: by ip" {
		t.Errorf("by IP: got %q", got)
	}
	if got := roundTrip(t, b, "alpha.tailnet.test:80", "by name"); got != "alpha: by name" {
		t.Errorf("by MagicDNS name: got %q", got)
	}

	lc, err := a.LocalClient()
	if err != nil {
		t.Fatal(err)
	}
	st, err := lc.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Self.DNSName != "alpha.tailnet.test." {
		t.Errorf("self DNS name = %q", st.Self.DNSName)
	}
	if st.Self.Tags == nil || !slices.Equal(st.Self.Tags.AsSlice(), []string{"tag:k8s"}) {
		t.Errorf("self tags = %v, want [tag:k8s] from the key", st.Self.Tags)
	}

	devices, err := c.Devices(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != 2 {
		t.Fatalf("API lists %d devices, want 2: %+v", len(devices), devices)
	}
	d := devices[0]
	if d.ID != string(st.Self.ID) || d.Hostname != "alpha" || d.Name != "alpha.tailnet.test" ||
		!slices.Equal(d.Tags, []string{"tag:k8s"}) || !slices.Contains(d.Addresses, a4) {
		t.Errorf("API device %+v does not match node %s %s %v", d, st.Self.ID, st.Self.DNSName, a4)
	}
	info, err := c.TailnetInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Domain != "tailnet.test" || !info.MagicDNS || info.HTTPSEnabled || info.CertsAvailable() {
		t.Errorf("TailnetInfo = %+v, want domain tailnet.test, MagicDNS, no HTTPS", info)
	}
	if cd := a.CertDomains(); len(cd) != 0 {
		t.Errorf("cert domains without HTTPS: %v", cd)
	}
}
