package web_test

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// A web service of ports serves each port with its own protocol and routes, a Gateway's
// wildcard hosts cover labels at any depth, and a port the service drops is closed.
func TestPorts(t *testing.T) {
	ca := proxytest.NewCA(t)
	tailnet, err := ca.Certificate(t.Context(), "web.tail.test")
	if err != nil {
		t.Fatal(err)
	}
	exact, wild, secure, other := pods(t, "exact", 1)[0], pods(t, "wild", 1)[0], pods(t, "secure", 1)[0], pods(t, "other", 1)[0]
	to := func(p *proxytest.EchoPod) contract.Backend { return contract.Backend{URL: "http://" + p.Addr} }
	ws := contract.WebService{Ports: []contract.WebPort{
		{Port: 80, Routes: []contract.Route{
			{Host: "bar.com", Path: "/", PathType: contract.PathPrefix, Backend: to(exact)},
			{Host: "*.bar.com", Path: "/", PathType: contract.PathPrefix, Backend: to(wild)},
		}},
		{Port: 8443, TLS: true, Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: to(secure)}}},
	}}
	if err := ws.Validate(); err != nil {
		t.Fatal(err)
	}
	lb := startLoopback(t, ws, nil)
	lb.srv.SetName("web.tail.test")
	lb.srv.SetCertificate(tailnet)
	httpsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "web.tail.test"}}}

	for _, tc := range []struct {
		c         *http.Client
		url, host string
		wantCode  int
		wantPod   string
	}{
		{http.DefaultClient, "http://" + lb.port(":80"), "bar.com", 200, "exact-0"},
		{http.DefaultClient, "http://" + lb.port(":80"), "a.bar.com", 200, "wild-0"},
		{http.DefaultClient, "http://" + lb.port(":80"), "a.b.bar.com", 200, "wild-0"}, // a Gateway's wildcard: any depth
		{http.DefaultClient, "http://" + lb.port(":80"), "example.org", 404, ""},
		{httpsClient, "https://" + lb.port(":8443"), "web.tail.test", 200, "secure-0"},
	} {
		r, code, err := getAs(tc.c, tc.url+"/p", tc.host)
		if err != nil || code != tc.wantCode || r.Pod != tc.wantPod {
			t.Errorf("%s Host %s: %d from %q (%v), want %d from %q", tc.url, tc.host, code, r.Pod, err, tc.wantCode, tc.wantPod)
		}
	}
	// HTTP/2 without TLS, by prior knowledge, as gRPC clients of a plain port speak it.
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	h2cClient := &http.Client{Transport: &http.Transport{Protocols: &h2c}}
	resp, err := h2cClient.Get("http://" + lb.port(":80") + "/")
	if err != nil {
		t.Fatalf("h2c to port 80: %v", err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Errorf("h2c to port 80 answered in %s", resp.Proto)
	}
	if lb.port(":443") != "" {
		t.Error("port 443 opened, though no port of the service is 443")
	}

	// Port 80 goes, 8080 comes: 80 is closed, 8080 serves.
	old80 := lb.port(":80")
	ws.Ports[0].Port = 8080
	ws.Ports[0].Routes = []contract.Route{{Path: "/", PathType: contract.PathPrefix, Backend: to(other)}}
	if err := lb.srv.Apply(ws); err != nil {
		t.Fatal(err)
	}
	if r, code, err := send(t, http.DefaultClient, "GET", "http://"+lb.port(":8080")+"/", ""); err != nil || code != 200 || r.Pod != "other-0" {
		t.Errorf("port 8080: %d from %q (%v), want 200 from other-0", code, r.Pod, err)
	}
	if _, _, err := send(t, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, "GET", "http://"+old80+"/", ""); err == nil {
		t.Error("port 80 still takes connections after the service dropped it")
	}
}

// getAs sends a GET for host, and returns the echo reply (zero on a non-200 answer) and the status.
func getAs(c *http.Client, url, host string) (proxytest.EchoReply, int, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return proxytest.EchoReply{}, 0, err
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		return proxytest.EchoReply{}, 0, err
	}
	defer resp.Body.Close()
	var r proxytest.EchoReply
	if resp.StatusCode == http.StatusOK {
		err = json.NewDecoder(resp.Body).Decode(&r)
	}
	return r, resp.StatusCode, err
}
