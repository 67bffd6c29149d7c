package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
	"tailscale.com/tsnet"

	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/testing/localtailnet"
)

// demo is one tailnet-facing object of the samples: how it is served, and what proved it.
type demo struct {
	kind string        // L7, L3 or HA
	obj  client.Object // the Ingress or Service
	skip string        // why it is not proved here

	fqdn   string
	ip     netip.Addr // L3: the proxy's tailnet IPv4
	proof  string
	issuer string
}

func (d *demo) String() string {
	return fmt.Sprintf("%s %s %s/%s", d.kind, kindOf(d.obj), d.obj.GetNamespace(), d.obj.GetName())
}

func kindOf(o client.Object) string {
	if _, ok := o.(*corev1.Service); ok {
		return "Service"
	}
	return "Ingress"
}

// loadSamples reads the objects of a kustomization's resources (plain files only).
func loadSamples(dir string, scheme *runtime.Scheme) ([]client.Object, error) {
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	decode := serializer.NewCodecFactory(scheme).UniversalDeserializer().Decode
	var objs []client.Object
	for _, res := range k.Resources {
		f, err := os.Open(filepath.Join(dir, res))
		if err != nil {
			return nil, err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(f))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				_ = f.Close()
				return nil, fmt.Errorf("%s: %w", res, err)
			}
			if len(strings.TrimSpace(string(doc))) == 0 {
				continue
			}
			obj, _, err := decode(doc, nil, nil)
			if err != nil {
				_ = f.Close()
				return nil, fmt.Errorf("%s: %w", res, err)
			}
			objs = append(objs, obj.(client.Object))
		}
		_ = f.Close() // read to the end: closing it reports nothing of use
	}
	return objs, nil
}

// installSamples creates config/samples as far as they can run here, and returns what they
// serve on the tailnet and notes on what was changed. Ingress backends become ExternalName
// Services for the loopback backend at backendPort: L7 proxies run in devenv's own network
// namespace, where no ClusterIP leads anywhere.
func installSamples(ctx context.Context, k8s client.Client, objs []client.Object, backendPort int, noL3 string) ([]*demo, []string, error) {
	var demos []*demo
	var notes []string
	for _, obj := range objs {
		ref := fmt.Sprintf("%s/%s", obj.GetNamespace(), obj.GetName())
		switch o := obj.(type) {
		case *appsv1.Deployment:
			notes = append(notes, fmt.Sprintf("Deployment %s not run (no kubelet for workloads): in-process backends stand in for its Pods", ref))
			continue
		case *corev1.Service:
			if exposed(o) {
				d := &demo{kind: "L3", obj: o, skip: noL3}
				demos = append(demos, d)
				break
			}
			o.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost", Ports: backendPorts(o.Spec.Ports, backendPort)}
			notes = append(notes, fmt.Sprintf("Service %s is an ExternalName for the loopback backend (port %d)", ref, backendPort))
		case *networkingv1.Ingress:
			kind := "L7"
			if o.Annotations[kit.AnnotationProxyGroup] != "" {
				kind = "HA"
			}
			demos = append(demos, &demo{kind: kind, obj: o})
		}
		if err := k8s.Create(ctx, obj); err != nil {
			return nil, nil, fmt.Errorf("creating %T %s: %w", obj, ref, err)
		}
	}
	return demos, notes, nil
}

func exposed(svc *corev1.Service) bool {
	lb := svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.LoadBalancerClass != nil && *svc.Spec.LoadBalancerClass == kit.LoadBalancerClass
	return lb || svc.Annotations[kit.AnnotationExpose] == "true"
}

// backendPorts keeps the names of a Service's TCP ports, all at the loopback backend's port.
func backendPorts(ports []corev1.ServicePort, port int) []corev1.ServicePort {
	var out []corev1.ServicePort
	for _, p := range ports {
		if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
			out = append(out, corev1.ServicePort{Name: p.Name, Port: int32(port)})
		}
	}
	return out
}

