package localtailnet

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/miekg/dns"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
)

const acmeChallengePrefix = "_acme-challenge."

// maxTXTPerName bounds the values kept per name: a wildcard order needs two at once, and
// older ones belong to finished challenges.
const maxTXTPerName = 4

// dnsServer plays the public DNS of the tailnet's domain, which control owns on Tailscale: it
// answers TXT queries for the ACME DNS-01 records nodes publish through /machine/set-dns.
type dnsServer struct {
	udp, tcp *dns.Server

	mu  sync.Mutex
	txt map[string][]string // by lowercase name without the final dot; newest last
	// public answers A queries for the names served over Funnel: the relay's address. nil
	// without Funnel.
	public func(name string) (netip.Addr, bool)
}

// startDNS serves UDP and TCP on one port of ip: Pebble asks over TCP, most resolvers over UDP.
func startDNS(ip string) (*dnsServer, error) {
	d := &dnsServer{txt: make(map[string][]string)}
	var lastErr error
	for range 10 {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, err
		}
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		pc, err := net.ListenPacket("udp", net.JoinHostPort(ip, port))
		if err != nil {
			ln.Close()
			lastErr = err // the port is free for TCP only; try another
			continue
		}
		started := make(chan struct{}, 2)
		notify := func() { started <- struct{}{} }
		d.tcp = &dns.Server{Listener: ln, Handler: d, NotifyStartedFunc: notify}
		d.udp = &dns.Server{PacketConn: pc, Handler: d, NotifyStartedFunc: notify}
		go d.tcp.ActivateAndServe() //nolint:errcheck // ends with Shutdown
		go d.udp.ActivateAndServe() //nolint:errcheck // ends with Shutdown
		<-started
		<-started // Shutdown fails on a server that has not started
		return d, nil
	}
	return nil, fmt.Errorf("no port free for both UDP and TCP DNS: %w", lastErr)
}

func (d *dnsServer) addr() string { return d.tcp.Listener.Addr().String() }

func (d *dnsServer) close() error {
	return errors.Join(d.tcp.Shutdown(), d.udp.Shutdown())
}

func (d *dnsServer) setPublic(f func(name string) (netip.Addr, bool)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.public = f
}

func (d *dnsServer) addTXT(name, value string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	vals := slices.DeleteFunc(d.txt[name], func(v string) bool { return v == value })
	vals = append(vals, value)
	d.txt[name] = vals[max(0, len(vals)-maxTXTPerName):]
}

// ServeDNS answers from the published records: their TXT values, no data for other types,
// and NXDOMAIN for names without records. A name served over Funnel has an A record, the
// relay's address, while it is, as Tailscale publishes the names of funnel nodes.
func (d *dnsServer) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	res := new(dns.Msg)
	res.SetReply(req)
	res.Authoritative = true
	if len(req.Question) != 1 {
		res.Rcode = dns.RcodeFormatError
		_ = w.WriteMsg(res) // the resolver retries
		return
	}
	q := req.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	d.mu.Lock()
	vals, ok := d.txt[name]
	vals = slices.Clone(vals)
	public := d.public
	d.mu.Unlock()
	var relay netip.Addr // set for a name served over Funnel
	if public != nil {
		if addr, served := public(name); served {
			relay, ok = addr, true
		}
	}
	switch {
	case relay.IsValid() && q.Qtype == dns.TypeA:
		res.Answer = append(res.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET},
			A:   relay.AsSlice(),
		})
	case !ok:
		res.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeTXT:
		for _, v := range vals {
			res.Answer = append(res.Answer, &dns.TXT{
				// TTL 0: a retried challenge must see its new value at once.
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET},
				Txt: []string{v},
			})
		}
	}
	_ = w.WriteMsg(res) // the resolver retries
}

// serveSetDNS publishes a node's ACME DNS-01 record, as control does for the names it owns.
// A node may only publish _acme-challenge.<name> for its cert domains: its own MagicDNS name
// and the Tailscale Services it hosts.
func (s *server) serveSetDNS(w http.ResponseWriter, r *http.Request, mkey key.MachinePublic) {
	var req tailcfg.SetDNSRequest
	if err := decodeBody(r, &req); err != nil {
		http.Error(w, "bad set-dns request", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	n := s.nodeByKeyLocked(req.NodeKey)
	if n == nil || n.machine != mkey {
		s.mu.Unlock()
		http.Error(w, "node not found", http.StatusUnauthorized)
		return
	}
	domains := s.certDomainsLocked(n)
	s.mu.Unlock()

	name := strings.TrimSuffix(strings.ToLower(req.Name), ".")
	domain, isChallenge := strings.CutPrefix(name, acmeChallengePrefix)
	switch {
	case !isChallenge || !slices.Contains(domains, domain):
		s.logf("localtailnet: node %d: refused set-dns for %q: not a challenge name of its cert domains %q", n.id, req.Name, domains)
		http.Error(w, fmt.Sprintf("set-dns: %q is not %s<name> for a cert domain of this node %q", req.Name, acmeChallengePrefix, domains),
			http.StatusForbidden)
		return
	case req.Type != "TXT":
		http.Error(w, "set-dns: only TXT records", http.StatusBadRequest)
		return
	case req.Value == "" || len(req.Value) > 255:
		http.Error(w, "set-dns: a TXT value has 1 to 255 bytes", http.StatusBadRequest)
		return
	}
	s.dns.addTXT(name, req.Value) // a cert domain exists only with HTTPS, and so does s.dns
	s.logf("localtailnet: node %d published the TXT record %s", n.id, name)
	writeJSON(w, http.StatusOK, tailcfg.SetDNSResponse{})
}

// certDomainsLocked lists the names n may get certificates for: its MagicDNS name, then the
// Tailscale Services it hosts, as the netmap's CertDomains. None without HTTPS.
func (s *server) certDomainsLocked(n *node) []string {
	if !s.https {
		return nil
	}
	var services []string
	for name, hosts := range s.serviceHostsLocked() {
		if slices.Contains(hosts, n) {
			services = append(services, name.WithoutPrefix()+"."+s.domain)
		}
	}
	slices.Sort(services)
	return append([]string{n.fqdn(s.domain)}, services...)
}
