// Package secretstore keeps a proxy's tailnet identity and its reported state in one Kubernetes
// Secret, through the API (client-go), so it works in a Pod and from a kubeconfig alike.
//
// The tailnet client's keys are stored under a "ts." prefix: contract keys (State*, the config
// keys) never start with it, so the two can never collide, and an operator can tell them
// apart. Every write is a JSON merge patch of the keys it changes, never a whole-object update,
// so the operator's keys and the proxy's never overwrite each other.
//
// The Store also keeps certificates the way tailscaled's certificate flow asks for them when it
// runs in Kubernetes (feature/acme's TLSCertKeyReader and TLSCertKeyWriter): a certificate and
// its key in one write. A shared certificate (a ProxyGroup's, see ShareCert) goes to a
// kubernetes.io/tls Secret of its own instead of the state Secret.
package secretstore

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"tailscale.com/ipn"

	"github.com/tsingress/tsingress/internal/contract"
)

// writeTimeout bounds a write that tailscale makes without a context.
const writeTimeout = 10 * time.Second

// Store is an ipn.StateStore over a Secret, plus Report for the proxy's own state keys.
// The Secret must exist: the operator creates it.
type Store struct {
	secrets corev1client.SecretInterface
	name    string

	writeMu sync.Mutex // keeps writes in order, without holding up reads

	reportMu sync.Mutex          // one report written at a time
	reported []map[string][]byte // each shard's keys as last written; nil where unknown

	mu     sync.Mutex
	cache  map[string][]byte // the tailnet client's keys as stored (prefixed); this Store is their only writer
	shared map[string]string // certificate domain → Secret that holds its certificate

	reportShards int // Secrets the report is spread over (0: one)
}

var _ ipn.StateStore = (*Store)(nil)

// New reads the Secret once; tailscale's reads are then served from memory.
func New(ctx context.Context, secrets corev1client.SecretInterface, name string) (*Store, error) {
	sec, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("state Secret %s does not exist (the operator creates it)", name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading state Secret %s: %w", name, err)
	}
	s := &Store{secrets: secrets, name: name, cache: map[string][]byte{}}
	for k, v := range sec.Data {
		if isTailscaleKey(k) {
			s.cache[k] = v
		}
	}
	return s, nil
}

// ReadState implements ipn.StateStore.
func (s *Store) ReadState(id ipn.StateKey) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.cache[SecretKey(id)]
	if !ok {
		return nil, ipn.ErrStateNotExist
	}
	return v, nil
}

// WriteState implements ipn.StateStore; nil deletes the key.
func (s *Store) WriteState(id ipn.StateKey, bs []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	key := SecretKey(id)
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.patch(ctx, s.name, map[string][]byte{key: bs}); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if bs == nil {
		delete(s.cache, key)
	} else {
		s.cache[key] = bs
	}
	return nil
}

// Report sets the given keys (the contract's State* keys); a nil or empty value removes its key.
// A ProxyGroup replica's report is spread over the Secrets of its shards (SetReportShards,
// contract.SplitReport): only the keys that changed since the last write are sent, so a change
// of one service writes one shard. Shards the count adds are written first and those it takes
// entries from last, with the state Secret, which holds the index, between them: a reader never
// sees a count without the entries of its shards. Without the Secrets of the shards (not
// created yet, or by an operator that does not make them) the report is written whole in the
// state Secret, as before shards, and Report still fails, so that it is called again.
func (s *Store) Report(ctx context.Context, data map[string][]byte) error {
	for k := range data {
		if isTailscaleKey(k) {
			return fmt.Errorf("key %q is reserved for the tailnet client", k)
		}
	}
	s.reportMu.Lock()
	defer s.reportMu.Unlock()
	shards, err := contract.SplitReport(data, s.shardCount())
	if err != nil {
		return err
	}
	err = s.writeShards(ctx, shards)
	if len(shards) > 1 && (apierrors.IsNotFound(err) || apierrors.IsForbidden(err)) {
		whole, _ := contract.SplitReport(data, 1)
		if werr := s.writeShards(ctx, whole); werr != nil {
			return werr
		}
		// Still an error, so that the caller tries the shards again.
		return fmt.Errorf("%w until the Secrets of its shards can be written: %w", ErrWrittenWhole, err)
	}
	return err
}

// ErrWrittenWhole says that Report wrote the report, but whole, in the state Secret.
var ErrWrittenWhole = errors.New("the report is written whole in the state Secret")

// SetReportShards sets the number of Secrets the report is spread over, and reports whether
// it changed.
func (s *Store) SetReportShards(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := max(n, 1) != max(s.reportShards, 1)
	s.reportShards = n
	return changed
}

// shardCount is the number of Secrets the report is spread over.
func (s *Store) shardCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.reportShards, 1)
}

