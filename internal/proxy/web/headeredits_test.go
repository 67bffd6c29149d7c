package web

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"tailscale.com/client/tailscale/apitype"
	"tailscale.com/tailcfg"

	"github.com/tsingress/tsingress/internal/contract"
)

// A route's request edits reach the backend and its response edits the client; an edit naming
// an identity header cannot forge it, since the identity is set after the edits.
func TestHeaderEdits(t *testing.T) {
	var got http.Header
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Header().Set("X-Backend", "secret-version")
		w.Header().Set("X-Replace", "old")
		w.Header().Add("X-Keep", "backend")
		_, _ = w.Write([]byte("ok")) // no WriteHeader: the edits apply on the implicit 200
	}))
	defer backend.Close()
	alice := &apitype.WhoIsResponse{Node: &tailcfg.Node{}, UserProfile: &tailcfg.UserProfile{LoginName: "alice@example.com"}}
	whois := func(context.Context, string) (*apitype.WhoIsResponse, error) { return alice, nil }
	ws := contract.WebService{Routes: []contract.Route{
		{Path: "/", PathType: contract.PathPrefix, Backend: contract.Backend{URL: backend.URL}},
		{Path: "/edited", PathType: contract.PathPrefix, Backend: contract.Backend{URL: backend.URL},
			RequestHeaders: &contract.HeaderEdits{
				Set:    []contract.NameValue{{Name: "X-Set", Value: "set"}, {Name: HeaderUserLogin, Value: "mallory@example.com"}},
				Add:    []contract.NameValue{{Name: "X-Add", Value: "added"}},
				Remove: []string{"X-Drop"},
			},
			ResponseHeaders: &contract.HeaderEdits{
				Set:    []contract.NameValue{{Name: "X-Replace", Value: "new"}},
				Add:    []contract.NameValue{{Name: "X-Keep", Value: "proxy"}},
				Remove: []string{"X-Backend"},
			}},
	}}
	h, err := newHandler(NewRouter(ws.Routes), ws.AcceptAppCaps, newTransports(), newIdentities(whois), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	serve := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, "https://web.tailnet.test"+path, nil)
		req.RemoteAddr = "100.64.0.7:40000"
		req.Header.Set("X-Set", "client")
		req.Header.Set("X-Add", "client")
		req.Header.Set("X-Drop", "client")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: status %d", path, rec.Code)
		}
		return rec
	}

	rec := serve("/edited/x")
	for name, want := range map[string][]string{
		"X-Set": {"set"}, "X-Add": {"client", "added"}, "X-Drop": nil, HeaderUserLogin: {"alice@example.com"},
	} {
		if v := got.Values(name); !slices.Equal(v, want) {
			t.Errorf("backend got %s %q, want %q", name, v, want)
		}
	}
	for name, want := range map[string][]string{"X-Replace": {"new"}, "X-Keep": {"backend", "proxy"}, "X-Backend": nil} {
		if v := rec.Header().Values(name); !slices.Equal(v, want) {
			t.Errorf("client got %s %q, want %q", name, v, want)
		}
	}

	// Another route of the same backend is not edited.
	rec = serve("/other")
	if v := got.Values("X-Drop"); !slices.Equal(v, []string{"client"}) {
		t.Errorf("unedited route: backend got X-Drop %q", v)
	}
	if v := rec.Header().Values("X-Backend"); !slices.Equal(v, []string{"secret-version"}) {
		t.Errorf("unedited route: client got X-Backend %q", v)
	}
}
