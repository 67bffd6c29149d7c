// Package localtailnet runs a whole tailnet on one machine: a control server, a DERP relay
// with STUN, MagicDNS, and the subset of the Tailscale API v2 that internal/tailnet uses,
// including the OAuth client credentials grant. It is the project's default for development,
// demos and tests; everything listens on 127.0.0.1 unless told otherwise.
//
// Tailscale clients join it with their control URL set to [LocalTailnet.ControlURL] and an auth
// key minted through the API, and talk to each other over DERP or directly. The tests use tsnet;
// tailscaled speaks the same protocol but is not exercised here.
// MagicDNS names are <host>.<Domain>; the default domain is "tailnet.test" (.test is reserved,
// so it can never clash with a real name).
//
// # Why not testcontrol
//
// tailscale.com/tstest/integration/testcontrol cannot carry what the API needs: the auth key
// is only visible inside the Noise-encrypted register request, which testcontrol decodes
// internally and accepts against a single RequireAuthKey (its Noise key and request-context
// key are unexported, so no wrapper can see the key); it has no way to remove a node; and it
// puts no Tailscale Service into netmaps. So this package implements the control protocol
// itself with the same building blocks (controlhttpserver for the Noise handshake, tailcfg
// messages, zstd framing), and what the API does acts on the state the nodes see:
//   - auth keys are minted per request, carry their tags, and single-use keys are spent by the
//     first registration;
//   - a deleted device leaves every peer's netmap at once;
//   - a Tailscale Service gets an IPv4 and an IPv6 address (or, after SetServiceAddrFamilies,
//     those of the families chosen) and a MagicDNS name <label>.<Domain>;
//     a tagged node that advertises it (the c2n GET /vip-services answer) is told the addresses
//     (the service-host node attribute) and its peers route them to it, one host per peer,
//     spread by node ID, among hosts that are connected. Advertising is approval enough, and
//     approval stays once the node stops advertising: it keeps the addresses, and answers
//     the peers that still route to it, as a draining replica on Tailscale does.
//
// # Certificates
//
// With Options.HTTPS a node's cert domains (netmap CertDomains) are its MagicDNS name and the
// Tailscale Services it hosts, and /machine/set-dns publishes the TXT record
// _acme-challenge.<cert domain> that tailscaled's ACME client asks for, into a DNS server at
// LocalTailnet.DNSAddr; any other name is refused with 403. Options.ACME adds the CA that
// checks those records (package localacme), so tailscaled's own certificate flow
// (LocalClient.CertPair, GetCertificate, Serve's TLS) runs end to end once the node's process
// has LocalTailnet.ACME.Env(). Before set-dns, tailscaled looks the record up once through the
// system resolver (best effort, 500 ms at most, to skip set-dns if the record is already
// public); that query is the only traffic that leaves loopback.
//
// # What it does not do
//
//   - No wildcard certificates (the node attribute for subdomains is never granted), no
//     TLS-ALPN-01 (Funnel hosts renew through DNS-01 too), no rate limit on set-dns.
//   - No ACL policy beyond node attributes (NodeAttr): every node may reach every other on
//     every port; tags are labels and NodeAttr targets only.
//   - No interactive login (a node without an auth key gets a login URL that leads nowhere), node
//     key expiry or rotation, device approval or Tailnet Lock.
//   - Funnel takes TLS on one port only (FunnelAddr, standing for 443), not 8443 or 10000.
//   - Clients must be of capability version 68 or later (August 2023), which report endpoints
//     and Hostinfo in non-streaming map requests only.
//   - Ephemeral nodes are not removed when they go offline, only when deleted or logged out.
//   - State is in memory and ends with Close.
package localtailnet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"

	"github.com/tsingress/tsingress/internal/tailnet"
	"github.com/tsingress/tsingress/internal/testing/localacme"
)

