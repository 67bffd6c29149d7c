package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every environment variable the README names for the operator is in --help, and sets what it
// says it sets.
func TestEnvironment(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	// "Operator settings are flags with environment fallbacks named as in the original operator
	// (`A`, `B`, ...)"
	section := regexp.MustCompile(`(?s)environment fallbacks.*?\((.*?)\);`).FindSubmatch(readme)
	if section == nil {
		t.Fatal("README.md no longer lists the operator's environment variables")
	}
	named := regexp.MustCompile("`([A-Z_]+)`").FindAllSubmatch(section[1], -1)
	if len(named) < 5 {
		t.Fatalf("README.md names %d variables: %s", len(named), section[1])
	}

	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	var help bytes.Buffer
	fs.SetOutput(&help)
	if _, err := parseFlags(fs, []string{"--help"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	usage(fs)

	// What each variable sets, as parsed.
	set := map[string]func(o *options) string{
		"OPERATOR_NAMESPACE":                  func(o *options) string { return o.settings.Namespace },
		"OPERATOR_INGRESS_CLASS_NAME":         func(o *options) string { return o.settings.IngressClassName },
		"PROXY_DEFAULT_CLASS":                 func(o *options) string { return o.settings.DefaultProxyClass },
		"PROXY_TAGS":                          func(o *options) string { return strings.Join(o.settings.DefaultTags, ",") },
		"PROXY_IMAGE":                         func(o *options) string { return o.settings.ProxyImage },
		"PROXY_FIREWALL_MODE":                 func(o *options) string { return string(o.settings.FirewallMode) },
		"OPERATOR_DEFAULT_LOAD_BALANCER":      func(o *options) string { return boolString(o.settings.DefaultLoadBalancer) },
		"OPERATOR_LOGIN_SERVER":               func(o *options) string { return o.settings.ControlURL },
		"CLIENT_ID_FILE":                      func(o *options) string { return o.controlPlane.clientIDFile },
		"CLIENT_SECRET_FILE":                  func(o *options) string { return o.controlPlane.clientSecretFile },
		"CLIENT_ID":                           func(o *options) string { return o.controlPlane.clientID },
		"ID_TOKEN_FILE":                       func(o *options) string { return o.controlPlane.idTokenFile },
		"ACME_DIRECTORY_URL":                  func(o *options) string { return o.settings.ACMEDirectoryURL },
		"PROXY_CA_CONFIGMAP":                  func(o *options) string { return o.settings.ProxyCAConfigMap },
		"PROXY_NO_LOGS_NO_SUPPORT":            func(o *options) string { return boolString(o.settings.ProxyNoLogs) },
		"OPERATOR_MAX_PROXYGROUP_REPLICAS":    func(o *options) string { return strconv.Itoa(o.settings.MaxGroupReplicas) },
		"OPERATOR_FUNNEL_NAMESPACES":          func(o *options) string { return strings.Join(o.settings.FunnelNamespaces, ",") },
		"OPERATOR_PRIVILEGED_PROXY_NAMESPACE": func(o *options) string { return o.settings.PrivilegedNamespace },
	}
	values := map[string]string{
		"PROXY_TAGS": "tag:a,tag:b", "PROXY_FIREWALL_MODE": "iptables", "OPERATOR_DEFAULT_LOAD_BALANCER": "true",
		"OPERATOR_LOGIN_SERVER": "https://control.example.com", "ACME_DIRECTORY_URL": "https://ca.example.com/directory",
		"PROXY_CA_CONFIGMAP": "private-ca", "PROXY_NO_LOGS_NO_SUPPORT": "true", "OPERATOR_MAX_PROXYGROUP_REPLICAS": "7",
		"OPERATOR_FUNNEL_NAMESPACES": "public,edge",
	}
	for _, m := range named {
		env := string(m[1])
		t.Run(env, func(t *testing.T) {
			if !strings.Contains(help.String(), "Environment: "+env+".") {
				t.Errorf("--help does not name %s:\n%s", env, help.String())
			}
			get, ok := set[env]
			if !ok {
				t.Fatalf("the README names %s, which this test does not know", env)
			}
			want := values[env]
			if want == "" {
				want = "from-" + strings.ReplaceAll(strings.ToLower(env), "_", "-")
			}
			t.Setenv(env, want)
			var args []string
			if env != "OPERATOR_NAMESPACE" {
				args = []string{"--operator-namespace=tailscale"}
			}
			o, err := parseFlags(flag.NewFlagSet("operator", flag.ContinueOnError), args)
			if err != nil {
				t.Fatal(err)
			}
			if got := get(o); got != want {
				t.Errorf("%s=%s gives %q", env, want, got)
			}
		})
	}
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

func TestFunnelNamespaces(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"*", nil},
		{" * ", nil},
		{"", []string{}},
		{"public", []string{"public"}},
		{"public, edge ,", []string{"public", "edge"}},
	} {
		got := funnelNamespaces(tc.in)
		if (got == nil) != (tc.want == nil) || strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("funnelNamespaces(%q) = %#v, want %#v", tc.in, got, tc.want)
		}
	}
}
