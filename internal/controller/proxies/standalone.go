package proxies

import (
	"fmt"
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/contract"
	"github.com/tsingress/tsingress/internal/controller/certs"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// LetsEncryptStaging is the ACME directory a ProxyClass's useLetsEncryptStagingEnvironment picks.
const LetsEncryptStaging = "https://acme-staging-v02.api.letsencrypt.org/directory"

// Ports of the proxy container.
const (
	HealthPort = 9002 // /healthz, /readyz and /metrics
	debugPort  = 9001
)

// StandaloneProxy is everything that decides a standalone proxy's child objects: one Pod
// (a single-replica StatefulSet) with a combined config and state Secret, and RBAC that lets it
// touch only that Secret.
type StandaloneProxy struct {
	Parent Parent
	// Config is the proxy config without auth key and state Secret, which the builders add.
	Config contract.ProxyConfig
	Class  *tsv1alpha1.ProxyClass // nil: no ProxyClass
	// Kernel proxies (L3) need NET_ADMIN and a TUN device; L7 proxies run unprivileged.
	Kernel bool
	// CertSecrets are copies of bring-your-own certificate Secrets the proxy reads.
	CertSecrets []*corev1.Secret
}

func (p *StandaloneProxy) Name() string { return p.Parent.ProxyName() }

// secretName is the combined config and state Secret.
func (p *StandaloneProxy) secretName() string { return p.Parent.replicas().StateSecret(0) }

func (p *StandaloneProxy) meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: p.Parent.Labels()}
}

// acmeDirectory is the ACME directory of a proxy of the given class: Let's Encrypt's staging one
// when the class asks for it, else the operator's (empty: Let's Encrypt).
func ACMEDirectory(s kit.Settings, class *tsv1alpha1.ProxyClass) string {
	if class != nil && class.Spec.UseLetsEncryptStagingEnvironment {
		return LetsEncryptStaging
	}
	return s.ACMEDirectoryURL
}

// ProxyConfig is the full config, with the given auth key ("" once the device is logged in).
func (p *StandaloneProxy) ProxyConfig(authKey string) *contract.ProxyConfig {
	cfg := p.Config
	cfg.AuthKey = authKey
	cfg.StateSecret = p.secretName()
	if pc := p.Class; pc != nil {
		if pc.Spec.Tailscale != nil {
			cfg.AcceptRoutes = pc.Spec.Tailscale.AcceptRoutes
		}
	}
	cfg.Metrics = MetricsEnabled(p.Class)
	return &cfg
}

func (p *StandaloneProxy) buildSecret(namespace, authKey string) (*corev1.Secret, error) {
	data, err := contract.ProxyConfigs.Encode(p.ProxyConfig(authKey))
	if err != nil {
		return nil, fmt.Errorf("encoding the proxy config of %s: %w", p.secretName(), err)
	}
	s := p.configSecret(namespace)
	s.Data = data
	return s, nil
}

// configSecret is the Secret of the proxy's config and state, without data.
func (p *StandaloneProxy) configSecret(namespace string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: p.meta(p.secretName())}
	s.Namespace = namespace
	s.Labels[kit.LabelSecretType] = SecretTypeConfState
	return s
}

func (p *StandaloneProxy) buildServiceAccount(namespace string) *corev1.ServiceAccount {
	sa := &corev1.ServiceAccount{ObjectMeta: p.meta(p.Name())}
	sa.Namespace = namespace
	sa.AutomountServiceAccountToken = ptr.To(true)
	return sa
}

// buildRole lets the proxy read and write its own Secret and nothing else. Watching one
// object by name needs list and watch with a resourceNames rule (field selector metadata.name).
func (p *StandaloneProxy) buildRole(namespace string) *rbacv1.Role {
	r := &rbacv1.Role{ObjectMeta: p.meta(p.Name()), Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{p.secretName()},
			Verbs: []string{"get", "list", "watch", "patch"}},
	}}
	if len(p.CertSecrets) > 0 {
		r.Rules = append(r.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"},
			ResourceNames: certs.SecretNames(p.CertSecrets), Verbs: []string{"get", "list", "watch"}})
	}
	r.Namespace = namespace
	return r
}

