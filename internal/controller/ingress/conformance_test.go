package ingress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"tailscale.com/client/tailscale/apitype"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/proxy/web"
	"github.com/tsingress/tsingress/internal/testing/proxytest"
)

// The Ingress v1 conformance scenarios of kubernetes-sigs/ingress-controller-conformance (path
// rules, host rules, default backend, ingress class, load balancing), in the machine-readable
// form of shared/conformance/cases.json beside the repository (or TSINGRESS_CONFORMANCE_DIR),
// run against the operator's route builder and the proxy's web server. Each backend Service is
// a kube-proxy stand-in on a loopback "ClusterIP" in front of echo Pods on loopback addresses,
// with an EndpointSlice listing them, as a cluster has.
//
// Adaptations, because one tailnet name per Ingress is our model:
//   - A request host that is neither the tailnet name nor a bring-your-own host of the Ingress
//     is made the Ingress's tailnet name: the Ingress gets a first TLS entry for that host (how a
//     user names an Ingress's device), and the request goes to the tailnet name
//     (<host's first label>.<tailnet domain>), which is then the host the backend must see.
//   - Port 80 is opt-in: every Ingress gets tailscale.com/http-redirect: "true", and the client
//     follows the redirect to HTTPS, as the upstream harness follows a 3xx to the same address
//     with the Location's host and path.
//   - The Ingress "status shows an address" when the operator takes the Ingress (its class)
//     and it has routes: the proxy's tailnet login is not part of this test.
func TestIngressConformance(t *testing.T) {
	dir := conformanceDir()
	if dir == "" {
		t.Skip("the conformance scenarios (shared/conformance/cases.json) are not beside this repository; set TSINGRESS_CONFORMANCE_DIR to run them")
	}
	raw, err := os.ReadFile(filepath.Join(dir, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Source struct {
			Repository, Commit string
		}
		Cases []conformanceCase
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("cases.json: %v", err)
	}
	if len(doc.Cases) == 0 {
		t.Fatal("cases.json holds no scenarios")
	}
	ips := &loopbackIPs{}
	passed := 0
	for _, c := range doc.Cases {
		if t.Run(c.ID, func(t *testing.T) { runConformanceCase(t, c, ips) }) {
			passed++
		}
	}
	t.Logf("conformance (%s@%.12s): %d/%d scenarios pass", doc.Source.Repository, doc.Source.Commit, passed, len(doc.Cases))
}

// conformanceDir finds the scenarios: TSINGRESS_CONFORMANCE_DIR, else shared/conformance in
// a directory above the working directory.
func conformanceDir() string {
	if d := os.Getenv("TSINGRESS_CONFORMANCE_DIR"); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "shared", "conformance", "cases.json")); err == nil {
			return filepath.Join(d, "shared", "conformance")
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

type conformanceCase struct {
	ID         string               `json:"id"`
	Scenario   string               `json:"scenario"`
	Ingress    networkingv1.Ingress `json:"ingress"`
	TLSSecrets []struct {
		Name  string
		Hosts []string
	} `json:"tls_secrets"`
	Replicas map[string]int `json:"backend_replicas"`
	Request  *struct {
		Method, Scheme, Host, Path string
		Count                      int
	} `json:"request"`
	Expect struct {
		StatusAddress   bool              `json:"ingress_status_address"`
		Status          int               `json:"status"`
		Service         string            `json:"service"`
		ResponseProto   string            `json:"response_proto"`
		ResponseHeaders map[string]string `json:"response_headers"`
		RequestMethod   string            `json:"request_method"`
		RequestPath     string            `json:"request_path"`
		RequestProto    string            `json:"request_proto"`
		RequestHeaders  map[string]string `json:"request_headers"`
		RequestHost     string            `json:"request_host"`
		TLSHostname     string            `json:"tls_verify_hostname"`
		DistinctPods    int               `json:"distinct_pods"`
	} `json:"expect"`
	ClassDefaulted bool `json:"ingress_class_defaulted"`
}

const conformanceDomain = "conformance.ts.net"

func runConformanceCase(t *testing.T, c conformanceCase, ips *loopbackIPs) {
	t.Logf("%s", c.Scenario)
	ing := c.Ingress.DeepCopy()
	ing.Namespace = "conformance"
	if c.ClassDefaulted {
		ing.Spec.IngressClassName = ptr.To("tailscale")
	}
	if ing.Annotations == nil {
		ing.Annotations = map[string]string{}
	}
	ing.Annotations[kit.AnnotationHTTPRedirect] = "true"

	// The request host, adapted to the tailnet name when it is not a host of its own.
	reqHost, wantHost := "", c.Expect.RequestHost
	if c.Request != nil && c.Request.Host != "" {
		reqHost = c.Request.Host
		if !servedCustomHost(ing, reqHost) {
			ing.Spec.TLS = append([]networkingv1.IngressTLS{{Hosts: []string{reqHost}}}, ing.Spec.TLS...)
			reqHost = kit.IngressHostname(ing) + "." + conformanceDomain
			if wantHost == c.Request.Host {
				wantHost = reqHost
			}
		}
	}

	in := RouteInputs{Services: map[string]*corev1.Service{}, Slices: map[string][]discoveryv1.EndpointSlice{}, Domain: conformanceDomain}
	for _, name := range backendServiceNames(ing) {
		if in.Services[name] == nil {
			in.Services[name], in.Slices[name] = startConformanceService(t, ips, name, max(1, c.Replicas[name]))
		}
	}
	ws, findings := BuildWebService(ing, in)
	byo, err := certs.CertSecrets{API: secretsOf(t, c), Now: time.Now, Watches: unwatched{}}.
		Resolve(t.Context(), ing, "conformance", "tailscale", nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.TLS.Certificates = byo.Refs
	for _, f := range append(findings, byo.Findings...) {
		t.Logf("finding: %s %s", f.Reason, f.Message)
	}

	r := &IngressReconciler{Settings: kit.Settings{IngressClassName: "tailscale"}}
	exposed := r.serves(ing) && len(ws.Routes) > 0
	if exposed != c.Expect.StatusAddress {
		t.Fatalf("the Ingress would be exposed: %v, want %v", exposed, c.Expect.StatusAddress)
	}
	if c.Request == nil {
		return
	}
	if !exposed {
		t.Fatal("a request is expected, but the Ingress is not exposed")
	}
	if err := ws.Validate(); err != nil {
		t.Fatalf("the built config does not validate: %v", err)
	}

	srv := startConformanceProxy(t, ws, kit.IngressHostname(ing)+"."+conformanceDomain, byo.Copies)
	pods := map[string]bool{}
	for range c.Request.Count {
		resp, reply, err := srv.do(c.Request.Method, c.Request.Scheme, reqHost, c.Request.Path, c.Expect.TLSHostname) //nolint:bodyclose // closed inside do
		if err != nil {
			t.Fatal(err)
		}
		checkConformanceResponse(t, c, resp, reply, wantHost)
		if t.Failed() {
			return
		}
		if reply != nil {
			pods[reply.PodAddr] = true
		}
	}
	if c.Expect.DistinctPods > 0 && len(pods) != c.Expect.DistinctPods {
		t.Errorf("%d requests reached %d pods, want %d", c.Request.Count, len(pods), c.Expect.DistinctPods)
	}
}

func checkConformanceResponse(t *testing.T, c conformanceCase, resp *http.Response, reply *proxytest.EchoReply, wantHost string) {
	t.Helper()
	e := c.Expect
	if resp.StatusCode != e.Status {
		t.Errorf("status %d, want %d", resp.StatusCode, e.Status)
	}
	match := func(what, got, want string) {
		if want != "" && want != "*" && got != want {
			t.Errorf("%s %q, want %q", what, got, want)
		}
	}
	if e.Service != "" || e.RequestMethod != "" || e.DistinctPods > 0 {
		if reply == nil {
			t.Fatalf("no echo reply (status %d)", resp.StatusCode)
		}
		match("served by", reply.Service, e.Service)
		match("request method", reply.Method, e.RequestMethod)
		match("request path", reply.Path, e.RequestPath)
		match("request proto", reply.Proto, e.RequestProto)
		match("request host", reply.Host, wantHost)
		for k, want := range e.RequestHeaders {
			if got, ok := reply.Headers[http.CanonicalHeaderKey(k)]; !ok {
				t.Errorf("the backend saw no %s header", k)
			} else {
				match("request header "+k, strings.Join(got, ","), want)
			}
		}
	}
	match("response proto", resp.Proto, e.ResponseProto)
	for k, want := range e.ResponseHeaders {
		if got, ok := resp.Header[http.CanonicalHeaderKey(k)]; !ok {
			t.Errorf("the response has no %s header (headers %v)", k, resp.Header)
		} else {
			match("response header "+k, strings.Join(got, ","), want)
		}
	}
}

// servedCustomHost reports whether host is a bring-your-own host of the Ingress, or covered
// by a bring-your-own wildcard.
func servedCustomHost(ing *networkingv1.Ingress, host string) bool {
	custom := certs.BYOHosts(ing)
	h := strings.ToLower(host)
	return custom[h] || custom["*."+parentDomain(h)]
}

// loopbackIPs hands out loopback addresses, from a block of 127/8 chosen per process so that
// parallel runs rarely meet; an address whose port is taken is skipped.
type loopbackIPs struct {
	mu   sync.Mutex
	base [2]byte
	next int
}

func (l *loopbackIPs) listen(port int) (net.Listener, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.base == [2]byte{} {
		l.base = [2]byte{byte(64 + time.Now().UnixNano()%180), byte(os.Getpid() % 250)}
	}
	var err error
	for range 100 {
		l.next++
		ip := net.IPv4(127, l.base[0], l.base[1]+byte(l.next/250), byte(1+l.next%250))
		var ln net.Listener
		if ln, err = net.Listen("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(port))); err == nil {
			return ln, nil
		}
	}
	return nil, err
}

// startConformanceService starts a Service of n echo Pods: a kube-proxy stand-in on its
// ClusterIP, port 8080 (named http, as the harness names it), and the EndpointSlice of its Pods.
func startConformanceService(t *testing.T, ips *loopbackIPs, name string, n int) (*corev1.Service, []discoveryv1.EndpointSlice) {
	t.Helper()
	slice := discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-abcde", Namespace: "conformance", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	var podAddrs []string
	for i := range n {
		ln, err := ips.listen(8080)
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		pod, err := proxytest.StartEchoPod(t, name, fmt.Sprintf("%s-%d", name, i), addr)
		if err != nil {
			t.Fatal(err)
		}
		podAddrs = append(podAddrs, pod.Addr)
		host, _, _ := net.SplitHostPort(pod.Addr)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{host},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	ln, err := ips.listen(8080)
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cip, err := proxytest.StartClusterIP(t, addr, podAddrs)
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(cip.Addr)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "conformance"}, Spec: corev1.ServiceSpec{
		ClusterIP: host,
		Ports:     []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
	}}
	return svc, []discoveryv1.EndpointSlice{slice}
}

// conformanceProxy is the proxy's web server on loopback listeners, with the tailnet name's
// certificate and the bring-your-own ones.
type conformanceProxy struct {
	https, http string
}

func startConformanceProxy(t *testing.T, ws contract.WebService, tailnetName string, copies []*corev1.Secret) *conformanceProxy {
	t.Helper()
	p := &conformanceProxy{}
	var mu sync.Mutex
	listen := func(_, addr string) (net.Listener, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			mu.Lock()
			if addr == ":80" {
				p.http = ln.Addr().String()
			} else {
				p.https = ln.Addr().String()
			}
			mu.Unlock()
		}
		return ln, err
	}
	srv := web.NewServer(web.Config{Listen: listen, Logger: slog.New(slog.DiscardHandler),
		WhoIs: func(context.Context, string) (*apitype.WhoIsResponse, error) {
			return nil, errors.New("not a tailnet peer")
		}})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("stopping the conformance proxy: %v", err)
		}
	})
	certPEM, keyPEM := proxytest.SelfSigned(t, []string{tailnetName}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetName(tailnetName)
	srv.SetCertificate(&pair)
	hosts := map[string]*tls.Certificate{}
	for _, ref := range ws.TLS.Certificates {
		for _, cp := range copies {
			if cp.Name != ref.SecretName {
				continue
			}
			pair, err := tls.X509KeyPair(cp.Data[corev1.TLSCertKey], cp.Data[corev1.TLSPrivateKeyKey])
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range ref.Hosts {
				hosts[h] = &pair
			}
		}
	}
	srv.SetHostCertificates(hosts)
	if err := srv.Apply(ws); err != nil {
		t.Fatal(err)
	}
	return p
}

