package localtailnet

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"tailscale.com/control/controlhttp/controlhttpserver"
	"tailscale.com/tailcfg"
	"tailscale.com/types/key"
	"tailscale.com/types/logger"
	"tailscale.com/util/zstdframe"
)

// server is the control server and the API in one: both act on the same state.
type server struct {
	logf        logger.Logf
	domain      string
	https       bool
	dns         *dnsServer // with https only
	derpMap     *tailcfg.DERPMap
	noiseKey    key.MachinePrivate
	allowedTags []string
	oauthID     string
	oauthSecret string
	federated   *FederatedIdentity // identity tokens the OAuth client trusts; nil: none

	// ctx ends with the server; it ends the map polls.
	ctx context.Context
	// down refuses every request and Noise connection (SetControlDown).
	down atomic.Bool

	mu         sync.Mutex
	lastNodeID tailcfg.NodeID
	nodes      map[tailcfg.NodeID]*node
	keys       map[string]*authKey             // by secret
	users      map[string]*tailcfg.UserProfile // people, by login name
	services   map[tailcfg.ServiceName]*service
	c2n        map[string]tailcfg.NodeID // in-flight c2n requests, by token
	tokens     map[string]time.Time      // API access tokens and their expiry
	faults     []APIFault
	noiseConns map[net.Conn]bool // hijacked, so http.Server.Shutdown does not see them

	// Address families Tailscale Services lack (SetServiceAddrFamilies); none by default.
	noServiceIPv4, noServiceIPv6 bool

	// nodeAttrs are the policy's node attributes (SetNodeAttrs).
	nodeAttrs []NodeAttr
	// appGrants are the policy's grants of app capabilities (SetAppGrants).
	appGrants []AppGrant
	// funnel is the Funnel relay, with Options.Funnel.
	funnel *funnelRelay
	// funnelTurn spreads Funnel connections to a Tailscale Service over its hosts.
	funnelTurn int
}

const (
	maxBody           = 1 << 20
	keepAliveInterval = 45 * time.Second // the client gives up on a silent poll after 2 minutes
)

func (s *server) serveKey(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	// No legacy key: clients since capability version 28 speak only Noise (ts2021).
	_ = json.NewEncoder(w).Encode(tailcfg.OverTLSPublicKeyResponse{PublicKey: s.noiseKey.Public()})
}

// serveNoise upgrades to the Noise channel and serves the machine API over HTTP/2 inside it.
func (s *server) serveNoise(w http.ResponseWriter, r *http.Request) {
	conn, err := controlhttpserver.AcceptHTTP(r.Context(), w, r, s.noiseKey, nil)
	if err != nil {
		s.logf("localtailnet: noise upgrade: %v", err)
		return
	}
	if !s.trackConn(conn, true) {
		_ = conn.Close()
		return
	}
	defer s.trackConn(conn, false)
	defer conn.Close() //nolint:errcheck // the client has gone or is being cut off
	mkey := conn.Peer()
	var h2 http2.Server
	h2.ServeConn(conn, &http2.ServeConnOpts{
		Context: s.ctx,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveMachine(w, r, mkey) }),
	})
}

// unlessDown refuses every request while the control server is down (SetControlDown).
func (s *server) unlessDown(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.down.Load() {
			http.Error(w, "control server down", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// trackConn adds or removes a Noise connection; it refuses new ones once the server is closing.
func (s *server) trackConn(c net.Conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.noiseConns, c)
		return true
	}
	if s.ctx.Err() != nil || s.down.Load() {
		return false
	}
	s.noiseConns[c] = true
	return true
}

func (s *server) closeNoiseConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.noiseConns {
		c.Close()
	}
}

func (s *server) serveMachine(w http.ResponseWriter, r *http.Request, mkey key.MachinePublic) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST required", http.StatusMethodNotAllowed)
		return
	}
	switch path := r.URL.Path; {
	case path == "/machine/register":
		s.serveRegister(w, r, mkey)
	case path == "/machine/map":
		s.serveMap(w, r, mkey)
	case path == "/machine/set-dns":
		s.serveSetDNS(w, r, mkey)
	case strings.HasPrefix(path, "/c2n/"):
		s.serveC2NResult(w, r, mkey, strings.TrimPrefix(path, "/c2n/"))
	default:
		http.NotFound(w, r)
	}
}

