// Package chart tests charts/tailscale-operator: it lints, it renders the objects make deploy
// installs, and it honours or refuses each of its values. The helm and kustomize binaries come
// from HELM_BIN and KUSTOMIZE_BIN, which make test and make test-chart set after building them.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

const (
	namespace    = "tailscale"
	clientID     = "test-client-id"
	clientSecret = "test-client-secret"
)

var root = func() string {
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	return filepath.Join(wd, "..", "..")
}()

var chartDir = filepath.Join(root, "charts", "tailscale-operator")

// tool is the binary an environment variable names; a test without it fails, not skips, so that
// CI cannot pass without running it.
func tool(t *testing.T, env string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		t.Fatalf("%s is not set: run these tests with `make test-chart` (or make test), which builds helm and kustomize into bin/", env)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s=%s: %v", env, bin, err)
	}
	return bin
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

type object = map[string]any

// key names an object as kubectl would find it.
func key(o object) string {
	meta, _ := o["metadata"].(object)
	ns, _ := meta["namespace"].(string)
	return fmt.Sprintf("%v %s/%v", o["kind"], ns, meta["name"])
}

func decode(t *testing.T, manifests string) map[string]object {
	t.Helper()
	out := map[string]object{}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		var o object
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding manifests: %v", err)
		}
		if o == nil {
			continue
		}
		k := key(o)
		if _, dup := out[k]; dup {
			t.Fatalf("%s rendered twice", k)
		}
		out[k] = o
	}
	return out
}

// helmTemplate renders the chart into namespace tailscale with the given --set flags.
func helmTemplate(t *testing.T, sets ...string) (string, error) {
	t.Helper()
	args := []string{"template", "tsingress", chartDir, "--namespace", namespace}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return run(t, tool(t, "HELM_BIN"), args...)
}

func mustHelmTemplate(t *testing.T, sets ...string) map[string]object {
	t.Helper()
	out, err := helmTemplate(t, sets...)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, out)
}

func TestLintStrict(t *testing.T) {
	for _, sets := range [][]string{nil, {"oauth.clientId=" + clientID, "oauth.clientSecret=" + clientSecret}} {
		args := []string{"lint", "--strict", chartDir}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		if out, err := run(t, tool(t, "HELM_BIN"), args...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}

// kustomizeDeploy builds overlay (under config/) as make deploy installs it, plus the Secret
// operator-oauth as hack/kind-deploy.sh generates it (README's install has the user create it).
func kustomizeDeploy(t *testing.T, overlay string) map[string]object {
	t.Helper()
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(root, "config", overlay))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf(`resources:
- %s
secretGenerator:
- name: operator-oauth
  namespace: %s
  literals: [client_id=%s, client_secret=%s]
  options: {disableNameSuffixHash: true}
`, base, namespace, clientID, clientSecret)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, tool(t, "KUSTOMIZE_BIN"), "build", dir)
	if err != nil {
		t.Fatal(err)
	}
	return decode(t, out)
}

// helmLabels are the labels the chart adds to every object's metadata for helm's users
// (kubectl get -l app.kubernetes.io/instance=...); make deploy's objects have none of them.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// settingsHash is the suffix kustomize's configMapGenerator gives operator-settings.
var settingsHash = regexp.MustCompile(`^operator-settings-[a-z0-9]{10}$`)

// normaliseKustomize removes what make deploy has and the chart legitimately lacks:
//   - the Namespace: helm installs into the release's namespace, made by `helm install
//     --create-namespace` or beforehand; a chart cannot own the namespace its release lives in.
//   - the operator-settings ConfigMap's name hash, kustomize's way of rolling the Deployment when
//     a setting changes; the chart keeps the plain name and rolls it through a checksum annotation.
func normaliseKustomize(t *testing.T, objs map[string]object) {
	t.Helper()
	if _, ok := objs["Namespace /"+namespace]; !ok {
		t.Fatalf("make deploy does not make the Namespace %s", namespace)
	}
	delete(objs, "Namespace /"+namespace)
	renamed := 0
	for k, o := range objs {
		meta := o["metadata"].(object)
		if o["kind"] == "ConfigMap" && settingsHash.MatchString(fmt.Sprint(meta["name"])) {
			meta["name"] = "operator-settings"
			delete(objs, k)
			objs[key(o)] = o
			renamed++
		}
	}
	if renamed != 1 {
		t.Fatalf("make deploy renders %d ConfigMaps named operator-settings-<hash>, want 1", renamed)
	}
	for _, ref := range settingsRefs(objs) {
		if settingsHash.MatchString(fmt.Sprint(ref["name"])) {
			ref["name"] = "operator-settings"
		}
	}
}