// waitServed waits until the operator reports the object served: an Ingress with its tailnet
// name, an L3 Service ready with its name and addresses.
func waitServed(ctx context.Context, k8s client.Client, d *demo) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	last := "not reported yet"
	for {
		switch o := d.obj.(type) {
		case *networkingv1.Ingress:
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(o), o); err == nil {
				if lb := o.Status.LoadBalancer.Ingress; len(lb) > 0 && lb[0].Hostname != "" {
					d.fqdn = lb[0].Hostname
					return nil
				}
			}
		case *corev1.Service:
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(o), o); err == nil {
				c := meta.FindStatusCondition(o.Status.Conditions, kit.ConditionProxyReady)
				if c != nil {
					last = fmt.Sprintf("%s: %s", c.Reason, c.Message)
				}
				if c != nil && c.Status == metav1.ConditionTrue {
					for i, in := range o.Status.LoadBalancer.Ingress {
						if i == 0 {
							d.fqdn = in.Hostname
						} else if ip, err := netip.ParseAddr(in.IP); err == nil && ip.Is4() {
							d.ip = ip
						}
					}
					if d.fqdn != "" && d.ip.IsValid() {
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return ctx.Err()
			}
			return fmt.Errorf("%s was not served within 2 minutes (%s; see the logs, or run with -v)", d, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// joinClient joins a person's device to the local tailnet.
func joinClient(ctx context.Context, lt *localtailnet.LocalTailnet, dir string) (*tsnet.Server, error) {
	cl := &tsnet.Server{Dir: dir, Hostname: "your-laptop", ControlURL: lt.ControlURL, Ephemeral: true,
		AuthKey: lt.MintUserKey("you@example.com", "You").Reveal(), UserLogf: func(string, ...any) {}}
	upCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cl.Up(upCtx); err != nil {
		_ = cl.Close()
		return nil, err
	}
	return cl, nil
}

// prove reaches the object from the tailnet client: over HTTPS, trusting roots (L7, HA),
// over TCP and UDP at the tailnet IP (L3). Paths take a moment to settle, so it tries again
// for a while.
func prove(ctx context.Context, cl *tsnet.Server, roots *x509.CertPool, d *demo) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var err error
	for {
		if d.kind == "L3" {
			err = proveL3(ctx, cl, d)
		} else {
			err = proveHTTPS(ctx, cl, roots, d)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s at %s: %w", d, d.fqdn, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func proveHTTPS(ctx context.Context, cl *tsnet.Server, roots *x509.CertPool, d *demo) error {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: cl.Dial, TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	body, tlsState, err := get(ctx, hc, "https://"+d.fqdn+"/")
	if err != nil {
		return err
	}
	d.proof = body
	d.issuer = tlsState.PeerCertificates[0].Issuer.String()
	return nil
}

func proveL3(ctx context.Context, cl *tsnet.Server, d *demo) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: cl.Dial}}
	defer hc.CloseIdleConnections()
	body, _, err := get(ctx, hc, fmt.Sprintf("http://%s:%d/", d.ip, backendTCPPort))
	if err != nil {
		return err
	}
	c, err := cl.Dial(ctx, "udp", netip.AddrPortFrom(d.ip, backendUDPPort).String())
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second)) //nolint:errcheck // a read error follows
	want := rand.Text()
	if _, err := fmt.Fprintf(c, "echo %s", want); err != nil {
		return err
	}
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	if err != nil {
		return fmt.Errorf("UDP %d: %w", backendUDPPort, err)
	}
	if got := string(buf[:n]); got != want {
		return fmt.Errorf("UDP %d echoed %q, want %q", backendUDPPort, got, want)
	}
	d.proof = fmt.Sprintf("TCP %d: %q; UDP %d: echoed", backendTCPPort, body, backendUDPPort)
	return nil
}

// get returns the body of a 200 response to GET url, and its TLS connection state (nil over HTTP).
func get(ctx context.Context, hc *http.Client, url string) (string, *tls.ConnectionState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return "", nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(b)), resp.TLS, nil
}

// loopbackBackend serves the demo backend on 127.0.0.1, for the L7 proxies.
func loopbackBackend() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go http.Serve(ln, backendHandler("hello (loopback stand-in)")) //nolint:errcheck // ends with its listener
	return ln, nil
}
