package web_test

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// An https backend whose certificate a CA of the user's issued for its Service's name is
// verified against that CA and for that name: a request reaches it only when both hold, or
// when verification is explicitly off.
func TestHTTPSBackendVerifiedAgainstItsCA(t *testing.T) {
	backendCA, otherCA := proxytest.NewCA(t), proxytest.NewCA(t)
	cert, err := backendCA.Certificate(t.Context(), "app.shop.svc")
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("backend"))
	}))
	backend.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	backend.StartTLS()
	t.Cleanup(backend.Close)
	addr := strings.TrimPrefix(backend.URL, "https://")

	for _, tc := range []struct {
		name    string
		backend contract.Backend
		want    int
	}{
		{"its CA, its name", contract.Backend{URL: backend.URL, CABundle: backendCA.RootPEM(), ServerName: "app.shop.svc"}, http.StatusOK},
		// Balanced across endpoints (the ClusterIP, a port nothing listens on, unused), each
		// endpoint is still verified for the name.
		{"its CA, its name, endpoints", contract.Backend{URL: "https://127.0.0.1:1", Endpoints: []string{addr},
			CABundle: backendCA.RootPEM(), ServerName: "app.shop.svc"}, http.StatusOK},
		{"its CA, another name", contract.Backend{URL: backend.URL, CABundle: backendCA.RootPEM(), ServerName: "db.shop.svc"}, http.StatusBadGateway},
		{"its CA, the address", contract.Backend{URL: backend.URL, CABundle: backendCA.RootPEM()}, http.StatusBadGateway},
		{"another CA", contract.Backend{URL: backend.URL, CABundle: otherCA.RootPEM(), ServerName: "app.shop.svc"}, http.StatusBadGateway},
		{"the system's roots", contract.Backend{URL: backend.URL, ServerName: "app.shop.svc"}, http.StatusBadGateway},
		{"not verified", contract.Backend{URL: backend.URL, InsecureSkipVerify: true}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lb := startLoopback(t, contract.WebService{HTTP: contract.HTTPServe,
				Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: tc.backend}}}, nil)
			resp, err := http.Get("http://" + lb.http + "/")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// Two backends of one web service, with their own CAs, each verified against its own.
func TestHTTPSBackendsKeepTheirOwnCAs(t *testing.T) {
	var routes []contract.Route
	var paths []string
	for _, name := range []string{"a", "b"} {
		ca := proxytest.NewCA(t)
		cert, err := ca.Certificate(t.Context(), name+".shop.svc")
		if err != nil {
			t.Fatal(err)
		}
		backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(name)) }))
		backend.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
		backend.StartTLS()
		t.Cleanup(backend.Close)
		routes = append(routes, contract.Route{Path: "/" + name, PathType: contract.PathPrefix,
			Backend: contract.Backend{URL: backend.URL, CABundle: ca.RootPEM(), ServerName: name + ".shop.svc"}})
		paths = append(paths, "/"+name)
	}
	lb := startLoopback(t, contract.WebService{HTTP: contract.HTTPServe, Routes: routes}, nil)
	for _, p := range paths {
		resp, err := http.Get("http://" + lb.http + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: status %d, want 200", p, resp.StatusCode)
		}
	}
}
