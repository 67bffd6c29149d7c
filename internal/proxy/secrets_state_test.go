package proxy

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// A failed read keeps what the last good read saw; a good read replaces anything.
func TestNextSecretState(t *testing.T) {
	good := newSecretState(&corev1.Secret{Type: corev1.SecretTypeTLS, Data: map[string][]byte{
		corev1.TLSCertKey: []byte("cert"), corev1.TLSPrivateKeyKey: []byte("key")}}, nil)
	failed := newSecretState(nil, errors.New("dial tcp 10.96.0.1:443: connect: connection refused"))
	gone := newSecretState(nil, nil)

	if st, changed := nextSecretState(good, true, failed); changed || !st.same(good) {
		t.Errorf("a failed read after a good one: changed %t, state %+v; want the good one kept", changed, st)
	}
	if st, changed := nextSecretState(secretState{}, false, failed); !changed || st.err == nil {
		t.Errorf("a failed first read: changed %t, err %v; want it recorded", changed, st.err)
	}
	if st, changed := nextSecretState(failed, true, good); !changed || !st.same(good) {
		t.Errorf("a good read after a failed one: changed %t; want the good one", changed)
	}
	if st, changed := nextSecretState(good, true, gone); !changed || st.exists {
		t.Errorf("the Secret deleted: changed %t, exists %t; want it gone", changed, st.exists)
	}
	if _, changed := nextSecretState(good, true, good); changed {
		t.Error("the same state again counts as a change")
	}
}
