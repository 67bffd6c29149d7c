package web

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"tailscale.com/client/tailscale/apitype"
	"tailscale.com/tailcfg"

	"github.com/tsingress/tsingress/internal/contract"
)

// The app capabilities header carries, of the capabilities the service accepts, those the
// policy grants the caller, whatever the client sent; without accepted capabilities, or from
// the internet, there is none.
func TestAppCapabilitiesHeader(t *testing.T) {
	const admin, mon, other = "example.com/cap/admin", "example.com/cap/mon", "example.com/cap/other"
	alice := &apitype.WhoIsResponse{
		Node:        &tailcfg.Node{},
		UserProfile: &tailcfg.UserProfile{LoginName: "alice@example.com"},
		CapMap: tailcfg.PeerCapMap{
			admin: {`{"level":"all"}`},
			other: {`{}`},
		},
	}
	bot := &apitype.WhoIsResponse{Node: &tailcfg.Node{Tags: []string{"tag:ci"}}, UserProfile: &tailcfg.UserProfile{},
		CapMap: tailcfg.PeerCapMap{mon: nil}}
	bob := &apitype.WhoIsResponse{Node: &tailcfg.Node{}, UserProfile: &tailcfg.UserProfile{LoginName: "bob@example.com"}}
	const forged = `{"example.com/cap/admin":[{"level":"all"}]}`

	for _, tc := range []struct {
		name     string
		accept   []string
		who      *apitype.WhoIsResponse // nil: not identified
		funnel   bool
		want     string
		wantSent bool
	}{
		{name: "granted, with values", accept: []string{admin, mon}, who: alice, want: `{"example.com/cap/admin":[{"level":"all"}]}`, wantSent: true},
		{name: "a tagged device granted one", accept: []string{admin, mon}, who: bot, want: `{"example.com/cap/mon":null}`, wantSent: true},
		{name: "granted none of those accepted", accept: []string{mon}, who: alice, want: `{}`, wantSent: true},
		{name: "granted nothing", accept: []string{admin}, who: bob, want: `{}`, wantSent: true},
		{name: "none accepted", who: alice},
		{name: "caller not identified", accept: []string{admin}},
		{name: "from the internet", accept: []string{admin}, who: alice, funnel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got http.Header
			backend := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = r.Header.Clone() }))
			defer backend.Close()
			whois := func(context.Context, string) (*apitype.WhoIsResponse, error) {
				if tc.who == nil {
					return nil, errors.New("not a tailnet peer")
				}
				return tc.who, nil
			}
			ws := contract.WebService{AcceptAppCaps: tc.accept, Routes: []contract.Route{
				{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: backend.URL}}}}
			h, err := newHandler(NewRouter(ws.Routes), ws.AcceptAppCaps, newTransports(), newIdentities(whois), slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodGet, "https://web.tailnet.test/", nil)
			req.RemoteAddr = "100.64.0.7:40000"
			req.Header.Set(HeaderAppCapabilities, forged)
			if tc.funnel {
				req = req.WithContext(context.WithValue(req.Context(), funnelKey{}, true))
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d", rec.Code)
			}
			values := got.Values(HeaderAppCapabilities)
			if sent := len(values) > 0; sent != tc.wantSent || (sent && (len(values) != 1 || values[0] != tc.want)) {
				t.Errorf("%s = %q, want %q (sent %v)", HeaderAppCapabilities, values, tc.want, tc.wantSent)
			}
		})
	}
}
