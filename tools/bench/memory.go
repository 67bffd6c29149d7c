package main

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
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// memoryResult is an operator's resident memory as unrelated objects are added to the cluster.
type memoryResult struct {
	name                      string
	empty, unrelated, withTLS int64 // bytes
}

// measureMemory runs the operators (the one under test and, if given, a baseline) side by side
// against one cluster, and samples their memory empty, with 10,000 unrelated Secrets, 4,000
// Services and 2,000 ConfigMaps, then with 2,000 unrelated kubernetes.io/tls Secrets as well.
// None of these objects is served, so the operators only cache what they watch.
func measureMemory(ctx context.Context, bins map[string]string, logf func(string, ...any)) ([]memoryResult, error) {
	var first string
	for _, name := range slices.Sorted(mapsKeys(bins)) {
		first = name
		break
	}
	c, err := startCluster(ctx, bins[first], "/tmp/bench-memory-"+first+".log")
	if err != nil {
		return nil, err
	}
	defer c.close()
	// The other operators run against the same cluster, each in its own process.
	procs := map[string]*cluster{first: c}
	for name, bin := range bins {
		if name == first {
			continue
		}
		other := &cluster{cp: nil}
		other.operator = exec.Command(bin, c.operator.Args[1:]...)
		other.operator.Env = c.operator.Env
		out, err := os.Create("/tmp/bench-memory-" + name + ".log")
		if err != nil {
			return nil, err
		}
		other.operator.Stdout, other.operator.Stderr = out, out
		if err := other.operator.Start(); err != nil {
			return nil, err
		}
		defer func() { _ = other.operator.Process.Kill(); _ = other.operator.Wait() }() // "signal: killed", as meant
		procs[name] = other
	}
	res := map[string]*memoryResult{}
	for name := range procs {
		res[name] = &memoryResult{name: name}
	}
	sample := func(stage string, set func(*memoryResult, int64)) error {
		time.Sleep(20 * time.Second) // caches filled, the garbage collector caught up
		for name, p := range procs {
			var rs []int64
			for range 5 {
				r, err := p.rss()
				if err != nil {
					return err
				}
				rs = append(rs, r)
				time.Sleep(2 * time.Second)
			}
			slices.Sort(rs)
			set(res[name], rs[len(rs)/2])
			logf("memory: %s, %s: %d MiB", name, stage, rs[len(rs)/2]>>20)
		}
		return nil
	}
	if err := sample("empty", func(r *memoryResult, v int64) { r.empty = v }); err != nil {
		return nil, err
	}
	k := c.k8s
	if err := k.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "noise"}}); err != nil {
		return nil, err
	}
	blob := strings.Repeat("x", 1024)
	if err := parallel(16000, 16, func(i int) error {
		switch {
		case i < 10000:
			return k.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "noise", Name: fmt.Sprintf("s-%05d", i)},
				StringData: map[string]string{"value": blob}})
		case i < 14000:
			return k.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "noise", Name: fmt.Sprintf("svc-%05d", i)},
				Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.test",
					Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}})
		default:
			return k.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "noise", Name: fmt.Sprintf("cm-%05d", i)},
				Data: map[string]string{"value": blob}})
		}
	}); err != nil {
		return nil, err
	}
	if err := sample("10,000 Secrets, 4,000 Services, 2,000 ConfigMaps", func(r *memoryResult, v int64) { r.unrelated = v }); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := selfSigned()
	if err != nil {
		return nil, err
	}
	if err := parallel(2000, 16, func(i int) error {
		return k.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "noise", Name: fmt.Sprintf("tls-%05d", i)},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}})
	}); err != nil {
		return nil, err
	}
	if err := sample("and 2,000 TLS Secrets", func(r *memoryResult, v int64) { r.withTLS = v }); err != nil {
		return nil, err
	}
	var out []memoryResult
	for _, name := range sortedKeys(res) {
		out = append(out, *res[name])
	}
	return out, nil
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// selfSigned is a certificate chain and key of the size real ones have.
func selfSigned() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "unrelated.example.test"},
		DNSNames: []string{"unrelated.example.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	leaf := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	// A chain of three, as a CA's certificates come.
	return slices.Concat(leaf, leaf, leaf), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