// settingsRefs are the Deployments' envFrom configMapRefs.
func settingsRefs(objs map[string]object) []object {
	var refs []object
	for _, o := range objs {
		if o["kind"] != "Deployment" {
			continue
		}
		for _, c := range dig(o, "spec", "template", "spec", "containers").([]any) {
			for _, e := range c.(object)["envFrom"].([]any) {
				if ref, ok := e.(object)["configMapRef"].(object); ok {
					refs = append(refs, ref)
				}
			}
		}
	}
	return refs
}

// normaliseHelm removes what the chart adds for helm's sake: the labels above, the CRDs'
// helm.sh/resource-policy: keep (helm uninstall must not delete everyone's ProxyClasses and
// ProxyGroups), and the Pod template's checksum/settings (see normaliseKustomize).
func normaliseHelm(t *testing.T, objs map[string]object) {
	t.Helper()
	for _, o := range objs {
		meta := o["metadata"].(object)
		labels, _ := meta["labels"].(object)
		for _, l := range helmLabels {
			if _, ok := labels[l]; !ok {
				t.Errorf("%s lacks the label %s", key(o), l)
			}
			delete(labels, l)
		}
		if len(labels) == 0 {
			delete(meta, "labels")
		}
		if o["kind"] == "CustomResourceDefinition" {
			removeAnnotation(t, o, meta, "helm.sh/resource-policy", "keep")
		}
		if o["kind"] == "Deployment" {
			tmeta := dig(o, "spec", "template", "metadata").(object)
			removeAnnotation(t, o, tmeta, "checksum/settings", "")
		}
	}
}

// removeAnnotation removes an annotation that must be there (with value want, unless empty).
func removeAnnotation(t *testing.T, o, meta object, name, want string) {
	t.Helper()
	ann, _ := meta["annotations"].(object)
	v, ok := ann[name]
	if !ok || (want != "" && v != want) {
		t.Errorf("%s: annotation %s is %v, want %q", key(o), name, v, want)
	}
	delete(ann, name)
	if len(ann) == 0 {
		delete(meta, "annotations")
	}
}

func dig(o any, path ...string) any {
	for _, p := range path {
		o = o.(object)[p]
	}
	return o
}

