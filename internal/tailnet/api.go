package tailnet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	tsapi "tailscale.com/client/tailscale/v2"
)

// APIConfig configures an [APIClient].
type APIConfig struct {
	// BaseURL of the API, e.g. "https://api.tailscale.com" (the default) or a self-hosted
	// control plane that serves the Tailscale API v2.
	BaseURL string
	// Tailnet to act on; empty or "-" means the OAuth client's own.
	Tailnet string
	// ClientIDFile and ClientSecretFile hold the OAuth client's credentials. They are read
	// on every token fetch, so rotating the files takes effect without a restart.
	ClientIDFile, ClientSecretFile string
	// ClientID, in place of ClientIDFile, is the OAuth client's ID itself (not a secret).
	ClientID string
	// IDTokenFile, in place of ClientSecretFile, holds an identity token (a projected
	// ServiceAccount token) that the API exchanges for an API token of the client: workload
	// identity federation, no secret stored. It is read again for every exchange, as the
	// kubelet renews it.
	IDTokenFile string
	// Logger receives a debug line per request (method, path, status). Nil discards.
	Logger *slog.Logger
}

// APIClient is the [Client] backed by the Tailscale API v2.
type APIClient struct {
	api   *tsapi.Client
	creds *fileCredentials
}

var _ Client = (*APIClient)(nil)

const requestTimeout = 30 * time.Second

// maxIdleConns is how many connections to the API are kept for reuse.
const maxIdleConns = 64

