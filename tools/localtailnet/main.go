// Command localtailnet runs a tailnet on this machine (control server, DERP relay, STUN,
// MagicDNS, the Tailscale API subset the operator uses and, unless -acme=false, an ACME CA
// that issues the nodes' certificates) until interrupted.
//
//	localtailnet [-addr 127.0.0.1:0] [-domain tailnet.test] [-dir DIR] [-tags tag:k8s,tag:k8s-operator] [-acme]
//	             [-funnel [-funnel-addr IP:PORT] [-funnel-tags tag:k8s]] [-admin-addr 127.0.0.1:0] [-v]
//
// It prints the control URL (for `tailscale up --login-server` or tsnet's ControlURL), the API
// base URL and the paths of the files holding the OAuth client ID and secret, the layout the
// operator's -client-id-file and -client-secret-file expect. With the CA it also prints its
// directory URL, the file with the roots that verify the certificates it issues, and the
// environment a tailscaled or proxy process needs to get certificates from it. With -funnel it
// also plays Tailscale Funnel's relays (a public listener that hands TLS connections to the
// devices serving their names over Funnel) and prints the listener's address; -funnel-tags
// grants the tags the policy's "funnel" node attribute.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"tailscale.com/net/netns"

	"github.com/tsingress/tsingress/internal/testing/localtailnet"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		log.Fatal(err)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("localtailnet", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "Address of the control server and API.")
	domain := fs.String("domain", "tailnet.test", "MagicDNS domain of the tailnet.")
	dir := fs.String("dir", "", "Directory for the OAuth client files; a temporary one, removed on exit, by default.")
	tags := fs.String("tags", "tag:k8s,tag:k8s-operator", "Comma-separated tags the OAuth client may mint keys for.")
	withACME := fs.Bool("acme", true, "Run an ACME CA (Pebble) that issues the nodes' certificates through DNS-01; implies HTTPS.")
	funnel := fs.Bool("funnel", false, "Play Tailscale Funnel's relays: a public listener for https://<name>/ of the names devices serve over Funnel; implies HTTPS.")
	funnelAddr := fs.String("funnel-addr", "", "Address of the Funnel listener (standing for port 443); a port of its own on -addr's IP by default.")
	funnelTags := fs.String("funnel-tags", "", "Comma-separated tags the policy grants the \"funnel\" node attribute (nodeAttrs).")
	verbose := fs.Bool("v", false, "Log control server, API and CA activity to stderr.")
	envFile := fs.String("env-file", "", "Once up, write the tailnet's settings to this file (mode 0600) as shell variables, for scripts: "+
		"TS_CONTROL_URL, TS_API_BASE_URL, TS_API_CLIENT_ID, TS_API_CLIENT_SECRET and, with the CA, TS_DEBUG_ACME_DIRECTORY_URL, "+
		"ACME_ROOTS_FILE (roots of the certificates it issues) and ACME_API_ROOT_FILE (root of its directory's HTTPS certificate), "+
		"with -funnel FUNNEL_ADDR (the Funnel listener) and PUBLIC_DNS_ADDR (the DNS server with the names served over Funnel), "+
		"and with -admin-addr LOCALTAILNET_ADMIN_URL.")
	adminAddr := fs.String("admin-addr", "", "Serve, at this address, what tests do to the tailnet besides its API: "+
		"POST /control/down and /control/up take the control server and API down and back (DERP and the CA stay up); "+
		"GET /acme/orders counts the CA's orders. Off by default; no authentication, so loopback only.")
	if err := fs.Parse(args); err != nil {
		return err
	}

	opts := localtailnet.Options{Addr: *addr, Domain: *domain, ACME: *withACME, Funnel: *funnel, FunnelAddr: *funnelAddr}
	if tags := splitList(*funnelTags); len(tags) > 0 {
		if !*funnel {
			return errors.New("-funnel-tags needs -funnel")
		}
		opts.NodeAttrs = []localtailnet.NodeAttr{{Target: tags, Attr: []string{"funnel"}}}
	}
	opts.AllowedTags = splitList(*tags)
	if len(opts.AllowedTags) == 0 {
		return errors.New("-tags must name at least one tag")
	}
	if *verbose {
		opts.Logf = log.Printf
	}
	if *funnel {
		// The relay's tailnet node runs in this process, often unprivileged: no socket marks or
		// device binding, which its traffic to this machine's addresses does not need.
		netns.SetEnabled(false)
	}
	if *dir == "" {
		d, err := os.MkdirTemp("", "localtailnet-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d) //nolint:errcheck // best effort, on the way out
		*dir = d
	}
	lt, err := localtailnet.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer lt.Close() //nolint:errcheck // on the way out: nothing is left to act on it
	idFile, secretFile, err := lt.WriteOAuthFiles(*dir)
	if err != nil {
		return err
	}
	var adminURL string
	if *adminAddr != "" {
		if adminURL, err = serveAdmin(ctx, *adminAddr, lt); err != nil {
			return err
		}
	}
	if *envFile != "" {
		if err := writeEnvFile(*envFile, lt, adminURL); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, `local tailnet %s is up
  control URL:        %s
  API base URL:       %s
  OAuth client ID:    %s
  client ID file:     %s
  client secret file: %s
  allowed tags:       %s

Mint an auth key and join:
  TOKEN=$(curl -s -d grant_type=client_credentials --data-urlencode client_id@%[5]s --data-urlencode client_secret@%[6]s %[3]s/api/v2/oauth/token | jq -r .access_token)
  KEY=$(curl -s -H "Authorization: Bearer $TOKEN" -d '{"capabilities":{"devices":{"create":{"preauthorized":true,"tags":["%[8]s"]}}}}' %[3]s/api/v2/tailnet/-/keys | jq -r .key)
  tailscale up --login-server %[2]s --auth-key "$KEY"
`, lt.Domain, lt.ControlURL, lt.APIBaseURL, lt.OAuthClientID, idFile, secretFile, strings.Join(opts.AllowedTags, ","), opts.AllowedTags[0])
	if ca := lt.ACME; ca != nil {
		fmt.Fprintf(stdout, `
ACME CA for the nodes' certificates (DNS-01 through the tailnet)
  ACME directory:     %s
  CA roots file:      %s
  API root file:      %s
  challenge DNS:      %s

A tailscaled or proxy process gets certificates from it when started with:
  %s
`, ca.DirectoryURL, ca.RootsFile, ca.APIRootFile, lt.DNSAddr, strings.Join(ca.Env(), " "))
	}
	if lt.FunnelAddr != "" {
		granted := "no device yet (-funnel-tags)"
		if len(opts.NodeAttrs) > 0 {
			granted = strings.Join(opts.NodeAttrs[0].Target, ",")
		}
		fmt.Fprintf(stdout, `
Funnel (public access to https://<name>/ for the names devices serve over Funnel)
  listener (port 443): %s
  public DNS:          %s
  "funnel" granted to: %s
`, lt.FunnelAddr, lt.DNSAddr, granted)
	}
	fmt.Fprintln(stdout, "\nCtrl-C stops it.")
	<-ctx.Done()
	fmt.Fprintln(stdout, "shutting down")
	return lt.Close()
}

