// Command localtailnet runs a tailnet on this machine (control server, DERP relay, STUN,
// MagicDNS and the Tailscale API subset the operator uses) until interrupted.
//
//	localtailnet [-addr 127.0.0.1:0] [-domain tailnet.test] [-dir DIR] [-tags tag:k8s,tag:k8s-operator]
//
// It prints the control URL (for `tailscale up --login-server` or tsnet's ControlURL), the API
// base URL and the paths of the files holding the OAuth client ID and secret, the layout the
// operator's -client-id-file and -client-secret-file expect.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tsingress/tsingress/internal/localtailnet"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "Address of the control server and API.")
	domain := flag.String("domain", "tailnet.test", "MagicDNS domain of the tailnet.")
	dir := flag.String("dir", "", "Directory for the OAuth client files; a new temporary one by default.")
	tags := flag.String("tags", "tag:k8s,tag:k8s-operator", "Comma-separated tags the OAuth client may mint keys for.")
	verbose := flag.Bool("v", false, "Log control server and API activity.")
	flag.Parse()
	if err := run(*addr, *domain, *dir, *tags, *verbose); err != nil {
		log.Fatal(err)
	}
}

func run(addr, domain, dir, tags string, verbose bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	opts := localtailnet.Options{Addr: addr, Domain: domain}
	for _, t := range strings.Split(tags, ",") {
		if t = strings.TrimSpace(t); t != "" {
			opts.AllowedTags = append(opts.AllowedTags, t)
		}
	}
	if len(opts.AllowedTags) == 0 {
		return fmt.Errorf("-tags must name at least one tag")
	}
	if verbose {
		opts.Logf = log.Printf
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "localtailnet-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	lt, err := localtailnet.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer lt.Close()
	idFile, secretFile, err := lt.WriteOAuthFiles(dir)
	if err != nil {
		return err
	}
	fmt.Printf(`local tailnet %s is up
  control URL:        %s
  API base URL:       %s
  OAuth client ID:    %s
  client ID file:     %s
  client secret file: %s
  allowed tags:       %s

Mint an auth key and join:
  TOKEN=$(curl -s -d grant_type=client_credentials --data-urlencode client_id@%[5]s --data-urlencode client_secret@%[6]s %[3]s/api/v2/oauth/token | jq -r .access_token)
  curl -s -H "Authorization: Bearer $TOKEN" -d '{"capabilities":{"devices":{"create":{"preauthorized":true,"tags":["%[8]s"]}}}}' %[3]s/api/v2/tailnet/-/keys | jq -r .key
  tailscale up --login-server %[2]s --auth-key <key>

Ctrl-C stops it.
`, lt.Domain, lt.ControlURL, lt.APIBaseURL, lt.OAuthClientID, idFile, secretFile, strings.Join(opts.AllowedTags, ","), opts.AllowedTags[0])
	<-ctx.Done()
	fmt.Println("shutting down")
	return lt.Close()
}
