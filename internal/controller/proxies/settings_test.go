package proxies

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

func validSettings() kit.Settings {
	return kit.Settings{Namespace: "tailscale", IngressClassName: "tailscale", ProxyImage: "proxy:dev",
		DefaultTags: []string{"tag:k8s"}, FirewallMode: contract.FirewallAuto}
}

func TestSettingsValidatePrivateCA(t *testing.T) {
	for _, tc := range []struct {
		name      string
		directory string
		configMap string
		wantErr   string
	}{
		{name: "none"},
		{name: "https directory and a ConfigMap", directory: "https://ca.internal:14000/dir", configMap: "private-ca"},
		{name: "plain HTTP directory", directory: "http://ca.internal/dir", wantErr: "must be an https URL"},
		{name: "not a URL", directory: "ca.internal", wantErr: "must be an https URL"},
		{name: "bad ConfigMap name", configMap: "Private_CA", wantErr: "not a valid object name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := validSettings()
			s.ACMEDirectoryURL, s.ProxyCAConfigMap = tc.directory, tc.configMap
			err := s.Validate()
			if tc.wantErr == "" && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Validate: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

func TestACMEDirectory(t *testing.T) {
	private := validSettings()
	private.ACMEDirectoryURL = "https://ca.internal/dir"
	staging := &tsv1alpha1.ProxyClass{Spec: tsv1alpha1.ProxyClassSpec{UseLetsEncryptStagingEnvironment: true}}
	plain := &tsv1alpha1.ProxyClass{}
	for _, tc := range []struct {
		name     string
		settings kit.Settings
		class    *tsv1alpha1.ProxyClass
		want     string
	}{
		{"Let's Encrypt by default", validSettings(), nil, ""},
		{"the operator's private CA", private, plain, "https://ca.internal/dir"},
		{"a class's staging switch wins", private, staging, LetsEncryptStaging},
		{"staging without a private CA", validSettings(), staging, LetsEncryptStaging},
	} {
		if got := ACMEDirectory(tc.settings, tc.class); got != tc.want {
			t.Errorf("%s: acmeDirectory = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// The operator's extra roots reach a proxy as a read-only ConfigMap volume that SSL_CERT_DIR names.
func TestProxyPodsCABundle(t *testing.T) {
	base := ProxyPods{Name: "p", Namespace: "tailscale", Labels: map[string]string{"a": "b"}, Selector: map[string]string{"a": "b"}, Replicas: 1, Image: "proxy:dev"}
	if sts := base.Build(); slices.ContainsFunc(sts.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "ca-bundle" }) {
		t.Fatal("a CA volume without a CA ConfigMap")
	}
	withCA := base
	withCA.CaBundle = "private-ca"
	spec := withCA.Build().Spec.Template.Spec
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "ca-bundle" })
	if i < 0 || spec.Volumes[i].ConfigMap == nil || spec.Volumes[i].ConfigMap.Name != "private-ca" {
		t.Fatalf("volumes %+v: want ConfigMap private-ca as ca-bundle", spec.Volumes)
	}
	c := spec.Containers[0]
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "ca-bundle" && m.MountPath == caBundleDir && m.ReadOnly
	}) {
		t.Errorf("mounts %+v: want ca-bundle read-only at %s", c.VolumeMounts, caBundleDir)
	}
	if !slices.Contains(c.Env, corev1.EnvVar{Name: "SSL_CERT_DIR", Value: caBundleDir}) {
		t.Errorf("env %+v: want SSL_CERT_DIR=%s", c.Env, caBundleDir)
	}
}