// writeEnvFile writes the tailnet's settings for `set -a; . file`. It holds the OAuth client
// secret, so only its owner may read it; it is written whole or not at all, so a script waiting
// for it never reads half of it.
func writeEnvFile(path string, lt *localtailnet.LocalTailnet, adminURL string) error {
	vars := [][2]string{
		{"TS_CONTROL_URL", lt.ControlURL},
		{"TS_API_BASE_URL", lt.APIBaseURL},
		{"TS_API_CLIENT_ID", lt.OAuthClientID},
		{"TS_API_CLIENT_SECRET", lt.OAuthClientSecret.Reveal()},
	}
	if ca := lt.ACME; ca != nil {
		vars = append(vars,
			[2]string{"TS_DEBUG_ACME_DIRECTORY_URL", ca.DirectoryURL},
			[2]string{"ACME_ROOTS_FILE", ca.RootsFile},
			[2]string{"ACME_API_ROOT_FILE", ca.APIRootFile})
	}
	if lt.FunnelAddr != "" {
		vars = append(vars, [2]string{"FUNNEL_ADDR", lt.FunnelAddr}, [2]string{"PUBLIC_DNS_ADDR", lt.DNSAddr})
	}
	if adminURL != "" {
		vars = append(vars, [2]string{"LOCALTAILNET_ADMIN_URL", adminURL})
	}
	var b strings.Builder
	for _, kv := range vars {
		fmt.Fprintf(&b, "%s='%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", `'\''`))
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, t := range strings.Split(v, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// serveAdmin serves -admin-addr until ctx ends and returns its URL. It must listen on a
// loopback address: it takes no credentials.
func serveAdmin(ctx context.Context, addr string, lt *localtailnet.LocalTailnet) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("-admin-addr %q must be a loopback address", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /control/{state}", func(w http.ResponseWriter, r *http.Request) {
		switch r.PathValue("state") {
		case "down":
			lt.SetControlDown(true)
		case "up":
			lt.SetControlDown(false)
		default:
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /acme/orders", func(w http.ResponseWriter, r *http.Request) {
		if lt.ACME == nil {
			http.Error(w, "no CA (-acme=false)", http.StatusNotFound)
			return
		}
		orders, issued := lt.ACME.OrderTotals()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]int{"orders": orders, "issued": issued})
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), nil
}