func decodeBody(r *http.Request, v any) error {
	return json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client sees a short body
}

// serveRegister logs a node in. A known node key needs nothing more; a new one needs an auth
// key minted through the API. An Expiry in the past is a logout, which removes the node.
func (s *server) serveRegister(w http.ResponseWriter, r *http.Request, mkey key.MachinePublic) {
	var req tailcfg.RegisterRequest
	if err := decodeBody(r, &req); err != nil || req.NodeKey.IsZero() {
		http.Error(w, "bad register request", http.StatusBadRequest)
		return
	}
	ok := tailcfg.RegisterResponse{User: taggedUser, Login: taggedLogin, MachineAuthorized: true}
	fail := func(msg string) { writeJSON(w, http.StatusOK, tailcfg.RegisterResponse{Error: msg}) }

	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodeByKeyLocked(req.NodeKey); n != nil {
		if n.machine != mkey {
			fail("node key is registered to another machine")
			return
		}
		if !req.Expiry.IsZero() && req.Expiry.Before(time.Now()) {
			s.deleteNodeLocked(n, "logged out")
		}
		writeJSON(w, http.StatusOK, registered(n))
		return
	}
	if !req.Expiry.IsZero() && req.Expiry.Before(time.Now()) {
		writeJSON(w, http.StatusOK, ok) // logging out an unknown node: nothing to do
		return
	}
	if req.Auth == nil || req.Auth.AuthKey == "" {
		// As Tailscale's control server answers a node without an auth key: a URL for an
		// interactive login, which nobody completes here. The same URL again for a follow-up
		// makes the client back off.
		url := req.Followup
		if url == "" {
			url = "http://" + r.Host + "/a/" + randomText(12)
		}
		writeJSON(w, http.StatusOK, tailcfg.RegisterResponse{AuthURL: url})
		return
	}
	k := s.keys[req.Auth.AuthKey]
	switch {
	case k == nil:
		fail("invalid auth key")
		return
	case k.used:
		s.logf("localtailnet: refused single-use auth key %s: already used", k.id)
		fail("auth key has already been used")
		return
	case !k.revoked.IsZero():
		s.logf("localtailnet: refused auth key %s: revoked", k.id)
		fail("auth key has been revoked")
		return
	case time.Now().After(k.expires):
		s.logf("localtailnet: refused auth key %s: expired", k.id)
		fail("auth key has expired")
		return
	}
	if !k.reusable {
		k.used = true
	}
	n := s.addNodeLocked(mkey, &req, k)
	s.logf("localtailnet: node %d (%s) registered as %s with auth key %s, tags %v",
		n.id, n.stableID, n.fqdn(s.domain), k.id, n.tags)
	writeJSON(w, http.StatusOK, registered(n))
}

// registered is the answer to a successful login of n, naming the user it belongs to.
func registered(n *node) tailcfg.RegisterResponse {
	ok := tailcfg.RegisterResponse{User: taggedUser, Login: taggedLogin, MachineAuthorized: true}
	if o := n.owner; o != nil {
		ok.User = tailcfg.User{ID: o.ID, DisplayName: o.DisplayName}
		ok.Login = tailcfg.Login{ID: tailcfg.LoginID(o.ID), Provider: "localtailnet", LoginName: o.LoginName, DisplayName: o.DisplayName}
	}
	return ok
}

