package groupstore

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
	"github.com/tsingress/tsingress/internal/controller/proxies"
)

// GroupCert is what deciding the certificate of a tailnet name served on a ProxyGroup needs.
type GroupCert struct {
	Client client.Client
	Guard  *certs.CertGuard
	// Namespace is the operator's, where the group's certificate Secrets are.
	Namespace         string
	DefaultProxyClass string
}

// Certificate prepares the group's certificate Secret of hostname's tailnet name, records what
// the replicas (states, by ordinal) obtained and decides whether the issuing replica may ask the
// CA; obj is the object served under the name, which the guard reports on. domain is the
// tailnet's, used while no replica reports one.
func (g GroupCert) Certificate(ctx context.Context, rep kit.Reporter, obj client.Object, pg *tsv1alpha1.ProxyGroup,
	hostname, domain string, states []*contract.ProxyState) (certs.TailnetCert, error) {
	c := certs.TailnetCert{}
	class, err := proxies.ResolveProxyClass(ctx, g.Client, pg, g.DefaultProxyClass)
	if err != nil {
		return c, err
	}
	// The class the replicas are configured with: staging's limits are for testing, no guard then.
	staging := class.Staging()
	for _, st := range states {
		if st == nil {
			continue
		}
		if _, d, ok := strings.Cut(st.FQDN, "."); ok {
			domain = d
		}
		if err := g.Guard.ObserveReport(ctx, st, staging); err != nil {
			return c, err
		}
	}
	if domain != "" {
		c.FQDN = hostname + "." + domain
		if err := g.ensureSecret(ctx, pg, c.FQDN); err != nil {
			return c, err
		}
	}
	if len(states) > 0 && states[0] != nil {
		c.Cur = states[0].Certificates[c.FQDN]
	}
	return c, g.Guard.Decide(ctx, rep, obj, &c, staging)
}

// ensureSecret creates the empty kubernetes.io/tls Secret that the group's issuing replica
// fills. It belongs to the ProxyGroup, not the object served: one deleted and created again
// reuses the certificate instead of spending the CA's limits.
func (g GroupCert) ensureSecret(ctx context.Context, pg *tsv1alpha1.ProxyGroup, fqdn string) error {
	name := contract.GroupCertSecret(fqdn)
	s := &corev1.Secret{}
	// Whether it exists: the cache's object, not a copy of a certificate per pass.
	switch err := g.Client.Get(ctx, client.ObjectKey{Namespace: g.Namespace, Name: name}, s, client.UnsafeDisableDeepCopy); {
	case err == nil:
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading the group certificate Secret %s/%s: %w", g.Namespace, name, err)
	}
	labels := proxies.Group{Name: pg.Name}.Labels()
	labels[kit.LabelSecretType] = certs.SecretTypeGroupCert
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.Namespace, Labels: labels},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: nil, corev1.TLSPrivateKeyKey: nil},
	}
	if err := controllerutil.SetControllerReference(pg, s, g.Client.Scheme()); err != nil {
		return fmt.Errorf("setting ProxyGroup %s as the owner of the certificate Secret %s/%s: %w", pg.Name, g.Namespace, name, err)
	}
	return client.IgnoreAlreadyExists(kit.Create(ctx, g.Client, s))
}

// Tags are the tags of a ProxyGroup's replicas.
func Tags(pg *tsv1alpha1.ProxyGroup, defaults []string) []string {
	if len(pg.Spec.Tags) == 0 {
		return defaults
	}
	tags := make([]string, len(pg.Spec.Tags))
	for i, t := range pg.Spec.Tags {
		tags[i] = string(t)
	}
	return tags
}

// FirstAdvertising is the state of the first replica that advertises svcName (nil: none).
func FirstAdvertising(states []*contract.ProxyState, svcName string) *contract.ProxyState {
	for _, st := range states {
		if st != nil && Advertises(st, svcName) {
			return st
		}
	}
	return nil
}