// do sends a request as the upstream harness does: a new client each time, TLS unverified but
// for an explicit hostname check, Host (and SNI) set to host, and a redirect followed to the
// same proxy with the Location's host and path; a 301, 302 or 303 turns a request other than
// GET or HEAD into a GET, as clients do, and a 307 or 308 keeps it. An empty host is the address
// itself, as a client connecting by IP sends.
func (p *conformanceProxy) do(method, scheme, host, path, verifyName string) (*http.Response, *proxytest.EchoReply, error) {
	body := ""
	if method != http.MethodGet && method != http.MethodHead {
		body = "conformance request body"
	}
	for range 5 {
		addr := p.http
		if scheme == "https" {
			addr = p.https
		}
		var verifyErr error
		tr := &http.Transport{
			DisableCompression: true,
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			},
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: host,
				VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
					if verifyName == "" {
						return nil
					}
					leaf, err := x509.ParseCertificate(raw[0])
					if err == nil {
						err = leaf.VerifyHostname(verifyName)
					}
					verifyErr = err
					return err
				}},
		}
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		target := host
		if target == "" {
			target = addr
		}
		req, err := http.NewRequest(method, scheme+"://"+target+path, strings.NewReader(body))
		if err != nil {
			return nil, nil, err
		}
		if body == "" {
			req.Body, req.ContentLength = nil, 0
		}
		resp, err := c.Do(req)
		tr.CloseIdleConnections()
		if err != nil {
			if verifyErr != nil {
				return nil, nil, fmt.Errorf("the certificate is not for %s: %w", verifyName, verifyErr)
			}
			return nil, nil, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, nil, err
		}
		switch resp.StatusCode {
		case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			loc, err := url.Parse(resp.Header.Get("Location"))
			if err != nil {
				return nil, nil, fmt.Errorf("redirect to %q: %w", resp.Header.Get("Location"), err)
			}
			scheme, host, path = loc.Scheme, loc.Host, loc.RequestURI()
			if resp.StatusCode < http.StatusTemporaryRedirect && method != http.MethodHead {
				method, body = http.MethodGet, ""
			}
			continue
		}
		if resp.StatusCode != http.StatusOK {
			return resp, nil, nil
		}
		var reply proxytest.EchoReply
		if err := json.Unmarshal(b, &reply); err != nil {
			return resp, nil, fmt.Errorf("not an echo reply (%d): %q", resp.StatusCode, b)
		}
		return resp, &reply, nil
	}
	return nil, nil, errors.New("more than 5 redirects")
}

// secretsOf holds the self-signed TLS Secrets a scenario creates, for the operator's reading of
// bring-your-own certificates.
func secretsOf(t *testing.T, c conformanceCase) secretReader {
	r := secretReader{}
	for _, s := range c.TLSSecrets {
		certPEM, keyPEM := proxytest.SelfSigned(t, s.Hosts, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
		r[s.Name] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: "conformance"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
	}
	return r
}

// secretReader is a client.Reader of Secrets in one namespace.
type secretReader map[string]*corev1.Secret

func (r secretReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	s, ok := r[key.Name]
	if !ok || key.Namespace != "conformance" {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, key.Name)
	}
	s.DeepCopyInto(obj.(*corev1.Secret))
	return nil
}

func (r secretReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("not listed")
}

// unwatched stands for the operator's watch of TLS Secrets, which a single pass does not need.
type unwatched struct{}

func (unwatched) Watch(context.Context, string) error { return nil }
func (unwatched) Forget(context.Context, string)      {}
