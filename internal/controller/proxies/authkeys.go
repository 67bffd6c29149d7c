package proxies

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// Annotations on a replica's config Secret that account for its auth key. An auth key is a
// credential: one minted and never delivered is a way onto the tailnet until it expires.
const (
	// AnnotationAuthKeyIntent is written before a key is minted: a nonce that the key's
	// description ends with. An intent that no delivered key fulfils (the operator stopped
	// between the mint and the config write) leads to the key by its description.
	AnnotationAuthKeyIntent = "tailscale.com/auth-key-intent"
	// AnnotationAuthKeyNonce is the intent the key in the config fulfils.
	AnnotationAuthKeyNonce = "tailscale.com/auth-key-nonce"
	// AnnotationAuthKeyID is the ID of the key in the config, to revoke it if it goes unused.
	AnnotationAuthKeyID = "tailscale.com/auth-key-id"
)

// KeyGrant is the auth key a replica's config is to hold: none once the replica is logged in.
type KeyGrant struct {
	Key, ID, Nonce string
	// minted says the key is new in this pass: if its config write fails it is revoked.
	minted bool
}

// Annotate records the grant on the config Secret that delivers it: the intent it fulfils too,
// so that the apply that delivers it leaves the Secret as the next pass builds it.
func (g KeyGrant) Annotate(s *corev1.Secret) {
	for k, v := range map[string]string{AnnotationAuthKeyID: g.ID, AnnotationAuthKeyNonce: g.Nonce, AnnotationAuthKeyIntent: g.Nonce} {
		if v == "" {
			continue
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

// Keys mints the auth keys of proxy replicas so that each holds at most one unused key,
// whatever the writes around the mint do: it mints only when the API server (not the cache,
// which may lag the last delivery) shows the replica neither logged in nor holding a key,
// records its intent before the mint, and revokes a key it could not deliver.
type Keys struct {
	Client    client.Client // cached reads, writes
	API       client.Reader // uncached
	Tailnet   tailnet.Client
	Namespace string
}

// Grant returns the auth key replica i of s is to hold, minting one with req when it has none.
// config is the replica's config Secret as its owner builds it (name, labels, owners, without
// data): the intent is recorded on it, creating it if need be. identity is the proxy's
// ServiceAccount as its owner builds it, which gets the mint record, and hostname the
// replica's: what its device must show to be deleted with it.
func (k Keys) Grant(ctx context.Context, s replicaSet, i int, config *corev1.Secret, identity *corev1.ServiceAccount, hostname string, req tailnet.AuthKeyRequest) (KeyGrant, error) {
	state, have, err := k.read(ctx, k.Client, s, i)
	if err != nil {
		return KeyGrant{}, err
	}
	if g, ok := kept(state, have); ok {
		return g, k.pin(ctx, s, i, state, identity)
	}
	if state, have, err = k.read(ctx, k.API, s, i); err != nil {
		return KeyGrant{}, err
	}
	if g, ok := kept(state, have); ok {
		return g, k.pin(ctx, s, i, state, identity)
	}
	if err := k.sweep(ctx, have); err != nil {
		return KeyGrant{}, err
	}
	nonce, err := newNonce()
	if err != nil {
		return KeyGrant{}, err
	}
	target := config.DeepCopy()
	target.Data, target.StringData = nil, nil
	if err := kit.SetAnnotation(ctx, k.Client, target, AnnotationAuthKeyIntent, nonce); err != nil {
		return KeyGrant{}, fmt.Errorf("recording the intent to mint an auth key for %s: %w", s.pod(i), err)
	}
	req.Description = keyDescription(req.Description, nonce)
	key, err := k.Tailnet.CreateAuthKey(ctx, req)
	if err != nil {
		return KeyGrant{}, fmt.Errorf("minting an auth key for %s: %w", s.pod(i), err)
	}
	// By its ID, never its secret. The config Secret's UID tells a proxy from an earlier one of
	// its name (an object deleted and created again).
	log.FromContext(ctx).Info("minted auth key", "keyID", key.ID, "proxy", s.pod(i), "configSecretUID", target.UID,
		"tags", req.Tags, "description", req.Description, "expires", key.Expires)
	grant := KeyGrant{Key: key.Secret.Reveal(), ID: key.ID, Nonce: nonce, minted: true}
	// Before the key is delivered: a device that logs in with it is then always known.
	rec := mintRecord{KeyID: key.ID, Created: key.Created, Tags: req.Tags, Hostname: hostname}
	if err := k.writeRecord(ctx, identity, i, rec); err != nil {
		return KeyGrant{}, k.Undelivered(ctx, grant, fmt.Errorf("recording auth key %s of %s: %w", key.ID, s.pod(i), err))
	}
	return grant, nil
}

// Undelivered is what a failed write of the config Secret that carries g returns: a key
// minted in this pass is revoked at once, as nothing holds it. If that fails too, the intent
// left on the Secret leads the next mint to it.
func (k Keys) Undelivered(ctx context.Context, g KeyGrant, writeErr error) error {
	if !g.minted {
		return writeErr
	}
	if err := k.Tailnet.DeleteAuthKey(ctx, g.ID); err != nil {
		return errors.Join(writeErr, fmt.Errorf("revoking auth key %s, which its config write did not deliver: %w", g.ID, err))
	}
	log.FromContext(ctx).Info("revoked auth key", "keyID", g.ID, "reason", "its config write failed")
	return writeErr
}

// Release revokes what a replica's config Secret holds unused, as the replica goes: the key
// it never logged in with, and any key minted without being delivered.
func (k Keys) Release(ctx context.Context, config *corev1.Secret) error {
	if config == nil {
		return nil
	}
	if id := config.Annotations[AnnotationAuthKeyID]; id != "" && configKey(config.Data) != "" {
		if err := k.Tailnet.DeleteAuthKey(ctx, id); err != nil {
			return fmt.Errorf("revoking the unused auth key %s of %s: %w", id, config.Name, err)
		}
		log.FromContext(ctx).Info("revoked auth key", "keyID", id, "reason", "its proxy went without using it", "secret", config.Name)
	}
	return k.sweep(ctx, config)
}

// sweep revokes the keys minted for an intent that no delivered key fulfils. It lists every
// key with a call each, which only an operator stopped mid-mint, or a failed write whose
// revocation failed too, makes it do.
func (k Keys) sweep(ctx context.Context, config *corev1.Secret) error {
	if config == nil {
		return nil
	}
	intent := config.Annotations[AnnotationAuthKeyIntent]
	if intent == "" || intent == config.Annotations[AnnotationAuthKeyNonce] {
		return nil
	}
	keys, err := k.Tailnet.AuthKeys(ctx)
	if err != nil {
		return fmt.Errorf("listing auth keys to find one minted for %s but not delivered: %w", config.Name, err)
	}
	for _, key := range keys {
		if !strings.HasSuffix(key.Description, " "+intent) {
			continue
		}
		if err := k.Tailnet.DeleteAuthKey(ctx, key.ID); err != nil {
			return fmt.Errorf("revoking auth key %s, minted for %s but not delivered: %w", key.ID, config.Name, err)
		}
		log.FromContext(ctx).Info("revoked auth key", "keyID", key.ID, "reason", "minted but not delivered", "secret", config.Name)
	}
	return nil
}

// read returns replica i's state and config Secrets through reader, nil for one that does not
// exist.
func (k Keys) read(ctx context.Context, reader client.Reader, s replicaSet, i int) (state, config *corev1.Secret, err error) {
	if state, err = getSecret(ctx, reader, k.Namespace, s.StateSecret(i)); err != nil {
		return nil, nil, err
	}
	config = state
	if s.ConfigSecret(i) != s.StateSecret(i) {
		if config, err = getSecret(ctx, reader, k.Namespace, s.ConfigSecret(i)); err != nil {
			return nil, nil, err
		}
	}
	return state, config, nil
}

func getSecret(ctx context.Context, reader client.Reader, ns, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	if err := reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Secret %s/%s: %w", ns, name, err)
	}
	return s, nil
}

// kept decides a replica's key from its Secrets without minting: none once it is logged in
// (the key is spent and leaves the config), else the unused key its config holds; ok=false
// says it has neither and needs a new one.
func kept(state, config *corev1.Secret) (KeyGrant, bool) {
	var ann map[string]string
	if config != nil {
		ann = config.Annotations
	}
	if state != nil && contract.LoggedIn(state.Data) {
		return KeyGrant{Nonce: ann[AnnotationAuthKeyNonce]}, true
	}
	if config != nil {
		if key := configKey(config.Data); key != "" {
			return KeyGrant{Key: key, ID: ann[AnnotationAuthKeyID], Nonce: ann[AnnotationAuthKeyNonce]}, true
		}
	}
	return KeyGrant{}, false
}

// configKey is the auth key a config holds, "" for none or a config this build cannot read.
func configKey(data map[string][]byte) string {
	if cfg, _, err := contract.ProxyConfigs.Decode(data); err == nil {
		return cfg.AuthKey
	}
	return ""
}

// keyDescription ends what the admin console shows with the intent's nonce, within the
// control plane's limit.
func keyDescription(human, nonce string) string {
	room := tailnet.MaxKeyDescription - len(nonce) - 1
	if len(human) > room {
		human = human[:room]
	}
	return human + " " + nonce
}

func newNonce() (string, error) {
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("drawing a nonce: %w", err)
	}
	return hex.EncodeToString(b), nil
}
