package certs

import (
	"context"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

// secretReader answers every Get with err.
type secretReader struct {
	client.Reader
	err error
}

func (r secretReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return r.err
}

// recordedWatches records which namespaces were watched and forgotten.
type recordedWatches struct{ watched, forgotten []string }

func (w *recordedWatches) Watch(_ context.Context, ns string) error {
	w.watched = append(w.watched, ns)
	return nil
}
func (w *recordedWatches) Forget(_ context.Context, ns string) { w.forgotten = append(w.forgotten, ns) }

func TestResolveWhereSecretsAreNotReadable(t *testing.T) {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web"},
		Spec: networkingv1.IngressSpec{TLS: []networkingv1.IngressTLS{{Hosts: []string{"app.example.com"}, SecretName: "app-tls"}}}}
	gr := schema.GroupResource{Resource: "secrets"}
	for _, tc := range []struct {
		name               string
		err                error
		reason             string
		watched, forgotten []string
		recheck            time.Duration
	}{
		{name: "forbidden", err: apierrors.NewForbidden(gr, "app-tls", nil), reason: kit.ReasonTLSSecretNotPermitted,
			forgotten: []string{"apps"}, recheck: NotPermittedRecheck},
		{name: "missing, watched to see it appear", err: apierrors.NewNotFound(gr, "app-tls"), reason: kit.ReasonTLSSecretNotFound,
			watched: []string{"apps"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &recordedWatches{}
			out, err := CertSecrets{API: secretReader{err: tc.err}, Now: time.Now, Watches: w}.Resolve(t.Context(), ing, "p", "tailscale", nil)
			if err != nil {
				t.Fatal(err)
			}
			var reasons []string
			for _, f := range out.Findings {
				reasons = append(reasons, f.Reason)
			}
			if !slices.Equal(reasons, []string{tc.reason}) || len(out.Copies) != 0 {
				t.Errorf("findings %v, %d copies; want [%s] and none", reasons, len(out.Copies), tc.reason)
			}
			if !slices.Equal(w.watched, tc.watched) || !slices.Equal(w.forgotten, tc.forgotten) {
				t.Errorf("watched %v, forgotten %v; want %v, %v", w.watched, w.forgotten, tc.watched, tc.forgotten)
			}
			if out.Recheck != tc.recheck {
				t.Errorf("recheck %v, want %v", out.Recheck, tc.recheck)
			}
		})
	}
}