// diff lists the paths where a and b differ.
func diff(path string, a, b any) []string {
	am, aok := a.(object)
	bm, bok := b.(object)
	if aok && bok {
		var out []string
		seen := map[string]bool{}
		for k := range am {
			seen[k] = true
		}
		for k := range bm {
			seen[k] = true
		}
		keys := make([]string, 0, len(seen))
		for k := range seen {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			out = append(out, diff(path+"."+k, am[k], bm[k])...)
		}
		return out
	}
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok && bok && len(as) == len(bs) {
		var out []string
		for i := range as {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), as[i], bs[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: make deploy has %v, the chart %v", path, a, b)}
}

// TestDefaultsRenderMakeDeploy: with its default values and the OAuth client, the chart renders
// make deploy's objects, field for field, but for what the normalise functions name.
func TestDefaultsRenderMakeDeploy(t *testing.T) {
	sameObjects(t, kustomizeDeploy(t, "default"), mustHelmTemplate(t, "oauth.clientId="+clientID, "oauth.clientSecret="+clientSecret))
}

// TestPrivilegedNamespaceRendersRestrictedOverlay: proxyConfig.privilegedNamespace renders what
// the restricted overlay adds (the privileged namespace, the operator's Role there, the setting),
// but the release namespace's label, which a chart cannot own.
func TestPrivilegedNamespaceRendersRestrictedOverlay(t *testing.T) {
	got := mustHelmTemplate(t, "oauth.clientId="+clientID, "oauth.clientSecret="+clientSecret, "proxyConfig.privilegedNamespace=tailscale-privileged")
	if _, ok := got["Role tailscale-privileged/tsingress-privileged-proxies"]; !ok {
		t.Fatal("the chart renders no Role in the privileged namespace")
	}
	sameObjects(t, kustomizeDeploy(t, "overlays/restricted"), got)
}

// sameObjects compares what make deploy renders with what the chart does, field for field, but
// for what the normalise functions name.
func sameObjects(t *testing.T, want, got map[string]object) {
	t.Helper()
	normaliseKustomize(t, want)
	normaliseHelm(t, got)
	for k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("%s: make deploy installs it, the chart does not", k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: the chart installs it, make deploy does not", k)
		}
	}
	for k, w := range want {
		if g, ok := got[k]; ok {
			for _, d := range diff("", w, g) {
				t.Errorf("%s%s", k, d)
			}
		}
	}
	t.Logf("compared %d objects", len(want))
}

func TestRefusedValues(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string // in helm's error
	}{
		{[]string{"oauth.clientId=a", "oauth.clientSecret=b", "oauth.audience=x"}, "oauth.audience (workload identity federation) takes oauth.clientId and no secret"},
		{[]string{"oauth.audience=x"}, "oauth.audience (workload identity federation) takes oauth.clientId and no secret"},
		{[]string{"oauth.clientId=a"}, "oauth.clientId and oauth.clientSecret go together"},
		{[]string{"oauth.clientId=a", "oauth.clientSecret=b", "oauthSecretVolume.csi.driver=x"}, "mutually exclusive"},
		{[]string{"operatorConfig.defaultTags={tag:mine}"}, "operatorConfig.defaultTags is not supported"},
		{[]string{"operatorConfig.hostname=op"}, "operatorConfig.hostname is not supported"},
		{[]string{"apiServerProxyConfig.mode=noauth"}, "apiServerProxyConfig.mode is not supported"},
		{[]string{"apiServerProxyConfig.allowImpersonation=true"}, "apiServerProxyConfig.allowImpersonation is not supported"},
		{[]string{"operatorSettings.PROXY_TAGS=tag:x"}, "set that value instead"},
		{[]string{"operatorSettings.CLIENT_ID_FILE=/x"}, "the chart sets CLIENT_ID_FILE itself"},
		// The schema's.
		{[]string{"proxyConfig.firewallMode=ipfw"}, "firewallMode"},
		{[]string{"operatorConfig.logging=trace"}, "logging"},
		{[]string{"operatorSettings.lower=x"}, "operatorSettings"},
		{[]string{"noSuchValue=x"}, "noSuchValue"},
	} {
		_, err := helmTemplate(t, tc.set...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %v: error %v, want one with %q", tc.set, err, tc.want)
		}
	}
}

func container(t *testing.T, objs map[string]object) object {
	t.Helper()
	d, ok := objs["Deployment "+namespace+"/operator"]
	if !ok {
		t.Fatal("no Deployment operator")
	}
	return dig(d, "spec", "template", "spec", "containers").([]any)[0].(object)
}

func settings(t *testing.T, objs map[string]object) object {
	t.Helper()
	cm, ok := objs["ConfigMap "+namespace+"/operator-settings"]
	if !ok {
		t.Fatal("no ConfigMap operator-settings")
	}
	return cm["data"].(object)
}

func expect(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: got %#v, want %#v", what, got, want)
	}
}

