package contract

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// PathType is how a route's path matches a request path, as networking.k8s.io/v1 defines it.
type PathType string

const (
	// PathExact matches the path exactly (case-sensitive).
	PathExact PathType = "Exact"
	// PathPrefix matches on whole path elements: /foo matches /foo and /foo/bar, not /foobar.
	PathPrefix PathType = "Prefix"
)

// HTTPMode says what a web service does on plain HTTP (port 80).
type HTTPMode string

const (
	HTTPOff      HTTPMode = ""         // no port 80
	HTTPRedirect HTTPMode = "redirect" // 301 to the same URL on https
	HTTPServe    HTTPMode = "serve"    // serve the same routes over plain HTTP too
)

// WebService is the Serve config of one name: HTTPS on 443 with routes to backends.
type WebService struct {
	// HTTP is what port 80 does.
	HTTP HTTPMode `json:"http,omitempty"`
	// Routes, matched most specific first: exact matches, then the longest prefix.
	Routes []Route `json:"routes"`
}

// Route sends requests whose path matches to a backend. The request path is passed on
// unchanged, as Kubernetes Ingress semantics require.
type Route struct {
	Path     string   `json:"path"`
	PathType PathType `json:"pathType"`
	Backend  Backend  `json:"backend"`
}

// Backend is an upstream HTTP server, normally a Service's ClusterIP and port.
type Backend struct {
	// URL is scheme://host:port with scheme http or https.
	URL string `json:"url"`
	// InsecureSkipVerify accepts any certificate from an https backend: in-cluster backends
	// rarely have certificates for their ClusterIP.
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// Validate checks the web service's routes.
func (w *WebService) Validate() error {
	var errs []error
	switch w.HTTP {
	case HTTPOff, HTTPRedirect, HTTPServe:
	default:
		errs = append(errs, fmt.Errorf("http mode %q must be empty, redirect or serve", w.HTTP))
	}
	if len(w.Routes) == 0 {
		errs = append(errs, errors.New("no routes"))
	}
	seen := map[string]bool{}
	for _, r := range w.Routes {
		key := string(r.PathType) + " " + r.Path
		if seen[key] {
			errs = append(errs, fmt.Errorf("route %s %s appears twice", r.PathType, r.Path))
		}
		seen[key] = true
		if err := r.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Validate checks one route.
func (r *Route) Validate() error {
	if !strings.HasPrefix(r.Path, "/") {
		return fmt.Errorf("route path %q must start with /", r.Path)
	}
	if r.PathType != PathExact && r.PathType != PathPrefix {
		return fmt.Errorf("route %s: path type %q must be Exact or Prefix", r.Path, r.PathType)
	}
	u, err := url.Parse(r.Backend.URL)
	if err != nil {
		return fmt.Errorf("route %s: backend URL: %w", r.Path, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("route %s: backend URL %q must be http(s)://host:port", r.Path, r.Backend.URL)
	}
	return nil
}

// ServeConfig is a ProxyGroup's L7 document in its ConfigMap: the web services of every
// Ingress on the group, keyed by Tailscale Service name ("svc:<label>"). A replica serves a
// service on the service's MagicDNS name, <label>.<tailnet domain>.
type ServeConfig struct {
	Version  int                   `json:"version"`
	Services map[string]WebService `json:"services"`
}

// Validate checks every service.
func (s *ServeConfig) Validate() error {
	var errs []error
	for name, svc := range s.Services {
		if !ValidServiceName(name) {
			errs = append(errs, fmt.Errorf("service name %q must look like svc:name", name))
		}
		if err := svc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// ServeConfigs stores ServeConfig documents.
var ServeConfigs = codec[ServeConfig]{
	name: "serve-config",
	encode: map[int]func(*ServeConfig) ([]byte, error){
		1: jsonEncoder(1, func(c *ServeConfig, v int) { c.Version = v }),
	},
	decode: map[int]func([]byte) (*ServeConfig, error){
		1: jsonDecoder(1, func(c *ServeConfig) int { return c.Version }, (*ServeConfig).Validate),
	},
}
