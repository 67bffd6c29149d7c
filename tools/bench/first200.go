package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"tailscale.com/ipn/store/mem"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/proxy/web"
)

// firstResult is one new proxy node's way to its first HTTPS 200, from the moment it starts.
type firstResult struct {
	up, cert, peerSeen, first200 time.Duration
	attempts                     []string // each attempt: when it started, what became of it, how long it took
}

// measureFirst200 starts a new node serving the backend through the proxy's web server, as a
// standalone Ingress proxy does, while the client, already on the tailnet, tries every 250 ms
// (each try bounded to 2 s) to get a 200; it records when the client's netmap shows the node,
// and when the first 200 comes.
func (d *dataPath) measureFirst200(ctx context.Context, i int) (firstResult, error) {
	var res firstResult
	client := d.nodes[0]
	clc, _ := client.LocalClient()
	dir, err := os.MkdirTemp("", "bench-new")
	if err != nil {
		return res, err
	}
	defer logErr("removing the node's directory", func() error { return os.RemoveAll(dir) })
	name := fmt.Sprintf("fresh-%d", i)
	start := time.Now()
	n := &tsnet.Server{Dir: dir, Hostname: name, ControlURL: d.lt.ControlURL, Ephemeral: true, Store: new(mem.Store), Port: firstPort,
		AuthKey: d.lt.MintUserKey("ops@example.com", "Ops").Reveal(), Logf: func(string, ...any) {}}
	defer logErr("closing the node", n.Close)
	fqdn := name + "." + d.lt.Domain

	done := make(chan struct{})
	attempts := make(chan string, 1000)
	go func() { // the client, from the moment the node starts
		defer close(done)
		tr := &http.Transport{DialContext: client.Dial, TLSClientConfig: d.roots.Clone(), DisableKeepAlives: true}
		c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			at := time.Since(start)
			if res.peerSeen == 0 {
				if st, err := clc.Status(ctx); err == nil {
					for _, p := range st.Peer {
						if strings.TrimSuffix(p.DNSName, ".") == fqdn {
							res.peerSeen = time.Since(start)
						}
					}
				}
			}
			resp, err := c.Get("https://" + fqdn + "/small")
			outcome := ""
			switch {
			case err != nil:
				outcome = shortErr(err)
			default:
				resp.Body.Close()
				outcome = fmt.Sprint(resp.StatusCode)
			}
			attempts <- fmt.Sprintf("+%.1fs %s (%.1fs)", at.Seconds(), outcome, (time.Since(start) - at).Seconds())
			if err == nil && resp.StatusCode == 200 {
				res.first200 = time.Since(start)
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()

	if _, err := n.Up(ctx); err != nil {
		return res, err
	}
	res.up = time.Since(start)
	cert, err := nodeCert(ctx, n, fqdn)
	if err != nil {
		return res, err
	}
	res.cert = time.Since(start)
	lc, _ := n.LocalClient()
	srv := web.NewServer(web.Config{Listen: n.Listen, WhoIs: lc.WhoIs, Logger: slog.New(slog.DiscardHandler)})
	srv.SetName(fqdn)
	srv.SetCertificate(cert)
	if err := srv.Apply(contract.WebService{Routes: []contract.Route{{Path: "/", PathType: contract.PathPrefix,
		Backend: contract.Backend{URL: d.backendURL}}}}); err != nil {
		return res, err
	}
	defer logErr("shutting down the web server", func() error { return srv.Shutdown(context.Background()) })
	<-done
	close(attempts)
	for a := range attempts {
		res.attempts = append(res.attempts, a)
	}
	if res.first200 == 0 {
		return res, fmt.Errorf("no 200 within 30 s: %s", strings.Join(res.attempts, "; "))
	}
	return res, nil
}

// logErr logs what f, a cleanup, returns.
func logErr(what string, f func() error) {
	if err := f(); err != nil {
		log.Printf("%s: %v", what, err)
	}
}

func shortErr(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "Client.Timeout"), strings.Contains(s, "deadline exceeded"):
		return "timeout"
	case strings.Contains(s, "no such host"):
		return "no such host"
	case strings.Contains(s, "connection refused"):
		return "refused"
	}
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

func medianDur(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// firstPort is the WireGuard port of the new nodes; 0 picks one at random. Proxies listen on a
// fixed one (--tailnet-port), which a new proxy then shares with the one it replaces.
var firstPort uint16
