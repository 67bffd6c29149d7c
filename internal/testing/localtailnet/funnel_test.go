package localtailnet_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"tailscale.com/ipn"
	"tailscale.com/tailcfg"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/testing/localtailnet"
	"github.com/tsingress/tsingress/internal/testing/poll"
)

// A device serves a page over Funnel as tsnet's ListenFunnel sets it up: refused while the
// policy does not grant the funnel attribute; once it does, a client outside the tailnet finds
// the name in the public DNS, reaches the relay, and gets the page with a certificate from the
// CA, the connection arriving at the device as a Funnel connection from the client's address;
// when the device closes the listener, or the policy takes the attribute away, the name is gone
// from the public DNS and the relay has nowhere to send it.
func TestFunnel(t *testing.T) {
	lt := startTailnet(t, localtailnet.Options{ACME: true, Funnel: true})
	if err := lt.ACME.UseInProcess(t.Setenv); err != nil {
		t.Fatal(err)
	}
	api := apiClient(t, lt, nil)
	web := joinNode(t, lt, "web", mintKey(t, api, "web"))
	// A device without the attribute sees no relay among its peers; one with it does.
	other := joinNode(t, lt, "other", mintKey(t, api, "other"))
	const name = "web.tailnet.test"

	if _, err := web.ListenFunnel("tcp", ":443"); err == nil || !strings.Contains(err.Error(), `"funnel" node attribute not set`) {
		t.Fatalf("ListenFunnel without the policy's grant: %v, want the node attribute error", err)
	}
	if _, err := lookupPublic(lt, name); err == nil {
		t.Fatalf("%s is in the public DNS before anything is served over Funnel", name)
	}

	lt.SetNodeAttrs([]localtailnet.NodeAttr{{Target: []string{"tag:web"}, Attr: []string{"funnel"}}}) // no device has the tag
	lc, err := web.LocalClient()
	if err != nil {
		t.Fatal(err)
	}
	selfCaps := func() tailcfg.NodeCapMap {
		st, err := lc.StatusWithoutPeers(t.Context())
		if err != nil || st.Self == nil {
			return nil
		}
		return st.Self.CapMap
	}
	lt.SetNodeAttrs([]localtailnet.NodeAttr{{Target: []string{"tag:k8s"}, Attr: []string{"funnel"}}})
	poll.True(t, 10*time.Second, "the funnel attribute", func() bool { return selfCaps().Contains(tailcfg.NodeAttrFunnel) })

	ln, err := web.ListenFunnel("tcp", ":443", tsnet.FunnelOnly())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var srcs []string
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.URL.Path) }),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if fc, ok := c.(*tls.Conn).NetConn().(*ipn.FunnelConn); ok {
				mu.Lock()
				srcs = append(srcs, fc.Src.String()+" "+string(fc.Target))
				mu.Unlock()
			}
			return ctx
		},
	}
	go func() { _ = srv.Serve(ln) }() // returns once ln or srv closes
	t.Cleanup(func() { srv.Close() })

	client := publicClient(lt)
	body, err := retryGet(client, "https://"+name+"/page", 30*time.Second)
	if err != nil {
		t.Fatalf("GET over Funnel: %v", err)
	}
	if body != "hello /page" {
		t.Errorf("body %q", body)
	}
	mu.Lock()
	if len(srcs) == 0 || !strings.HasPrefix(srcs[0], "127.0.0.1:") || !strings.HasSuffix(srcs[0], " "+name+":443") {
		t.Errorf("the device saw Funnel connections %q, want from the client's address to %s:443", srcs, name)
	}
	mu.Unlock()
	if ips, err := lookupPublic(lt, name); err != nil || len(ips) != 1 {
		t.Errorf("public DNS for %s: %v, %v", name, ips, err)
	}
	if _, err := lookupPublic(lt, "other.tailnet.test"); err == nil {
		t.Error("a device that serves nothing over Funnel is in the public DNS")
	}
	// The tailnet path to port 443 is not the Funnel listener's (FunnelOnly).
	dctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if c, err := other.Dial(dctx, "tcp", name+":443"); err == nil {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("a tailnet connection reached the Funnel-only listener")
		}
		c.Close()
	}

	// The policy takes the attribute away: the device still allows Funnel, the relay does not
	// send it anything.
	lt.SetNodeAttrs(nil)
	poll.True(t, 10*time.Second, "the funnel attribute gone", func() bool { return !selfCaps().Contains(tailcfg.NodeAttrFunnel) })
	if resp, err := client.Get("https://" + name + "/"); err == nil {
		resp.Body.Close()
		t.Error("served over Funnel after the policy took the attribute away")
	}
	lt.SetNodeAttrs([]localtailnet.NodeAttr{{Target: []string{"*"}, Attr: []string{"funnel"}}})
	if _, err := retryGet(client, "https://"+name+"/again", 30*time.Second); err != nil {
		t.Fatalf("GET over Funnel with the attribute back: %v", err)
	}

	// Funnel off on the device: the name leaves the public DNS.
	ln.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := lookupPublic(lt, name)
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still in the public DNS after Funnel went off", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if resp, err := client.Get("https://" + name + "/"); err == nil {
		resp.Body.Close()
		t.Error("served over Funnel after the listener closed")
	}
}

// A relay connection for a name no device serves over Funnel, or without TLS, is closed.
func TestFunnelRelayRefuses(t *testing.T) {
	lt := startTailnet(t, localtailnet.Options{HTTPS: true, Funnel: true})
	for _, hello := range []func(net.Conn) error{
		func(c net.Conn) error {
			return tls.Client(c, &tls.Config{ServerName: "nobody.tailnet.test"}).Handshake()
		},
		func(c net.Conn) error { _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); return err },
	} {
		c, err := net.Dial("tcp", lt.FunnelAddr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(15 * time.Second))
		err = hello(c)
		if err == nil {
			_, err = c.Read(make([]byte, 1))
		}
		if err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			t.Errorf("the relay kept the connection: %v", err)
		}
		c.Close()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func lookupPublic(lt *localtailnet.LocalTailnet, name string) ([]string, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, lt.DNSAddr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return r.LookupHost(ctx, name)
}

// publicClient is a client on the internet: no tailnet, the CA's roots.
func publicClient(lt *localtailnet.LocalTailnet) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: lt.PublicDialer(), TLSClientConfig: &tls.Config{RootCAs: lt.ACME.Roots()}, DisableKeepAlives: true,
	}}
}

func retryGet(c *http.Client, url string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		body, err := func() (string, error) {
			res, err := c.Get(url)
			if err != nil {
				return "", err
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			if res.StatusCode != http.StatusOK {
				return "", fmt.Errorf("%s: %s", res.Status, b)
			}
			return string(b), err
		}()
		if err == nil || time.Now().After(deadline) {
			return body, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
