package reliability

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

var nsCounter atomic.Int64

func newNamespace(prefix string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, nsCounter.Add(1))}}
	Expect(k8s.Create(context.Background(), ns)).To(Succeed())
	return ns.Name
}

func create(obj client.Object) client.Object {
	GinkgoHelper()
	Expect(k8s.Create(context.Background(), obj)).To(Succeed(), "creating %T %s", obj, obj.GetName())
	return obj
}

// echoService is the backend every Ingress of a namespace may route to: port http (80).
func echoService(ns, name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
}

func backend(svc string, port networkingv1.ServiceBackendPort) networkingv1.IngressBackend {
	return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svc, Port: port}}
}

var httpPort = networkingv1.ServiceBackendPort{Name: "http"}

// ingress is a standalone Ingress of class tailscale for tailnet name host, to Service echo.
func ingress(ns, name, host string, mutate ...func(*networkingv1.Ingress)) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{}},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("tailscale"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{host}}},
			DefaultBackend:   ptr.To(backend("echo", httpPort)),
		},
	}
	for _, m := range mutate {
		m(ing)
	}
	return ing
}

func annotate(kv ...string) func(*networkingv1.Ingress) {
	return func(i *networkingv1.Ingress) {
		for j := 0; j+1 < len(kv); j += 2 {
			i.Annotations[kv[j]] = kv[j+1]
		}
	}
}

func onGroup(pg string) func(*networkingv1.Ingress) {
	return annotate(kit.AnnotationProxyGroup, pg)
}

func withRule(host, path string, b networkingv1.IngressBackend) func(*networkingv1.Ingress) {
	return func(i *networkingv1.Ingress) {
		pt := networkingv1.PathTypePrefix
		i.Spec.Rules = append(i.Spec.Rules, networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{
			HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{Path: path, PathType: &pt, Backend: b}}}}})
	}
}

// withBYO adds a bring-your-own TLS entry for host with Secret secret.
func withBYO(host, secret string) func(*networkingv1.Ingress) {
	return func(i *networkingv1.Ingress) {
		i.Spec.TLS = append(i.Spec.TLS, networkingv1.IngressTLS{Hosts: []string{host}, SecretName: secret})
		withRule(host, "/", backend("echo", httpPort))(i)
	}
}

// lbService is a LoadBalancer Service of class tailscale.
func lbService(ns, name string, mutate ...func(*corev1.Service)) *corev1.Service {
	s := echoService(ns, name)
	s.Annotations = map[string]string{}
	s.Spec.Type = corev1.ServiceTypeLoadBalancer
	s.Spec.LoadBalancerClass = ptr.To(kit.LoadBalancerClass)
	for _, m := range mutate {
		m(s)
	}
	return s
}

func svcAnnotate(kv ...string) func(*corev1.Service) {
	return func(s *corev1.Service) {
		for j := 0; j+1 < len(kv); j += 2 {
			s.Annotations[kv[j]] = kv[j+1]
		}
	}
}

func proxyGroup(name string, typ tsv1alpha1.ProxyGroupType, mutate ...func(*tsv1alpha1.ProxyGroup)) *tsv1alpha1.ProxyGroup {
	pg := &tsv1alpha1.ProxyGroup{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: tsv1alpha1.ProxyGroupSpec{Type: typ, Replicas: ptr.To[int32](1)}}
	for _, m := range mutate {
		m(pg)
	}
	return pg
}

// warnings lists the reasons of the Warning Events about the object with uid.
func warnings(g Gomega, uid types.UID) []string {
	list := &eventsv1.EventList{}
	g.Expect(k8s.List(context.Background(), list)).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.UID == uid && e.Type == corev1.EventTypeWarning {
			out = append(out, e.Reason)
		}
	}
	return out
}

// conditionsOf reads the conditions of the objects that have them.
func conditionsOf(g Gomega, obj client.Object) []metav1.Condition {
	ctx := context.Background()
	key := client.ObjectKeyFromObject(obj)
	switch obj.(type) {
	case *corev1.Service:
		s := &corev1.Service{}
		g.Expect(k8s.Get(ctx, key, s)).To(Succeed())
		return s.Status.Conditions
	case *tsv1alpha1.ProxyGroup:
		pg := &tsv1alpha1.ProxyGroup{}
		g.Expect(k8s.Get(ctx, key, pg)).To(Succeed())
		return pg.Status.Conditions
	case *tsv1alpha1.ProxyClass:
		pc := &tsv1alpha1.ProxyClass{}
		g.Expect(k8s.Get(ctx, key, pc)).To(Succeed())
		return pc.Status.Conditions
	}
	return nil
}

// certificate makes a PEM certificate and key for hosts, valid from notBefore to notAfter.
func certificate(hosts []string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	privateKeys = append(privateKeys, string(keyPEM))
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM
}

// privateKeys are the TLS private keys the suite made, which no log or Event may show.
var privateKeys []string

func tlsSecret(ns, name string, typ corev1.SecretType, cert, key []byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: typ,
		Data: map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key}}
}

// pemBody is a line from the middle of a PEM block: found in a log, it shows the key leaked,
// whether the log quotes the PEM as text or escaped in JSON.
func pemBody(p string) string {
	lines := strings.Split(strings.TrimSpace(p), "\n")
	return lines[len(lines)/2]
}