// Options configures a local tailnet. The zero value is ready to use.
type Options struct {
	// Addr is where the control server and the API listen, "127.0.0.1:0" by default. The DERP
	// relay and STUN listen on the same IP, on ports of their own; the DERP map and URLs name
	// that IP, so it cannot be a wildcard.
	Addr string
	// Domain is the MagicDNS domain and the tailnet's name; "tailnet.test" by default.
	Domain string
	// AllowedTags are the tags the OAuth client may mint keys for; by default
	// tag:k8s and tag:k8s-operator.
	AllowedTags []string
	// HTTPS makes the tailnet claim HTTPS support (API setting and node cert domains) and
	// run the DNS side of certificates: nodes publish their ACME DNS-01 records through
	// /machine/set-dns, and a DNS server at LocalTailnet.DNSAddr answers with them. Which CA
	// checks them is up to the nodes' ACME client; see ACME.
	HTTPS bool
	// ACME implies HTTPS and runs a certificate authority for the nodes: Pebble, in-process,
	// validating DNS-01 against DNSAddr (package localacme). A node's process uses it when it
	// runs with the environment LocalTailnet.ACME.Env().
	ACME bool
	// Funnel implies HTTPS and plays Tailscale Funnel's public side: a listener at FunnelAddr
	// (LocalTailnet.FunnelAddr) that takes TLS connections from anywhere and hands each to the
	// device that serves the ClientHello's server name over Funnel, through the device's peer
	// API as Tailscale's funnel relays do; and, in the DNS server at DNSAddr, an A record with
	// the listener's IP for each name served over Funnel, while it is. A device serves a name
	// over Funnel when the policy grants it the "funnel" node attribute (NodeAttrs) and its
	// Serve config allows Funnel for <name>:443 (tsnet's ListenFunnel, `tailscale funnel`).
	// The name is the device's MagicDNS name or that of a Tailscale Service it hosts; a
	// service's connections are spread over its hosts that allow Funnel for it.
	Funnel bool
	// FunnelAddr is where the Funnel listener listens; a port of its own on Addr's IP by
	// default. It stands for port 443 of Tailscale's relays: a client connects to it for
	// https://<name>/, with <name> in the ClientHello.
	FunnelAddr string
	// NodeAttrs are the policy's node attributes at start; SetNodeAttrs changes them.
	NodeAttrs []NodeAttr
	// Logf receives the local tailnet's logs; nil discards them. Credentials are never logged.
	Logf logger.Logf
}

// LocalTailnet is a running local tailnet.
type LocalTailnet struct {
	// ControlURL is for tsnet's ControlURL or `tailscale up --login-server`.
	ControlURL string
	// APIBaseURL is the Tailscale API v2 base URL (the same server as ControlURL).
	APIBaseURL string
	// OAuthClientID and OAuthClientSecret authenticate to the API; they are generated at Start.
	OAuthClientID     string
	OAuthClientSecret tailnet.Secret
	// DERPMap lists the local DERP relay.
	DERPMap *tailcfg.DERPMap
	// Domain is the MagicDNS domain.
	Domain string
	// DNSAddr is where the DNS server with the nodes' ACME DNS-01 records answers, over UDP
	// and TCP; empty without HTTPS.
	DNSAddr string
	// ACME is the certificate authority, with Options.ACME.
	ACME *localacme.CA
	// FunnelAddr is the Funnel listener's address (ip:port), with Options.Funnel: what a
	// client on the internet reaches port 443 of a name served over Funnel at. PublicDialer
	// dials it as such a client.
	FunnelAddr string

	srv       *server
	http      *http.Server
	relay     *relay
	dns       *dnsServer
	cancel    context.CancelFunc
	stopOnCtx func() bool
	closeOnce sync.Once
	closeErr  error
}

