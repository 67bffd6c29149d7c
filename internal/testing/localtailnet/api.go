package localtailnet

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	tsapi "tailscale.com/client/tailscale/v2"
	"tailscale.com/tailcfg"
)

// The subset of the Tailscale API v2 that internal/tailnet uses, with the same paths and JSON
// shapes (the request and response types are the v2 client's own).

const (
	tokenLifetime     = time.Hour
	defaultKeyExpiry  = 90 * 24 * time.Hour // Tailscale's default
	apiPrefix         = "/api/v2/"
	tailnetAPIPattern = "/api/v2/tailnet/{tailnet}/"
)

var tagRE = regexp.MustCompile(`^tag:[a-zA-Z][a-zA-Z0-9-]*$`)

// APIFault makes the API fail the next requests (all but the OAuth token endpoint), to test
// how callers handle errors such as rate limiting.
type APIFault struct {
	// Status is the HTTP status to answer with, e.g. 429 or 503.
	Status int
	// RetryAfter, if set, is sent as the Retry-After header, in whole seconds.
	RetryAfter time.Duration
	// Times is how many requests fail; zero means one.
	Times int
}

func (s *server) apiHandler() http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("POST "+tailnetAPIPattern+"keys", s.apiCreateKey)
	api.HandleFunc("GET "+tailnetAPIPattern+"keys", s.apiListKeys)
	api.HandleFunc("GET "+tailnetAPIPattern+"keys/{id}", s.apiGetKey)
	api.HandleFunc("DELETE "+tailnetAPIPattern+"keys/{id}", s.apiDeleteKey)
	api.HandleFunc("GET "+tailnetAPIPattern+"devices", s.apiListDevices)
	api.HandleFunc("GET /api/v2/device/{id}", s.apiGetDevice)
	api.HandleFunc("DELETE /api/v2/device/{id}", s.apiDeleteDevice)
	api.HandleFunc("GET "+tailnetAPIPattern+"vip-services", s.apiListServices)
	api.HandleFunc("GET "+tailnetAPIPattern+"vip-services/{name}", s.apiGetService)
	api.HandleFunc("PUT "+tailnetAPIPattern+"vip-services/{name}", s.apiPutService)
	api.HandleFunc("DELETE "+tailnetAPIPattern+"vip-services/{name}", s.apiDeleteService)
	api.HandleFunc("GET "+tailnetAPIPattern+"settings", s.apiSettings)
	api.HandleFunc("GET "+tailnetAPIPattern+"dns/preferences", s.apiDNSPreferences)

	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v2/oauth/token", s.serveToken)
	mux.HandleFunc("POST /api/v2/oauth/token-exchange", s.serveTokenExchange)
	mux.Handle(apiPrefix, s.requireToken(s.injectFaults(api)))
	return s.logRequests(mux)
}

func apiError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]string{"message": fmt.Sprintf(format, args...)})
}

// logRequests logs the request line and status, never headers or bodies: they carry
// the client secret, tokens and auth keys.
func (s *server) logRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		s.logf("localtailnet: API %s %s: %d", r.Method, r.URL.Path, sw.status)
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// serveToken is the OAuth client credentials grant.
func (s *server) serveToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request"})
		return
	}
	if r.PostForm.Get("grant_type") != "client_credentials" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unsupported_grant_type"})
		return
	}
	id, secret, ok := r.BasicAuth()
	if !ok {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	if subtle.ConstantTimeCompare([]byte(id), []byte(s.oauthID)) != 1 ||
		subtle.ConstantTimeCompare([]byte(secret), []byte(s.oauthSecret)) != 1 {
		writeJSON(w, http.StatusUnauthorized, map[string]string{
			"error": "invalid_client", "error_description": "unknown client or wrong secret"})
		return
	}
	s.issueToken(w)
}

// issueToken answers with a new API token.
func (s *server) issueToken(w http.ResponseWriter) {
	tok := "tskey-api-" + randomText(24)
	s.mu.Lock()
	now := time.Now()
	for t, exp := range s.tokens {
		if now.After(exp) {
			delete(s.tokens, t)
		}
	}
	s.tokens[tok] = now.Add(tokenLifetime)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": tok,
		"token_type":   "Bearer",
		"expires_in":   int(tokenLifetime / time.Second),
		"scope":        "all",
	})
}

func (s *server) requireToken(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		s.mu.Lock()
		exp, known := s.tokens[tok]
		s.mu.Unlock()
		if !ok || !known || time.Now().After(exp) {
			apiError(w, http.StatusUnauthorized, "API token invalid or expired")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (s *server) injectFaults(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		var f *APIFault
		if len(s.faults) > 0 {
			f = new(s.faults[0])
			if s.faults[0].Times--; s.faults[0].Times <= 0 {
				s.faults = s.faults[1:]
			}
		}
		s.mu.Unlock()
		if f == nil {
			h.ServeHTTP(w, r)
			return
		}
		if f.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int((f.RetryAfter+time.Second-1)/time.Second)))
		}
		apiError(w, f.Status, "%s (injected)", http.StatusText(f.Status))
	})
}

