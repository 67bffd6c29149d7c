//go:build conformance

// Package conformance runs the Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance,
// at the version go.mod pins) against the operator deployed on a kind cluster, its requests sent
// from a device on the cluster's tailnet. hack/conformance-kind.sh (make test-conformance) sets
// the environment up: the cluster, the operator, the tailnet and the suite's backends, built here.
//
// Environment, beside the tailnet's (see test/framework):
//
//	CONFORMANCE_REPORT        where the suite's report goes (default: none)
//	CONFORMANCE_PROFILES      comma-separated profiles (default: GATEWAY-HTTP)
//	CONFORMANCE_RUN_TEST      one test to run alone (default: all of the profiles')
//	CONFORMANCE_IMAGES        images in place of those the suite's manifests name, as
//	                          name=image pairs, comma-separated ("registry.k8s.io/coredns/coredns=..."):
//	                          its echo backend and CoreDNS, built here
//	CONFORMANCE_VERSION       the operator's version, for the report
package conformance

import (
	"context"
	"io"
	"io/fs"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/gateway-api/conformance/utils/roundtripper"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"

	"github.com/tsingress/tsingress/internal/controller/gateway"
	"github.com/tsingress/tsingress/internal/testing/kubeobj"
	"github.com/tsingress/tsingress/test/framework"
)

// className is the GatewayClass the suite's Gateways are of.
const className = "tsingress-conformance"

// extended are the extended features claimed: each is run, and must pass.
var extended = []features.FeatureName{
	features.SupportHTTPRouteQueryParamMatching,
	features.SupportHTTPRouteMethodMatching,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRoutePortRedirect,
	features.SupportHTTPRouteSchemeRedirect,
	features.SupportHTTPRoutePathRedirect,
	features.SupportHTTPRouteHostRewrite,
	features.SupportHTTPRoutePathRewrite,
	features.SupportHTTPRouteRequestMirror,
	features.SupportHTTPRouteRequestTimeout,
	features.SupportHTTPRouteBackendTimeout,
}

func TestConformance(t *testing.T) {
	ctx := t.Context()
	opts := conformance.DefaultOptions(t)

	tn, err := framework.Join(ctx, t.TempDir, "conformance", 2*time.Hour)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = tn.Client.Close()
		_ = tn.API.DeleteDevice(context.Background(), tn.ClientID)
	})

	// The suite's Gateways name TLS Secrets of its namespaces: their owner lets the operator read
	// them, as any namespace's owner does for an Ingress's (docs/security.md).
	operator := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "operator", Namespace: envOr("E2E_OPERATOR_NAMESPACE", "tailscale")}
	for _, ns := range []string{"gateway-conformance-infra", "gateway-conformance-web-backend", "gateway-conformance-app-backend"} {
		require.NoError(t, client.IgnoreAlreadyExists(opts.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})))
		require.NoError(t, client.IgnoreAlreadyExists(opts.Client.Create(ctx, kubeobj.TLSSecretReaderBinding(ns, operator))))
	}

	gc := &gatewayv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: className}, Spec: gatewayv1.GatewayClassSpec{ControllerName: gateway.ControllerName}}
	require.NoError(t, client.IgnoreAlreadyExists(opts.Client.Create(ctx, gc)))

	opts.GatewayClassName = className
	opts.SupportedFeatures = extended
	opts.ConformanceProfiles = nil
	for _, p := range strings.Split(envOr("CONFORMANCE_PROFILES", "GATEWAY-HTTP"), ",") {
		opts.ConformanceProfiles = append(opts.ConformanceProfiles, suite.ConformanceProfileName(p))
	}
	opts.RunTest = os.Getenv("CONFORMANCE_RUN_TEST")
	opts.ReportOutputPath = os.Getenv("CONFORMANCE_REPORT")
	opts.CleanupBaseResources = true
	opts.Implementation = confv1.Implementation{
		Organization: "tsingress", Project: "tsingress", URL: "https://github.com/tsingress/tsingress",
		Version: envOr("CONFORMANCE_VERSION", "dev"), Contact: []string{"@tsingress/maintainers"},
	}
	// A Gateway's proxy joins the tailnet before it answers: seconds, not the moment the suite
	// expects of a load balancer already running.
	opts.TimeoutConfig.MaxTimeToConsistency = 90 * time.Second
	opts.TimeoutConfig.RequestTimeout = 15 * time.Second
	// A proxy is up in well under a minute: a Gateway that is not by two fails sooner than the
	// defaults would let it, and polls are fewer, for the API server and the log.
	opts.TimeoutConfig.GatewayMustHaveAddress = 120 * time.Second
	opts.TimeoutConfig.GatewayMustHaveCondition = 120 * time.Second
	opts.TimeoutConfig.NamespacesMustBeReady = 180 * time.Second
	opts.TimeoutConfig.DefaultPollInterval = 500 * time.Millisecond
	opts.RoundTripper = &roundtripper.DefaultRoundTripper{TimeoutConfig: opts.TimeoutConfig, CustomDialContext: tn.Dial}
	if images := os.Getenv("CONFORMANCE_IMAGES"); images != "" {
		replace := map[string]string{}
		for _, pair := range strings.Split(images, ",") {
			name, image, ok := strings.Cut(pair, "=")
			require.True(t, ok, "CONFORMANCE_IMAGES: %q is not name=image", pair)
			replace[name] = image
		}
		opts.ManifestFS = []fs.FS{imagesReplaced{fs: &conformance.Manifests, images: replace}}
	}
	conformance.RunConformanceWithOptions(t, opts)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// imagesReplaced is the suite's manifests with the images of some names replaced: this cluster
// runs the backends built here, offline, under local names.
type imagesReplaced struct {
	fs     fs.FS
	images map[string]string // by name, the image's reference without its tag
}

func (r imagesReplaced) Open(name string) (fs.File, error) {
	f, err := r.fs.Open(name)
	if err != nil || !strings.HasSuffix(name, ".yaml") {
		return f, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	for i, line := range lines {
		key, ref, ok := strings.Cut(line, "image: ")
		if !ok {
			continue
		}
		base, _, _ := strings.Cut(ref, ":")
		if image, ok := r.images[base]; ok {
			lines[i] = key + "image: " + image
		}
	}
	return fstest.MapFS{name: &fstest.MapFile{Data: []byte(strings.Join(lines, "\n"))}}.Open(name)
}