// buildRoleBinding binds the proxy's Role, in w.State, to its ServiceAccount in each
// namespace its Pods may run in.
func (p *StandaloneProxy) buildRoleBinding(w Where) *rbacv1.RoleBinding {
	rb := &rbacv1.RoleBinding{
		ObjectMeta: p.meta(p.Name()),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: p.Name()},
		Subjects:   ServiceAccountSubjects(p.Name(), p.podNamespaces(w)),
	}
	rb.Namespace = w.State
	return rb
}

// podNamespaces are the namespaces the proxy's Pods may run in: an L7 proxy's only in the
// operator's, a kernel one's also in the privileged namespace (it moves there).
func (p *StandaloneProxy) podNamespaces(w Where) []string {
	if !p.Kernel {
		return []string{w.State}
	}
	return w.Pods
}

// ServiceAccountSubjects are the ServiceAccounts named name in each of namespaces.
func ServiceAccountSubjects(name string, namespaces []string) []rbacv1.Subject {
	subjects := make([]rbacv1.Subject, 0, len(namespaces))
	for _, ns := range namespaces {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns})
	}
	return subjects
}

// Selector selects the proxy's Pod.
func (p *StandaloneProxy) Selector() map[string]string {
	return map[string]string{kit.LabelParentType: p.Parent.Typ, kit.LabelParentNS: p.Parent.Namespace, kit.LabelParentName: p.Parent.Name}
}

func (p *StandaloneProxy) BuildStatefulSet(s kit.Settings) *appsv1.StatefulSet {
	return ProxyPods{
		Name:           p.Name(),
		Namespace:      s.PodNamespace(p.Kernel),
		StateNamespace: s.Namespace,
		Labels:         p.Parent.Labels(),
		Selector:       p.Selector(),
		Replicas:       1,
		Args:           []string{"--config-secret=" + p.secretName()},
		Kernel:         p.Kernel,
		Image:          s.ProxyImage,
		CaBundle:       s.ProxyCAConfigMap,
		NoLogs:         s.ProxyNoLogs,
		Class:          p.Class,
	}.Build()
}

// ProxyPods describes a StatefulSet of proxies, standalone or a ProxyGroup's.
type ProxyPods struct {
	Name, Namespace  string
	StateNamespace   string // of its Secrets and the group's ConfigMaps, when not Namespace
	Labels, Selector map[string]string
	Replicas         int32
	Args             []string // besides the health address
	Kernel           bool     // L3: root with NET_ADMIN and /dev/net/tun, forwarding on
	Image            string
	CaBundle         string // ConfigMap of extra roots, mounted for SSL_CERT_DIR; none when empty
	NoLogs           bool   // the operator forbids log upload, whatever the control server
	Class            *tsv1alpha1.ProxyClass
}

// caBundleDir is where a proxy finds the operator's extra roots; Go reads every file there besides
// the system bundle.
const caBundleDir = "/etc/tsingress/ca-certificates"

// Forwarding sysctls an L3 proxy needs in its Pod's network namespace.
const (
	SysctlIPv4Forward = "net.ipv4.ip_forward"
	SysctlIPv6Forward = "net.ipv6.conf.all.forwarding"
)

// initContainerName is the forwarding init container's, as the original operator names it.
const initContainerName = "sysctler"

// forwardingInitContainer turns IP forwarding on in the Pod's network namespace, which a
// container that is not privileged sees read-only even with NET_ADMIN. It runs the proxy image
// (`proxy sysctl`), privileged: that is the whole point, and it exits before the proxy starts.
// The proxy reports on the Service whatever it could not turn on.
func forwardingInitContainer(image string) corev1.Container {
	return corev1.Container{
		Name:            initContainerName,
		Image:           image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args:            []string{"sysctl"},
		SecurityContext: &corev1.SecurityContext{
			Privileged:   ptr.To(true),
			RunAsUser:    ptr.To[int64](0),
			RunAsNonRoot: ptr.To(false),
		},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: MustQuantity("1m"), corev1.ResourceMemory: MustQuantity("1Mi"),
		}},
	}
}