// tailnetOK accepts "-" (the OAuth client's own tailnet) and the tailnet's name, its domain.
func (s *server) tailnetOK(w http.ResponseWriter, r *http.Request) bool {
	if t := r.PathValue("tailnet"); t != "-" && t != s.domain {
		apiError(w, http.StatusNotFound, "tailnet %q not found", t)
		return false
	}
	return true
}

func (s *server) apiCreateKey(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	var req tsapi.CreateKeyRequest
	if err := decodeBody(r, &req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid request body")
		return
	}
	create := req.Capabilities.Devices.Create
	if len(create.Tags) == 0 {
		apiError(w, http.StatusBadRequest, "keys created by an OAuth client must have tags")
		return
	}
	var bad []string
	for _, t := range create.Tags {
		if !tagRE.MatchString(t) || !slices.Contains(s.allowedTags, t) {
			bad = append(bad, t)
		}
	}
	if len(bad) > 0 {
		// Tailscale's status and wording for tags the client does not own.
		apiError(w, http.StatusBadRequest, "requested tags %v are invalid or not permitted", bad)
		return
	}
	// The admin console's limit, which the API keeps too.
	if len(req.Description) > maxKeyDescription {
		apiError(w, http.StatusBadRequest, "description must be at most %d characters", maxKeyDescription)
		return
	}
	if req.ExpirySeconds < 0 {
		apiError(w, http.StatusBadRequest, "expirySeconds must not be negative")
		return
	}
	expiry := defaultKeyExpiry
	if req.ExpirySeconds > 0 {
		expiry = time.Duration(req.ExpirySeconds) * time.Second
	}
	id := "k" + randomText(10) + "CNTRL"
	now := time.Now()
	k := &authKey{
		id:          id,
		secret:      "tskey-auth-" + id + "-" + randomText(26),
		tags:        slices.Clone(create.Tags),
		reusable:    create.Reusable,
		ephemeral:   create.Ephemeral,
		description: req.Description,
		created:     now,
		expires:     now.Add(expiry),
	}
	s.mu.Lock()
	s.keys[k.secret] = k
	s.mu.Unlock()
	s.logf("localtailnet: minted auth key %s (%q), tags %v, reusable=%v, expires %v",
		k.id, k.description, k.tags, k.reusable, k.expires.Format(time.RFC3339))
	writeJSON(w, http.StatusOK, tsapi.Key{
		ID:           k.id,
		KeyType:      "auth",
		Key:          k.secret,
		Description:  k.description,
		Created:      k.created,
		Expires:      k.expires,
		Capabilities: req.Capabilities,
	})
}

// maxKeyDescription is the longest description an auth key may have.
const maxKeyDescription = 50

// live says whether k can still log a device in.
func (k *authKey) live(now time.Time) bool {
	return k.revoked.IsZero() && now.Before(k.expires) && (!k.used || k.reusable)
}

// keyByIDLocked finds a key by its ID.
func (s *server) keyByIDLocked(id string) *authKey {
	for _, k := range s.keys {
		if k.id == id {
			return k
		}
	}
	return nil
}