// writeShards writes what changed in each shard, in the order Report gives.
func (s *Store) writeShards(ctx context.Context, shards []map[string][]byte) error {
	prev := len(s.reported)
	var phases [][]int
	if prev > 0 && len(shards) > prev {
		phases = [][]int{seq(prev, len(shards)), {0}, seq(1, prev)}
	} else {
		phases = [][]int{seq(1, len(shards)), {0}}
	}
	written := make([]map[string][]byte, len(shards))
	copy(written, s.reported)
	defer func() { s.reported = written }()
	for _, phase := range phases {
		errs := make([]error, len(phase))
		var wg sync.WaitGroup
		for j, k := range phase {
			var last map[string][]byte
			if k < prev {
				last = s.reported[k]
			}
			changed := changedKeys(last, shards[k])
			if len(changed) == 0 {
				continue
			}
			written[k] = nil // unknown until the write succeeds
			wg.Go(func() {
				if errs[j] = s.patch(ctx, contract.ReportShardName(s.name, k), changed); errs[j] == nil {
					written[k] = shards[k]
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return nil
}

// changedKeys is what of data differs from last (all of it when last is unknown); empty values
// stay nil, which removes their keys.
func changedKeys(last, data map[string][]byte) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range data {
		if len(v) == 0 {
			v = nil
		}
		if old, ok := last[k]; last == nil || !ok || !bytes.Equal(old, v) {
			out[k] = v
		}
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// ShareCert keeps the certificate of domain in the kubernetes.io/tls Secret named secret (keys
// tls.crt and tls.key), which must exist, instead of the state Secret: tailscaled then reads
// its cached certificate from there and writes what it issues or renews there, for the other
// replicas of a ProxyGroup to load. The ACME account key stays in the state Secret.
func (s *Store) ShareCert(domain, secret string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shared == nil {
		s.shared = map[string]string{}
	}
	s.shared[domain] = secret
}

// UnshareCert undoes ShareCert.
func (s *Store) UnshareCert(domain string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.shared, domain)
}

func (s *Store) sharedSecret(domain string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shared[domain]
}

// ReadTLSCertAndKey returns the cached certificate and key of domain (PEM), or
// ipn.ErrStateNotExist. A shared certificate is read from its Secret each time, so that
// tailscaled renews what the other replicas serve.
func (s *Store) ReadTLSCertAndKey(domain string) (cert, key []byte, err error) {
	if secret := s.sharedSecret(domain); secret != "" {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		sec, err := s.secrets.Get(ctx, secret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil, ipn.ErrStateNotExist
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading certificate Secret %s: %w", secret, err)
		}
		cert, key = sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
	} else {
		s.mu.Lock()
		cert, key = s.cache[certKey(domain)], s.cache[keyKey(domain)]
		s.mu.Unlock()
	}
	if len(cert) == 0 || len(key) == 0 {
		return nil, nil, ipn.ErrStateNotExist
	}
	return cert, key, nil
}

// WriteTLSCertAndKey stores the certificate and key of domain (PEM) in one patch: in the state
// Secret, under the keys tailscaled's separate writes would use, or in the shared Secret.
func (s *Store) WriteTLSCertAndKey(domain string, cert, key []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if secret := s.sharedSecret(domain); secret != "" {
		return s.patch(ctx, secret, map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key})
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.patch(ctx, s.name, map[string][]byte{certKey(domain): cert, keyKey(domain): key}); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache[certKey(domain)], s.cache[keyKey(domain)] = cert, key
	return nil
}

func certKey(domain string) string { return SecretKey(ipn.StateKey(domain + ".crt")) }
func keyKey(domain string) string  { return SecretKey(ipn.StateKey(domain + ".key")) }

func (s *Store) patch(ctx context.Context, name string, data map[string][]byte) error {
	set := make(map[string]any, len(data))
	for k, v := range data {
		if v == nil {
			set[k] = nil // merge patch: remove
		} else {
			set[k] = v // encoded as base64, as Secret data is
		}
	}
	body, err := json.Marshal(map[string]any{"data": set})
	if err != nil {
		return err
	}
	_, err = s.secrets.Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "tsingress-proxy"})
	if err != nil {
		return fmt.Errorf("updating Secret %s: %w", name, err)
	}
	return nil
}

const (
	prefix    = "ts."     // a tailscale key that is a valid Secret key
	hexPrefix = "ts-hex." // any other tailscale key, hex-encoded
)

var validKey = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

// maxKeyLen is the longest Secret data key the API accepts.
const maxKeyLen = 253

// SecretKey is the Secret data key a tailscale state key is stored under. Distinct state keys
// get distinct Secret keys.
func SecretKey(id ipn.StateKey) string {
	if k := prefix + string(id); validKey.MatchString(string(id)) && len(k) <= maxKeyLen {
		return k
	}
	return hexPrefix + hex.EncodeToString([]byte(id))
}

func isTailscaleKey(k string) bool {
	return strings.HasPrefix(k, prefix) || strings.HasPrefix(k, hexPrefix)
}