// InitContainerIgnored is the finding of an Ingress's (L7) proxy whose class customises an init
// container it does not have: nothing breaks, so it only says so.
func InitContainerIgnored(pc *tsv1alpha1.ProxyClass) *kit.Finding {
	if pc == nil || pc.Spec.StatefulSet == nil || pc.Spec.StatefulSet.Pod == nil || pc.Spec.StatefulSet.Pod.TailscaleInitContainer == nil {
		return nil
	}
	f := kit.Warnf(kit.ReasonProxyClassFieldIgnored, "ProxyClass %q sets tailscaleInitContainer, which an Ingress's proxy does not have (it needs no IP forwarding); the field is ignored here", pc.Name)
	return &f
}

// MetricsEnabled reports whether a ProxyClass has its proxies serve metrics.
func MetricsEnabled(pc *tsv1alpha1.ProxyClass) bool {
	return pc != nil && pc.Spec.Metrics != nil && pc.Spec.Metrics.Enable
}

// PodSysctlForwarding reports whether a ProxyClass turns forwarding on through the Pod's sysctls
// (the kubelet must allow the unsafe sysctls: --allowed-unsafe-sysctls), for IPv4, IPv6 or both,
// in which case its proxies have no privileged init container: the class says how forwarding is
// turned on, and a family it leaves off is reported not forwarded (IPFamilyNotForwarded), as an
// IPv6-only cluster needs only net.ipv6.conf.all.forwarding.
func PodSysctlForwarding(spec *tsv1alpha1.ProxyClassSpec) bool {
	if spec == nil || spec.StatefulSet == nil || spec.StatefulSet.Pod == nil || spec.StatefulSet.Pod.SecurityContext == nil {
		return false
	}
	for _, sc := range spec.StatefulSet.Pod.SecurityContext.Sysctls {
		if (sc.Name == SysctlIPv4Forward || sc.Name == SysctlIPv6Forward) && sc.Value == "1" {
			return true
		}
	}
	return false
}

func (pp ProxyPods) Build() *appsv1.StatefulSet {
	podLabels := maps.Clone(pp.Labels)
	podLabels["app.kubernetes.io/name"] = "tsingress-proxy"

	container := corev1.Container{
		Name:            "proxy",
		Image:           pp.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args:            append(slices.Clone(pp.Args), fmt.Sprintf("--health-addr=:%d", HealthPort)),
		Env: []corev1.EnvVar{
			fieldEnv("POD_NAME", "metadata.name"),
			fieldEnv("POD_NAMESPACE", "metadata.namespace"),
			fieldEnv("POD_UID", "metadata.uid"),
			fieldEnv("POD_IP", "status.podIP"),
		},
		Ports: []corev1.ContainerPort{{Name: "health", ContainerPort: HealthPort, Protocol: corev1.ProtocolTCP}},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrName("health")}},
			PeriodSeconds:    10,
			FailureThreshold: 6,
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstrName("health")}},
			PeriodSeconds: 5,
		},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: MustQuantity("5m"), corev1.ResourceMemory: MustQuantity("32Mi"),
		}},
		VolumeMounts: []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
	}
	if pp.StateNamespace != "" && pp.StateNamespace != pp.Namespace {
		container.Args = append(container.Args, "--namespace="+pp.StateNamespace)
	}
	if pp.NoLogs {
		container.Env = append(container.Env, corev1.EnvVar{Name: "TS_NO_LOGS_NO_SUPPORT", Value: "true"})
	}
	podSecurity := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	if pp.Kernel {
		// Kernel DNAT and the TUN device need root with NET_ADMIN (and NET_RAW for the
		// iptables tools); nothing more.
		container.SecurityContext = &corev1.SecurityContext{
			RunAsUser:    ptr.To[int64](0),
			RunAsNonRoot: ptr.To(false),
			Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}, Drop: []corev1.Capability{"ALL"}},
		}
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: "dev-net-tun", MountPath: "/dev/net/tun"})
	} else {
		podSecurity.RunAsNonRoot = ptr.To(true)
		podSecurity.RunAsUser = ptr.To[int64](65532)
		container.SecurityContext = &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
	}
	volumes := []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	if pp.CaBundle != "" {
		container.Env = append(container.Env, corev1.EnvVar{Name: "SSL_CERT_DIR", Value: caBundleDir})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: "ca-bundle", MountPath: caBundleDir, ReadOnly: true})
		volumes = append(volumes, corev1.Volume{Name: "ca-bundle", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: pp.CaBundle}}}})
	}
	var initContainers []corev1.Container
	if pp.Kernel {
		volumes = append(volumes, corev1.Volume{Name: "dev-net-tun", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/dev/net/tun", Type: ptr.To(corev1.HostPathCharDev)}}})
		if pp.Class == nil || !PodSysctlForwarding(&pp.Class.Spec) {
			initContainers = append(initContainers, forwardingInitContainer(pp.Image))
		}
	}

	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: pp.Name, Namespace: pp.Namespace, Labels: maps.Clone(pp.Labels)},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(pp.Replicas),
			ServiceName: pp.Name,
			Selector:    &metav1.LabelSelector{MatchLabels: pp.Selector},
			// Replicas of a group start and stop independently; ordered roll-outs would only slow them.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            pp.Name,
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					SecurityContext:               podSecurity,
					InitContainers:                initContainers,
					Containers:                    []corev1.Container{container},
					Volumes:                       volumes,
				},
			},
		},
	}
	if pp.Class != nil {
		applyProxyClass(sts, pp.Class)
	}
	return sts
}

