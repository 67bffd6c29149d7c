package proxy

import (
	"log/slog"
	"testing"

	"tailscale.com/tsnet"
)

// A replica told to serve L7 only sets up no kernel data path, and says so on every mapping,
// rather than trying one and logging its failure as an error.
func TestReplicaL7OnlyHasNoKernelPath(t *testing.T) {
	r := &replica{core: &core{opts: Options{GroupL7Only: true}, log: slog.New(slog.DiscardHandler)}}
	node := &tsnet.Server{}
	if err := r.prepare(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	if node.Tun != nil || r.l3 != nil {
		t.Errorf("a TUN device or DNAT path was set up: tun %v, l3 %v", node.Tun, r.l3)
	}
	if r.noL3 != NoL3Unprivileged {
		t.Errorf("noL3 = %q, want %q", r.noL3, NoL3Unprivileged)
	}
}
