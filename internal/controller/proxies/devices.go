package proxies

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/tailnet"
)

// AnnotationMinted, followed by a replica's ordinal, records on the proxy's ServiceAccount the
// auth key the operator minted for the replica, and then the device that logged in with it. On
// the ServiceAccount, which no proxy may write, rather than on the replica's Secrets, which it
// may: what a compromised proxy writes must not make the operator delete another device.
const AnnotationMinted = "tailscale.com/auth-key-minted-"

// mintSkew allows for the control plane's clocks when a device is dated against its key.
const mintSkew = time.Minute

// mintRecord is what the operator knows of a replica's device from the tailnet API alone.
type mintRecord struct {
	KeyID    string    `json:"keyID"`
	Created  time.Time `json:"created"` // the key's, by the control plane's clock
	Tags     []string  `json:"tags"`
	Hostname string    `json:"hostname"`
	// DeviceID is the device found, through the API, to have logged in with the key; "" until then.
	DeviceID string `json:"deviceID,omitempty"`
}

// mismatch says why d cannot be the device that logged in with the key, or "".
func (r mintRecord) mismatch(d tailnet.Device) string {
	switch {
	case d.Created.Before(r.Created.Add(-mintSkew)):
		return fmt.Sprintf("it was created at %s, before key %s (%s)", d.Created.Format(time.RFC3339), r.KeyID, r.Created.Format(time.RFC3339))
	case !sameSet(d.Tags, r.Tags):
		return fmt.Sprintf("its tags %v are not the key's %v", d.Tags, r.Tags)
	case d.Hostname != r.Hostname:
		return fmt.Sprintf("its hostname %q is not the proxy's %q", d.Hostname, r.Hostname)
	}
	return ""
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// identity is the ServiceAccount of the proxy of s, where its mint records are kept.
func (k Keys) identity(s replicaSet) *corev1.ServiceAccount {
	sa := &corev1.ServiceAccount{}
	sa.Namespace, sa.Name = k.Namespace, s.name
	return sa
}

// record reads replica i's mint record through reader; nil when there is none.
func (k Keys) record(ctx context.Context, reader client.Reader, s replicaSet, i int) (*mintRecord, error) {
	sa := k.identity(s)
	if err := reader.Get(ctx, client.ObjectKeyFromObject(sa), sa); err != nil {
		if err := client.IgnoreNotFound(err); err != nil {
			return nil, fmt.Errorf("reading the ServiceAccount %s/%s of %s: %w", sa.Namespace, sa.Name, s.pod(i), err)
		}
		return nil, nil
	}
	v, ok := sa.Annotations[AnnotationMinted+strconv.Itoa(i)]
	if !ok {
		return nil, nil
	}
	rec := &mintRecord{}
	if err := json.Unmarshal([]byte(v), rec); err != nil {
		// Only a hand edit makes it unreadable: then no device is known to be the proxy's.
		return nil, nil //nolint:nilerr // an unreadable record is no record
	}
	return rec, nil
}

// writeRecord records rec for replica i on identity, the proxy's ServiceAccount as its owner
// builds it (created bearing the record when it does not exist yet).
func (k Keys) writeRecord(ctx context.Context, identity *corev1.ServiceAccount, i int, rec mintRecord) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encoding the mint record of key %s: %w", rec.KeyID, err)
	}
	return kit.SetAnnotation(ctx, k.Client, identity.DeepCopy(), AnnotationMinted+strconv.Itoa(i), string(v))
}

// pin records the device replica i logged in with, once the tailnet API shows that the device
// its state names is the one its key was minted for.
func (k Keys) pin(ctx context.Context, s replicaSet, i int, state *corev1.Secret, identity *corev1.ServiceAccount) error {
	if state == nil || !contract.LoggedIn(state.Data) {
		return nil
	}
	id := string(state.Data[contract.StateDeviceID])
	rec, err := k.record(ctx, k.Client, s, i)
	if err != nil || rec == nil || rec.DeviceID != "" || id == "" {
		return err
	}
	d, err := k.Tailnet.Device(ctx, id)
	if err != nil {
		if tailnet.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading tailnet device %s of %s: %w", id, s.pod(i), err)
	}
	if why := rec.mismatch(d); why != "" {
		// Deleting the proxy says so in an Event; until then nothing depends on it.
		log.FromContext(ctx).Info("not recording the device a proxy names as its own", "deviceID", id, "proxy", s.pod(i), "keyID", rec.KeyID, "why", why)
		return nil
	}
	rec.DeviceID = id
	if err := k.writeRecord(ctx, identity, i, *rec); err != nil {
		return fmt.Errorf("recording device %s of %s: %w", id, s.pod(i), err)
	}
	log.FromContext(ctx).Info("recorded tailnet device", "deviceID", id, "proxy", s.pod(i), "keyID", rec.KeyID)
	return nil
}

// DeleteDevice removes replica i's device from the tailnet: the one recorded as having logged
// in with its key, else the one its state Secret names if the tailnet API shows it could have
// (created after the key, with its tags and hostname). A device the state names otherwise is
// not deleted, and refused says why, for a Warning Event.
func (k Keys) DeleteDevice(ctx context.Context, s replicaSet, i int, state *corev1.Secret) (refused string, err error) {
	id := string(state.Data[contract.StateDeviceID])
	// From the API server: a record written just before must not be missed.
	rec, err := k.record(ctx, k.API, s, i)
	if err != nil {
		return "", err
	}
	refuse := func(why string) string {
		log.FromContext(ctx).Info("refused to delete tailnet device", "deviceID", id, "proxy", s.pod(i), "why", why)
		return fmt.Sprintf("tailnet device %s, which the state Secret %s names, was not deleted: %s; delete it by hand if it is the proxy's",
			id, state.Name, why)
	}
	if rec != nil && rec.DeviceID != "" {
		if err := k.deleteDevice(ctx, rec.DeviceID, s.pod(i), rec.KeyID); err != nil {
			return "", err
		}
		if id != "" && id != rec.DeviceID {
			return refuse(fmt.Sprintf("the device that logged in with the proxy's key %s is %s", rec.KeyID, rec.DeviceID)), nil
		}
		return "", nil
	}
	if id == "" {
		return "", nil
	}
	if rec == nil {
		return refuse("the operator has no record of minting a key for the proxy"), nil
	}
	d, err := k.Tailnet.Device(ctx, id)
	if err != nil {
		if tailnet.IsNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("reading tailnet device %s of %s: %w", id, s.pod(i), err)
	}
	if why := rec.mismatch(d); why != "" {
		return refuse(fmt.Sprintf("it did not log in with the proxy's key %s: %s", rec.KeyID, why)), nil
	}
	return "", k.deleteDevice(ctx, id, s.pod(i), rec.KeyID)
}

func (k Keys) deleteDevice(ctx context.Context, id, pod, keyID string) error {
	if err := k.Tailnet.DeleteDevice(ctx, id); err != nil {
		return fmt.Errorf("deleting tailnet device %s of %s: %w", id, pod, err)
	}
	log.FromContext(ctx).Info("deleted tailnet device", "deviceID", id, "proxy", pod, "keyID", keyID)
	return nil
}