// NewAPIClient returns a client for the API described by cfg. It does not contact the API;
// missing credential files show up as errors of the first call.
func NewAPIClient(cfg APIConfig) (*APIClient, error) {
	if (cfg.ClientIDFile == "") == (cfg.ClientID == "") || (cfg.ClientSecretFile == "") == (cfg.IDTokenFile == "") {
		return nil, errors.New("tailnet: the OAuth client's ID (or a file of it) and either its secret file or an identity token file are required")
	}
	base, err := url.Parse(strings.TrimSuffix(cmp.Or(cfg.BaseURL, "https://api.tailscale.com"), "/"))
	if err != nil || base.Scheme == "" || base.Host == "" {
		return nil, fmt.Errorf("tailnet: invalid API base URL %q", cfg.BaseURL)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The reconcilers of a large ProxyGroup call the API side by side. HTTP/1.1 keeps two idle
	// connections per host by default and dials (with TLS) for every other request.
	rt := http.DefaultTransport.(*http.Transport).Clone()
	rt.MaxIdleConnsPerHost = maxIdleConns
	creds := &fileCredentials{
		idFile:      cfg.ClientIDFile,
		clientID:    []byte(cfg.ClientID),
		secretFile:  cfg.ClientSecretFile,
		idTokenFile: cfg.IDTokenFile,
		tokenURL:    base.String() + "/api/v2/oauth/token",
		exchangeURL: base.String() + "/api/v2/oauth/token-exchange",
		httpClient:  &http.Client{Transport: rt, Timeout: requestTimeout},
		log:         log,
	}
	obs := &observer{base: rt, log: log, onUnauthorized: creds.invalidate}
	return &APIClient{
		creds: creds,
		api: &tsapi.Client{
			BaseURL:   base,
			Tailnet:   cmp.Or(cfg.Tailnet, "-"),
			UserAgent: "tsingress-operator",
			HTTP: &http.Client{
				Transport: &oauth2.Transport{Source: creds, Base: obs},
				Timeout:   requestTimeout,
			},
		},
	}, nil
}

// CreateAuthKey implements [Client].
func (c *APIClient) CreateAuthKey(ctx context.Context, req AuthKeyRequest) (AuthKey, error) {
	const op = "create auth key"
	if len(req.Tags) == 0 {
		return AuthKey{}, &Error{Op: op, Reason: ReasonInvalidRequest, Message: "at least one tag is required"}
	}
	// Never reusable: see the package documentation.
	var caps tsapi.KeyCapabilities
	caps.Devices.Create.Preauthorized = true
	caps.Devices.Create.Tags = req.Tags
	ctx, resp := observe(ctx)
	k, err := c.api.Keys().CreateAuthKey(ctx, tsapi.CreateKeyRequest{
		Capabilities:  caps,
		ExpirySeconds: int64(req.Expiry / time.Second),
		Description:   req.Description,
	})
	if err != nil {
		return AuthKey{}, resp.wrap(op, err)
	}
	if k.Key == "" {
		return AuthKey{}, &Error{Op: op, Reason: ReasonUnavailable, Message: "the API returned no key"}
	}
	return AuthKey{ID: k.ID, Secret: NewSecret(k.Key), Expires: k.Expires, Created: k.Created}, nil
}

// AuthKeys implements [Client].
func (c *APIClient) AuthKeys(ctx context.Context) ([]AuthKeyInfo, error) {
	listCtx, resp := observe(ctx)
	ks, err := c.api.Keys().List(listCtx, true)
	if err != nil {
		return nil, resp.wrap("list auth keys", err)
	}
	var out []AuthKeyInfo
	for _, k := range ks {
		getCtx, resp := observe(ctx)
		key, err := c.api.Keys().Get(getCtx, k.ID)
		if err != nil {
			if err := resp.wrap("get auth key", err); !IsNotFound(err) {
				return nil, err
			}
			continue // gone since the list
		}
		if (key.KeyType != "" && key.KeyType != "auth") || key.Invalid || !key.Revoked.IsZero() {
			continue
		}
		out = append(out, AuthKeyInfo{ID: key.ID, Description: key.Description, Created: key.Created})
	}
	return out, nil
}

// DeleteAuthKey implements [Client].
func (c *APIClient) DeleteAuthKey(ctx context.Context, id string) error {
	ctx, resp := observe(ctx)
	if err := c.api.Keys().Delete(ctx, id); err != nil {
		if err := resp.wrap("delete auth key", err); !IsNotFound(err) {
			return err
		}
	}
	return nil
}

// Device implements [Client].
func (c *APIClient) Device(ctx context.Context, id string) (Device, error) {
	ctx, resp := observe(ctx)
	d, err := c.api.Devices().Get(ctx, id)
	if err != nil {
		return Device{}, resp.wrap("get device", err)
	}
	return deviceFromAPI(d), nil
}

// Devices implements [Client].
func (c *APIClient) Devices(ctx context.Context) ([]Device, error) {
	ctx, resp := observe(ctx)
	ds, err := c.api.Devices().List(ctx)
	if err != nil {
		return nil, resp.wrap("list devices", err)
	}
	out := make([]Device, 0, len(ds))
	for i := range ds {
		out = append(out, deviceFromAPI(&ds[i]))
	}
	return out, nil
}

// DeleteDevice implements [Client].
func (c *APIClient) DeleteDevice(ctx context.Context, id string) error {
	ctx, resp := observe(ctx)
	if err := c.api.Devices().Delete(ctx, id); err != nil {
		if err := resp.wrap("delete device", err); !IsNotFound(err) {
			return err
		}
	}
	return nil
}

func deviceFromAPI(d *tsapi.Device) Device {
	return Device{
		ID:        cmp.Or(d.NodeID, d.ID),
		Name:      strings.TrimSuffix(d.Name, "."),
		Hostname:  d.Hostname,
		Tags:      d.Tags,
		Addresses: parseAddrs(d.Addresses),
		Created:   d.Created.Time,
	}
}

func parseAddrs(ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// Service implements [Client].
func (c *APIClient) Service(ctx context.Context, name string) (Service, error) {
	ctx, resp := observe(ctx)
	s, err := c.api.Services().Get(ctx, name)
	if err != nil {
		return Service{}, resp.wrap("get service", err)
	}
	return serviceFromAPI(s), nil
}

// PutService implements [Client]. The API answers a PUT with no body, so the stored service
// (with its assigned addresses) is read back.
func (c *APIClient) PutService(ctx context.Context, svc Service) (Service, error) {
	addrs := make([]string, 0, len(svc.Addrs))
	for _, a := range svc.Addrs {
		addrs = append(addrs, a.String())
	}
	octx, resp := observe(ctx)
	err := c.api.Services().CreateOrUpdate(octx, tsapi.Service{
		Name:        svc.Name,
		Addrs:       addrs,
		Comment:     svc.Comment,
		Annotations: svc.Annotations,
		Ports:       svc.Ports,
		Tags:        svc.Tags,
	})
	if err != nil {
		return Service{}, resp.wrap("put service", err)
	}
	return c.Service(ctx, svc.Name)
}

// DeleteService implements [Client].
func (c *APIClient) DeleteService(ctx context.Context, name string) error {
	ctx, resp := observe(ctx)
	if err := c.api.Services().Delete(ctx, name); err != nil {
		if err := resp.wrap("delete service", err); !IsNotFound(err) {
			return err
		}
	}
	return nil
}

// Services implements [Client].
func (c *APIClient) Services(ctx context.Context) ([]Service, error) {
	ctx, resp := observe(ctx)
	ss, err := c.api.Services().List(ctx)
	if err != nil {
		return nil, resp.wrap("list services", err)
	}
	out := make([]Service, 0, len(ss))
	for i := range ss {
		out = append(out, serviceFromAPI(&ss[i]))
	}
	return out, nil
}

func serviceFromAPI(s *tsapi.Service) Service {
	return Service{
		Name:        s.Name,
		Addrs:       parseAddrs(s.Addrs),
		Ports:       s.Ports,
		Tags:        s.Tags,
		Comment:     s.Comment,
		Annotations: s.Annotations,
	}
}

// TailnetInfo implements [Client]. The API has no call for the tailnet's DNS domain, so it
// is read off a device's MagicDNS name.
func (c *APIClient) TailnetInfo(ctx context.Context) (TailnetInfo, error) {
	var info TailnetInfo
	octx, resp := observe(ctx)
	settings, err := c.api.TailnetSettings().Get(octx)
	if err != nil {
		return info, resp.wrap("get tailnet settings", err)
	}
	octx, resp = observe(ctx)
	prefs, err := c.api.DNS().Preferences(octx)
	if err != nil {
		return info, resp.wrap("get DNS preferences", err)
	}
	info.HTTPSEnabled, info.MagicDNS = settings.HTTPSEnabled, prefs.MagicDNS
	devices, err := c.Devices(ctx)
	if err != nil {
		return info, err
	}
	for _, d := range devices {
		if _, domain, ok := strings.Cut(d.Name, "."); ok && domain != "" {
			info.Domain = domain
			break
		}
	}
	return info, nil
}

// response records what the server said to one call: the v2 client's errors carry neither
// the headers (Retry-After) nor, for non-JSON bodies, the status.
type response struct {
	mu         sync.Mutex
	status     int
	retryAfter string
}

type responseKey struct{}

func observe(ctx context.Context) (context.Context, *response) {
	r := new(response)
	return context.WithValue(ctx, responseKey{}, r), r
}

// wrap turns err, returned by the v2 client for the call r observed, into an *Error.
func (r *response) wrap(op string, err error) error {
	if e, ok := errors.AsType[*Error](err); ok {
		// Already classified, by the token source.
		e2 := *e
		e2.Op = op + ": " + e.Op
		return &e2
	}
	r.mu.Lock()
	status, retryAfter := r.status, parseRetryAfter(r.retryAfter, time.Now())
	r.mu.Unlock()
	e := &Error{Op: op, Status: status, RetryAfter: retryAfter}
	if apiErr, ok := errors.AsType[tsapi.APIError](err); ok {
		e.Status, e.Message = apiErr.Status, apiErr.Message
	}
	switch {
	case e.Status >= 400:
		e.Reason = reasonForStatus(e.Status, e.Message)
		if e.Message == "" {
			e.Message = http.StatusText(e.Status)
		}
	default:
		// No HTTP error: the request failed on the way, or the answer was unreadable.
		e.Reason, e.cause = ReasonUnavailable, err
	}
	return e
}

// observer sits under the OAuth transport: it records each response for wrap, logs the
// request line (never headers or bodies), and drops a token the API refused.
type observer struct {
	base           http.RoundTripper
	log            *slog.Logger
	onUnauthorized func(issuedBefore time.Time)
}

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	res, err := o.base.RoundTrip(req)
	if err != nil {
		o.log.Debug("tailnet API request failed", "method", req.Method, "path", req.URL.Path, "error", err)
		return nil, err
	}
	o.log.Debug("tailnet API request", "method", req.Method, "path", req.URL.Path, "status", res.StatusCode,
		"duration", time.Since(start))
	if r, ok := req.Context().Value(responseKey{}).(*response); ok {
		r.mu.Lock()
		r.status, r.retryAfter = res.StatusCode, res.Header.Get("Retry-After")
		r.mu.Unlock()
	}
	if res.StatusCode == http.StatusUnauthorized {
		o.onUnauthorized(start)
	}
	return res, nil
}