// apiListKeys lists the active keys by ID only, as the Tailscale API does.
func (s *server) apiListKeys(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	s.mu.Lock()
	keys := []tsapi.Key{}
	now := time.Now()
	for _, k := range s.keys {
		if k.live(now) && !k.funnelRelay {
			keys = append(keys, tsapi.Key{ID: k.id})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(keys, func(a, b tsapi.Key) int { return strings.Compare(a.ID, b.ID) })
	writeJSON(w, http.StatusOK, map[string][]tsapi.Key{"keys": keys})
}

// apiGetKey describes one key, without its secret.
func (s *server) apiGetKey(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keyByIDLocked(r.PathValue("id"))
	if k == nil {
		apiError(w, http.StatusNotFound, "key not found")
		return
	}
	writeJSON(w, http.StatusOK, tsapi.Key{ID: k.id, KeyType: "auth", Description: k.description, Created: k.created,
		Expires: k.expires, Revoked: k.revoked, Invalid: !k.live(time.Now())})
}

// apiDeleteKey revokes a key: it logs no device in from then on.
func (s *server) apiDeleteKey(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keyByIDLocked(r.PathValue("id"))
	if k == nil {
		apiError(w, http.StatusNotFound, "key not found")
		return
	}
	if k.revoked.IsZero() {
		k.revoked = time.Now()
		s.logf("localtailnet: revoked auth key %s (%q)", k.id, k.description)
	}
	w.WriteHeader(http.StatusOK)
}

func (s *server) apiDeviceLocked(n *node) tsapi.Device {
	d := tsapi.Device{
		Name:               n.fqdn(s.domain),
		ID:                 strconv.FormatInt(int64(n.id), 10),
		NodeID:             string(n.stableID),
		Authorized:         true,
		User:               taggedLogin.LoginName,
		Tags:               n.tags,
		KeyExpiryDisabled:  true,
		ClientVersion:      n.hostinfo.IPNVersion,
		Created:            tsapi.Time{Time: n.created},
		Hostname:           n.hostinfo.Hostname,
		IsEphemeral:        n.ephemeral,
		ConnectedToControl: n.stream != nil,
		MachineKey:         n.machine.String(),
		NodeKey:            n.nodeKey.String(),
		OS:                 n.hostinfo.OS,
	}
	for _, p := range n.addrs {
		d.Addresses = append(d.Addresses, p.Addr().String())
	}
	if n.stream == nil {
		d.LastSeen = &tsapi.Time{Time: n.lastSeen}
	}
	return d
}

func (s *server) apiListDevices(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	s.mu.Lock()
	devices := []tsapi.Device{}
	for _, n := range s.sortedNodesLocked() {
		if !n.funnelRelay { // Tailscale's relays are no devices of the tailnet
			devices = append(devices, s.apiDeviceLocked(n))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string][]tsapi.Device{"devices": devices})
}

func (s *server) apiGetDevice(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodeByIDLocked(r.PathValue("id"))
	if n == nil || n.funnelRelay {
		apiError(w, http.StatusNotFound, "device not found")
		return
	}
	writeJSON(w, http.StatusOK, s.apiDeviceLocked(n))
}

func (s *server) apiDeleteDevice(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodeByIDLocked(r.PathValue("id"))
	if n == nil || n.funnelRelay {
		apiError(w, http.StatusNotFound, "device not found")
		return
	}
	s.deleteNodeLocked(n, "deleted through the API")
	w.WriteHeader(http.StatusOK)
}

func apiService(svc *service) tsapi.Service {
	out := tsapi.Service{
		Name:        string(svc.name),
		Comment:     svc.comment,
		Annotations: svc.annotations,
		Ports:       svc.ports,
		Tags:        svc.tags,
	}
	for _, a := range svc.addrs {
		out.Addrs = append(out.Addrs, a.String())
	}
	return out
}

func (s *server) apiListServices(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	s.mu.Lock()
	list := []tsapi.Service{}
	for _, svc := range s.services {
		list = append(list, apiService(svc))
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b tsapi.Service) int { return strings.Compare(a.Name, b.Name) })
	writeJSON(w, http.StatusOK, map[string][]tsapi.Service{"vipServices": list})
}

func (s *server) apiGetService(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	svc := s.services[tailcfg.ServiceName(r.PathValue("name"))]
	if svc == nil {
		apiError(w, http.StatusNotFound, "service not found")
		return
	}
	writeJSON(w, http.StatusOK, apiService(svc))
}

// apiPutService creates or updates a service. Addresses are assigned on creation and kept
// on updates, whatever the request says.
func (s *server) apiPutService(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	name := tailcfg.ServiceName(r.PathValue("name"))
	if err := name.Validate(); err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var req tsapi.Service
	if err := decodeBody(r, &req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid request body")
		return
	}
	if req.Name != "" && req.Name != string(name) {
		apiError(w, http.StatusBadRequest, "service name in body %q differs from the path", req.Name)
		return
	}
	for _, t := range req.Tags {
		if !tagRE.MatchString(t) {
			apiError(w, http.StatusBadRequest, "invalid tag %q", t)
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	svc := s.services[name]
	if svc == nil {
		addrs, err := s.allocVIPLocked()
		if err != nil {
			apiError(w, http.StatusInternalServerError, "%v", err)
			return
		}
		svc = &service{name: name, addrs: addrs}
		s.services[name] = svc
		s.logf("localtailnet: created service %s with addresses %v", name, addrs)
	}
	svc.ports, svc.tags, svc.comment, svc.annotations = req.Ports, req.Tags, req.Comment, req.Annotations
	s.changedLocked()
	writeJSON(w, http.StatusOK, apiService(svc))
}

func (s *server) apiDeleteService(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	name := tailcfg.ServiceName(r.PathValue("name"))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.services[name] == nil {
		apiError(w, http.StatusNotFound, "service not found")
		return
	}
	delete(s.services, name)
	s.logf("localtailnet: deleted service %s", name)
	s.changedLocked()
	w.WriteHeader(http.StatusOK)
}

func (s *server) apiSettings(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	writeJSON(w, http.StatusOK, tsapi.TailnetSettings{HTTPSEnabled: s.https})
}

func (s *server) apiDNSPreferences(w http.ResponseWriter, r *http.Request) {
	if !s.tailnetOK(w, r) {
		return
	}
	writeJSON(w, http.StatusOK, tsapi.DNSPreferences{MagicDNS: true})
}