// Start runs a local tailnet until Close is called or ctx is done.
func Start(ctx context.Context, opts Options) (*LocalTailnet, error) {
	logf := opts.Logf
	if logf == nil {
		logf = logger.Discard
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if host, _, err := net.SplitHostPort(addr); err != nil || host == "" || net.ParseIP(host).IsUnspecified() {
		return nil, fmt.Errorf("localtailnet: Addr %q must name an IP the nodes can reach, not a wildcard", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ip := ln.Addr().(*net.TCPAddr).IP
	lt := &LocalTailnet{}
	fail := func(err error) (*LocalTailnet, error) {
		ln.Close()
		return nil, errors.Join(err, lt.closeParts())
	}
	relay, derpMap, err := startRelay(ip.String(), logf)
	if err != nil {
		return fail(err)
	}
	lt.relay = relay
	https := opts.HTTPS || opts.ACME || opts.Funnel
	if https {
		if lt.dns, err = startDNS(ip.String()); err != nil {
			return fail(err)
		}
		lt.DNSAddr = lt.dns.addr()
	}
	if opts.ACME {
		lt.ACME, err = localacme.Start(context.Background(), localacme.Options{
			DNSServer: lt.DNSAddr,
			Addr:      net.JoinHostPort(ip.String(), "0"),
			Logf:      logf,
		})
		if err != nil {
			return fail(err)
		}
	}
	srvCtx, cancel := context.WithCancel(context.Background())
	s := &server{
		logf:        logf,
		domain:      cmp.Or(opts.Domain, "tailnet.test"),
		https:       https,
		dns:         lt.dns,
		derpMap:     derpMap,
		noiseKey:    key.NewMachine(),
		allowedTags: slices.Clone(opts.AllowedTags),
		oauthID:     "k" + randomText(10) + "CNTRL",
		ctx:         srvCtx,
		nodes:       make(map[tailcfg.NodeID]*node),
		keys:        make(map[string]*authKey),
		services:    make(map[tailcfg.ServiceName]*service),
		c2n:         make(map[string]tailcfg.NodeID),
		tokens:      make(map[string]time.Time),
		noiseConns:  make(map[net.Conn]bool),
		nodeAttrs:   cloneNodeAttrs(opts.NodeAttrs),
	}
	s.oauthSecret = "tskey-client-" + s.oauthID + "-" + randomText(26)
	if len(s.allowedTags) == 0 {
		s.allowedTags = []string{"tag:k8s", "tag:k8s-operator"}
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /key", s.serveKey)
	mux.HandleFunc("/ts2021", s.serveNoise)
	mux.Handle(apiPrefix, s.apiHandler())
	hs := &http.Server{
		Handler:           s.unlessDown(mux),
		ErrorLog:          logger.StdLogger(logf),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return srvCtx },
	}
	go hs.Serve(ln) //nolint:errcheck // ends with Close

	url := "http://" + ln.Addr().String()
	lt.ControlURL, lt.APIBaseURL = url, url
	lt.OAuthClientID, lt.OAuthClientSecret = s.oauthID, tailnet.NewSecret(s.oauthSecret)
	lt.DERPMap, lt.Domain = derpMap, s.domain
	lt.srv, lt.http, lt.cancel = s, hs, cancel
	lt.stopOnCtx = context.AfterFunc(ctx, func() { _ = lt.Close() })
	if opts.Funnel {
		relayIP, _ := netip.AddrFromSlice(ip)
		lt.dns.setPublic(func(name string) (netip.Addr, bool) { return relayIP.Unmap(), s.funnelName(name) })
		f, err := startFunnel(ctx, s, url, cmp.Or(opts.FunnelAddr, net.JoinHostPort(ip.String(), "0")), logf)
		if err != nil {
			return nil, errors.Join(err, lt.Close())
		}
		s.mu.Lock()
		s.funnel = f
		s.mu.Unlock()
		lt.FunnelAddr = f.addr()
		logf("localtailnet: Funnel relay at %s", lt.FunnelAddr)
	}
	logf("localtailnet: control server and API at %s, DERP at %s:%d, domain %s",
		url, ip, derpMap.Regions[1].Nodes[0].DERPPort, s.domain)
	return lt, nil
}

// Close stops the local tailnet; nodes lose their control server and relay.
func (lt *LocalTailnet) Close() error {
	lt.closeOnce.Do(func() {
		lt.stopOnCtx()
		// Longer than the 5s Shutdown gives a connection that has sent nothing yet, such as
		// one a client opened just before giving up on its request, before counting it idle.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var funnelErr error
		lt.srv.mu.Lock()
		f := lt.srv.funnel
		lt.srv.mu.Unlock()
		if f != nil {
			funnelErr = f.close() // first: its node still has a control server to leave
		}
		lt.cancel() // ends map polls and refuses new Noise connections
		lt.srv.closeNoiseConns()
		lt.closeErr = errors.Join(funnelErr, lt.http.Shutdown(ctx), lt.closeParts())
	})
	return lt.closeErr
}

// closeParts stops what runs beside the control server, as far as it was started.
func (lt *LocalTailnet) closeParts() error {
	var errs []error
	if lt.ACME != nil {
		errs = append(errs, lt.ACME.Close())
	}
	if lt.dns != nil {
		errs = append(errs, lt.dns.close())
	}
	if lt.relay != nil {
		errs = append(errs, lt.relay.close())
	}
	return errors.Join(errs...)
}

// WriteOAuthFiles writes the OAuth client ID and secret to files named client_id and
// client_secret in dir (mode 0600), the layout the operator reads, and returns their paths.
func (lt *LocalTailnet) WriteOAuthFiles(dir string) (idFile, secretFile string, err error) {
	idFile, secretFile = filepath.Join(dir, "client_id"), filepath.Join(dir, "client_secret")
	if err := os.WriteFile(idFile, []byte(lt.OAuthClientID), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(secretFile, []byte(lt.OAuthClientSecret.Reveal()), 0o600); err != nil {
		return "", "", err
	}
	return idFile, secretFile, nil
}

// APIClient is a control-plane client of this tailnet as the operator has it: OAuth files
// written to dir, the API at APIBaseURL.
func (lt *LocalTailnet) APIClient(dir string) (*tailnet.APIClient, error) {
	idFile, secretFile, err := lt.WriteOAuthFiles(dir)
	if err != nil {
		return nil, err
	}
	return tailnet.NewAPIClient(tailnet.APIConfig{BaseURL: lt.APIBaseURL, ClientIDFile: idFile, ClientSecretFile: secretFile})
}

// InjectAPIFault makes the API fail the next f.Times requests with f.Status. Faults queue up.
func (lt *LocalTailnet) InjectAPIFault(f APIFault) {
	lt.srv.mu.Lock()
	defer lt.srv.mu.Unlock()
	lt.srv.faults = append(lt.srv.faults, f)
}

// ClearAPIFaults drops the faults not yet served.
func (lt *LocalTailnet) ClearAPIFaults() {
	lt.srv.mu.Lock()
	defer lt.srv.mu.Unlock()
	lt.srv.faults = nil
}

// SetControlDown takes the control server and the API down, or brings them back: while down,
// the nodes' Noise connections are cut and every request is refused with 503, as for a
// coordination server that cannot be reached. DERP, STUN, DNS and the CA keep running, so nodes
// go on talking to each other with the netmap they have.
func (lt *LocalTailnet) SetControlDown(down bool) {
	lt.srv.down.Store(down)
	if down {
		lt.srv.closeNoiseConns()
	}
	lt.srv.logf("localtailnet: control server and API %s", map[bool]string{true: "down", false: "up"}[down])
}

// SetServiceAddrFamilies chooses the address families of Tailscale Services: IPv4 and IPv6 by
// default, as on Tailscale. Existing services lose the address of a family turned off and get
// one of a family turned on. It stands in for a control plane that cannot give a service an
// address of some family, so tests reach what a client of the API does about that.
func (lt *LocalTailnet) SetServiceAddrFamilies(ipv4, ipv6 bool) error {
	if !ipv4 && !ipv6 {
		return errors.New("localtailnet: a Tailscale Service needs an address of at least one family")
	}
	lt.srv.mu.Lock()
	defer lt.srv.mu.Unlock()
	return lt.srv.setServiceFamiliesLocked(ipv4, ipv6)
}

// MintUserKey mints a single-use key for a device owned by a person (login name and display
// name), as if they had logged in interactively: such callers carry a user identity, which
// tagged devices do not. The Tailscale API cannot mint these; tests of identity headers can.
func (lt *LocalTailnet) MintUserKey(login, displayName string) tailnet.Secret {
	s := lt.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users == nil {
		s.users = map[string]*tailcfg.UserProfile{}
	}
	owner := s.users[login]
	if owner == nil {
		owner = &tailcfg.UserProfile{ID: taggedUserID + tailcfg.UserID(len(s.users)+1), LoginName: login, DisplayName: displayName}
		s.users[login] = owner
	}
	id := "k" + randomText(10) + "CNTRL"
	now := time.Now()
	k := &authKey{id: id, secret: "tskey-auth-" + id + "-" + randomText(26), owner: owner,
		description: "device of " + login, created: now, expires: now.Add(defaultKeyExpiry)}
	s.keys[k.secret] = k
	return tailnet.NewSecret(k.secret)
}

// Key is an auth key as the tailnet holds it, without its secret.
type Key struct {
	ID, Description string
	Created         time.Time
}

// LiveKeys lists the auth keys that can still log a device in: not revoked, not expired, not
// spent. An operator should hold at most one per proxy replica that has not logged in.
func (lt *LocalTailnet) LiveKeys() []Key {
	s := lt.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []Key
	now := time.Now()
	for _, k := range s.keys {
		if k.live(now) && !k.funnelRelay {
			keys = append(keys, Key{ID: k.id, Description: k.description, Created: k.created})
		}
	}
	slices.SortFunc(keys, func(a, b Key) int { return a.Created.Compare(b.Created) })
	return keys
}

// PublicDialer dials as a client on the internet does, for a test's or a script's
// http.Transport: it looks names up in the tailnet's public DNS (DNSAddr), which has the names
// served over Funnel while they are, and reaches port 443 at the Funnel listener. Any other
// port is refused. It needs Options.Funnel.
func (lt *LocalTailnet) PublicDialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, lt.DNSAddr)
	}}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if lt.FunnelAddr == "" {
			return nil, errors.New("localtailnet: no Funnel listener (Options.Funnel)")
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		if port != "443" {
			return nil, fmt.Errorf("localtailnet: Funnel takes port 443 only, not %s", port)
		}
		ips, err := resolver.LookupNetIP(ctx, "ip4", host)
		if err != nil {
			return nil, err
		}
		_, relayPort, _ := net.SplitHostPort(lt.FunnelAddr)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", net.JoinHostPort(ips[0].String(), relayPort))
	}
}