// applyProxyClass overlays a ProxyClass on a proxy StatefulSet. The operator's own labels and
// selector always win, so a class cannot detach the StatefulSet from its parent.
func applyProxyClass(sts *appsv1.StatefulSet, pc *tsv1alpha1.ProxyClass) {
	spec := pc.Spec
	if spec.StatefulSet == nil {
		return
	}
	ss := spec.StatefulSet
	sts.Labels = mergeKeep(sts.Labels, ss.Labels)
	sts.Annotations = mergeKeep(sts.Annotations, ss.Annotations)
	p := ss.Pod
	if p == nil {
		return
	}
	tpl := &sts.Spec.Template
	tpl.Labels = mergeKeep(tpl.Labels, p.Labels)
	tpl.Annotations = mergeKeep(tpl.Annotations, p.Annotations)
	ps := &tpl.Spec
	ps.Affinity = p.Affinity
	ps.Tolerations = p.Tolerations
	ps.NodeSelector = p.NodeSelector
	ps.NodeName = p.NodeName
	ps.TopologySpreadConstraints = p.TopologySpreadConstraints
	ps.PriorityClassName = p.PriorityClassName
	ps.ImagePullSecrets = p.ImagePullSecrets
	ps.SecurityContext = mergePodSecurity(ps.SecurityContext, p.SecurityContext)
	if p.DNSPolicy != nil {
		ps.DNSPolicy = *p.DNSPolicy
	}
	ps.DNSConfig = p.DNSConfig
	if c := p.TailscaleContainer; c != nil {
		applyContainer(&ps.Containers[0], c)
	}
	if c := p.TailscaleInitContainer; c != nil {
		for i := range ps.InitContainers {
			if ps.InitContainers[i].Name == initContainerName {
				applyContainer(&ps.InitContainers[i], c)
			}
		}
	}
}

func applyContainer(dst *corev1.Container, c *tsv1alpha1.Container) {
	if c.Image != "" {
		dst.Image = c.Image
	}
	if c.ImagePullPolicy != "" {
		dst.ImagePullPolicy = c.ImagePullPolicy
	}
	if len(c.Resources.Requests) > 0 || len(c.Resources.Limits) > 0 || len(c.Resources.Claims) > 0 {
		dst.Resources = c.Resources
	}
	dst.SecurityContext = mergeSecurity(dst.SecurityContext, c.SecurityContext)
	// Later entries override earlier ones of the same name in a container's env.
	for _, e := range c.Env {
		dst.Env = append(dst.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	if c.Debug != nil && c.Debug.Enable {
		dst.Args = append(dst.Args, fmt.Sprintf("--debug-addr=:%d", debugPort))
		dst.Ports = append(dst.Ports, corev1.ContainerPort{Name: "debug", ContainerPort: debugPort, Protocol: corev1.ProtocolTCP})
	}
}

// mergeKeep adds extra's entries to base without overriding base's.
func mergeKeep(base, extra map[string]string) map[string]string {
	if len(extra) == 0 {
		return base
	}
	out := maps.Clone(extra)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, base)
	return out
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

func intstrName(name string) intstr.IntOrString { return intstr.FromString(name) }

func MustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
