package web

import (
	"testing"
	"time"
)

// A refusing endpoint is skipped for 2s, twice as long each time it refuses again up to 30s,
// usable again after a success, and forgotten once long past its time.
func TestEndpointHealth(t *testing.T) {
	h := newEndpointHealth()
	now := time.Unix(1000, 0)
	a := "10.0.0.1:80"
	if !h.usable(a, now) {
		t.Fatal("an endpoint never seen is not usable")
	}
	var got []time.Duration
	for range 6 {
		got = append(got, h.refused(a, now))
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("backoffs %v, want %v", got, want)
		}
	}
	if h.usable(a, now.Add(29*time.Second)) || !h.usable(a, now.Add(30*time.Second)) {
		t.Error("the endpoint is not skipped for exactly its backoff")
	}
	h.succeeded(a)
	if !h.usable(a, now) || h.nDown.Load() != 0 {
		t.Error("a success does not clear the endpoint")
	}

	h.refused(a, now)
	h.refused("10.0.0.2:80", now.Add(time.Hour)) // the first one is long past its time
	if _, ok := h.down[a]; ok || h.nDown.Load() != 1 {
		t.Errorf("stale endpoints are kept: %v", h.down)
	}
}