// serveMap answers map requests: non-streaming ones carry the node's endpoints and Hostinfo,
// streaming ones get a full netmap now and again after every change.
func (s *server) serveMap(w http.ResponseWriter, r *http.Request, mkey key.MachinePublic) {
	var req tailcfg.MapRequest
	if err := decodeBody(r, &req); err != nil {
		http.Error(w, "bad map request", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	n := s.nodeByKeyLocked(req.NodeKey)
	if n == nil || n.machine != mkey {
		s.mu.Unlock()
		http.Error(w, "node not found", http.StatusUnauthorized)
		return
	}
	n.lastSeen = time.Now()
	s.noteDiscoKeyLocked(n, req.DiscoKey)
	if !req.Stream {
		s.applyUpdateLocked(n, &req)
	}
	var wakeCh chan struct{}
	if req.Stream {
		// A node has one poll; a new one replaces the old, which notices and ends.
		old := n.stream
		wakeCh = make(chan struct{}, 1)
		n.stream = wakeCh
		wake(old)
		s.changedLocked() // peers learn it is online
	}
	s.mu.Unlock()

	if wakeCh != nil {
		defer func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if n.stream == wakeCh {
				n.stream, n.lastSeen = nil, time.Now()
				s.changedLocked()
			}
		}()
	}
	w.WriteHeader(http.StatusOK)
	if !req.Stream && req.OmitPeers {
		return // a "lite" update: the client reads no answer
	}

	compress := req.Compress == "zstd"
	var sent map[tailcfg.NodeID]bool
	keepAlive := time.NewTicker(keepAliveInterval)
	defer keepAlive.Stop()
	for {
		s.mu.Lock()
		if s.nodes[n.id] != n || (wakeCh != nil && n.stream != wakeCh) {
			s.mu.Unlock()
			return // deleted, or replaced by a newer poll
		}
		res, peers := s.mapResponseLocked(n, sent)
		msgs := []*tailcfg.MapResponse{res}
		if req.Stream {
			for _, p := range n.pings {
				msgs = append(msgs, &tailcfg.MapResponse{PingRequest: p})
			}
			n.pings = nil
		}
		s.mu.Unlock()
		for _, m := range msgs {
			if err := writeMapMessage(w, compress, m); err != nil {
				return
			}
		}
		if req.Stream {
			s.mu.Lock()
			if !n.mapped {
				n.mapped = true
				s.changedLocked() // its peers may now be told of it
			}
			s.mu.Unlock()
		}
		sent = peers
		if !req.Stream {
			return
		}
	wait:
		for {
			select {
			case <-r.Context().Done():
				return
			case <-wakeCh:
				break wait
			case <-keepAlive.C:
				if err := writeMapMessage(w, compress, &tailcfg.MapResponse{KeepAlive: true}); err != nil {
					return
				}
			}
		}
	}
}

// writeMapMessage frames one MapResponse: a little-endian length, then the (compressed) JSON.
func writeMapMessage(w http.ResponseWriter, compress bool, m *tailcfg.MapResponse) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if compress {
		b = zstdframe.AppendEncode(nil, b, zstdframe.FastestCompression)
	}
	var size [4]byte
	binary.LittleEndian.PutUint32(size[:], uint32(len(b)))
	if _, err := w.Write(size[:]); err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	w.(http.Flusher).Flush()
	return nil
}

// serveC2NResult takes a node's answer to a c2n request: an HTTP response in the body.
func (s *server) serveC2NResult(w http.ResponseWriter, r *http.Request, mkey key.MachinePublic, token string) {
	res, err := http.ReadResponse(bufio.NewReader(io.LimitReader(r.Body, maxBody)), nil)
	if err != nil {
		http.Error(w, "bad c2n response", http.StatusBadRequest)
		return
	}
	defer res.Body.Close()
	var body tailcfg.C2NVIPServicesResponse
	if res.StatusCode != http.StatusOK {
		err = errors.New(res.Status)
	} else {
		err = json.NewDecoder(res.Body).Decode(&body)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.c2n[token]
	delete(s.c2n, token)
	n := s.nodes[id]
	if !ok || n == nil || n.machine != mkey {
		http.Error(w, "unknown c2n token", http.StatusNotFound)
		return
	}
	if err != nil {
		s.logf("localtailnet: node %d: c2n GET /vip-services: %v", n.id, err)
		n.servicesAsked = ""
	} else {
		s.setServicesLocked(n, &body)
	}
	w.WriteHeader(http.StatusNoContent)
}