func TestHonouredValues(t *testing.T) {
	t.Run("images", func(t *testing.T) {
		objs := mustHelmTemplate(t, "operatorConfig.image.repository=r/op", "operatorConfig.image.tag=v1",
			"operatorConfig.image.pullPolicy=Always", "proxyConfig.image.repository=r/px", "proxyConfig.image.digest=sha256:abc",
			"proxyConfig.image.tag=ignored")
		c := container(t, objs)
		expect(t, "operator image", c["image"], "r/op:v1")
		expect(t, "pull policy", c["imagePullPolicy"], "Always")
		expect(t, "PROXY_IMAGE", settings(t, objs)["PROXY_IMAGE"], "r/px@sha256:abc")
	})
	t.Run("proxy and operator settings", func(t *testing.T) {
		objs := mustHelmTemplate(t, "proxyConfig.defaultTags=tag:a\\,tag:b", "proxyConfig.firewallMode=nftables",
			"proxyConfig.defaultProxyClass=pc", "loginServer=https://hs.example", "ingressClass.name=ts2",
			"operatorSettings.ACME_DIRECTORY_URL=https://ca.example/dir")
		expect(t, "settings", settings(t, objs), object{
			"PROXY_TAGS": "tag:a,tag:b", "PROXY_FIREWALL_MODE": "nftables", "PROXY_DEFAULT_CLASS": "pc",
			"OPERATOR_LOGIN_SERVER": "https://hs.example", "OPERATOR_INGRESS_CLASS_NAME": "ts2",
			"PROXY_IMAGE": "ghcr.io/tsingress/proxy:dev", "ACME_DIRECTORY_URL": "https://ca.example/dir",
		})
		if _, ok := objs["IngressClass /ts2"]; !ok {
			t.Error("no IngressClass ts2")
		}
	})
	t.Run("the checksum follows the settings", func(t *testing.T) {
		sum := func(objs map[string]object) any {
			return dig(objs["Deployment "+namespace+"/operator"], "spec", "template", "metadata", "annotations", "checksum/settings")
		}
		if sum(mustHelmTemplate(t)) == sum(mustHelmTemplate(t, "proxyConfig.firewallMode=iptables")) {
			t.Error("checksum/settings did not change with a setting")
		}
	})
	t.Run("no IngressClass, no CRDs", func(t *testing.T) {
		objs := mustHelmTemplate(t, "ingressClass.enabled=false", "installCRDs=false")
		for k := range objs {
			if strings.HasPrefix(k, "IngressClass ") || strings.HasPrefix(k, "CustomResourceDefinition ") {
				t.Errorf("%s rendered", k)
			}
		}
		expect(t, "OPERATOR_INGRESS_CLASS_NAME", settings(t, objs)["OPERATOR_INGRESS_CLASS_NAME"], "tailscale")
	})
	t.Run("no OAuth Secret without credentials", func(t *testing.T) {
		if _, ok := mustHelmTemplate(t)["Secret "+namespace+"/operator-oauth"]; ok {
			t.Error("Secret operator-oauth rendered without oauth.clientId")
		}
	})
	t.Run("workload identity federation", func(t *testing.T) {
		objs := mustHelmTemplate(t, "oauth.clientId=kID", "oauth.audience=api.tailscale.com/kID")
		if _, ok := objs["Secret "+namespace+"/operator-oauth"]; ok {
			t.Error("Secret operator-oauth rendered for workload identity federation")
		}
		vols := dig(objs["Deployment "+namespace+"/operator"], "spec", "template", "spec", "volumes").([]any)
		expect(t, "volumes", vols, []any{object{"name": "oauth", "projected": object{"sources": []any{object{"serviceAccountToken": object{
			"audience": "api.tailscale.com/kID", "expirationSeconds": float64(3600), "path": "token"}}}}}})
		c := container(t, objs)
		expect(t, "volumeMounts", c["volumeMounts"], []any{object{"name": "oauth", "mountPath": "/var/run/secrets/tailscale/serviceaccount", "readOnly": true}})
		env := map[string]any{}
		for _, e := range c["env"].([]any) {
			env[e.(object)["name"].(string)] = e.(object)["value"]
		}
		expect(t, "CLIENT_ID", env["CLIENT_ID"], "kID")
		expect(t, "ID_TOKEN_FILE", env["ID_TOKEN_FILE"], "/var/run/secrets/tailscale/serviceaccount/token")
		if _, ok := env["CLIENT_SECRET_FILE"]; ok {
			t.Error("CLIENT_SECRET_FILE set for workload identity federation")
		}
	})
	t.Run("oauthSecretVolume", func(t *testing.T) {
		objs := mustHelmTemplate(t, "oauthSecretVolume.csi.driver=secrets-store.csi.k8s.io")
		vols := dig(objs["Deployment "+namespace+"/operator"], "spec", "template", "spec", "volumes").([]any)
		expect(t, "volumes", vols, []any{object{"name": "oauth", "csi": object{"driver": "secrets-store.csi.k8s.io"}}})
	})
	t.Run("logging", func(t *testing.T) {
		for level, flag := range map[string]string{"debug": "--zap-log-level=debug", "dev": "--zap-devel"} {
			args := container(t, mustHelmTemplate(t, "operatorConfig.logging="+level))["args"].([]any)
			expect(t, level, args[len(args)-1], flag)
		}
	})
	t.Run("Pod placement and metadata", func(t *testing.T) {
		objs := mustHelmTemplate(t, "operatorConfig.nodeSelector.disk=ssd", "operatorConfig.tolerations[0].operator=Exists",
			"operatorConfig.affinity.nodeAffinity.x=y", "operatorConfig.priorityClassName=high", "imagePullSecrets[0].name=pull",
			"operatorConfig.podLabels.team=net", "operatorConfig.podAnnotations.a=b", "operatorConfig.annotations.c=d",
			"operatorConfig.serviceAccountAnnotations.e=f", "operatorConfig.resources.limits.memory=1Gi",
			"operatorConfig.extraEnv[0].name=TS_TAILNET", "operatorConfig.extraEnv[0].value=example.com",
			"operatorConfig.podSecurityContext.runAsUser=1000", "operatorConfig.securityContext.privileged=false")
		d := objs["Deployment "+namespace+"/operator"]
		spec := dig(d, "spec", "template", "spec").(object)
		expect(t, "nodeSelector", spec["nodeSelector"], object{"disk": "ssd"})
		expect(t, "tolerations", spec["tolerations"], []any{object{"operator": "Exists"}})
		expect(t, "affinity", spec["affinity"], object{"nodeAffinity": object{"x": "y"}})
		expect(t, "priorityClassName", spec["priorityClassName"], "high")
		expect(t, "imagePullSecrets", spec["imagePullSecrets"], []any{object{"name": "pull"}})
		expect(t, "Pod label", dig(d, "spec", "template", "metadata", "labels", "team"), "net")
		expect(t, "Pod annotation", dig(d, "spec", "template", "metadata", "annotations", "a"), "b")
		expect(t, "Deployment annotation", dig(d, "metadata", "annotations", "c"), "d")
		expect(t, "ServiceAccount annotation", dig(objs["ServiceAccount "+namespace+"/operator"], "metadata", "annotations", "e"), "f")
		expect(t, "runAsUser", dig(spec, "securityContext", "runAsUser"), float64(1000))
		c := container(t, objs)
		expect(t, "memory limit", dig(c, "resources", "limits", "memory"), "1Gi")
		expect(t, "privileged", dig(c, "securityContext", "privileged"), false)
		env := c["env"].([]any)
		expect(t, "extra env", env[len(env)-1], object{"name": "TS_TAILNET", "value": "example.com"})
	})
	t.Run("another namespace", func(t *testing.T) {
		out, err := run(t, tool(t, "HELM_BIN"), "template", "x", chartDir, "--namespace", "elsewhere")
		if err != nil {
			t.Fatal(err)
		}
		namespaced := 0
		for k, o := range decode(t, out) {
			if ns, ok := dig(o, "metadata").(object)["namespace"]; ok {
				namespaced++
				if ns != "elsewhere" {
					t.Errorf("%s is not in the release's namespace", k)
				}
			}
			for _, s := range asList(o["subjects"]) {
				if s.(object)["namespace"] != "elsewhere" {
					t.Errorf("%s: subject %v is not in the release's namespace", k, s)
				}
			}
		}
		if namespaced < 5 {
			t.Errorf("%d namespaced objects, want the Deployment, ConfigMap, ServiceAccount, Roles and RoleBindings", namespaced)
		}
	})
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
