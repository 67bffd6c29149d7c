package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyClass customises the proxies that the operator runs for Ingresses, Services and
// ProxyGroups. An object picks a ProxyClass with the `tailscale.com/proxy-class` label (or
// annotation); a ProxyGroup with spec.proxyClass. The operator's default ProxyClass applies to the
// rest. Fields left empty keep the operator's defaults.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=pc
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=`.status.conditions[?(@.type == "ProxyClassReady")].reason`,description="Whether the ProxyClass is valid and ready for use."
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type ProxyClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec describes how the proxies that use this class are run.
	// +required
	Spec ProxyClassSpec `json:"spec"`

	// Status is the state of the ProxyClass as the operator last observed it.
	// +optional
	Status ProxyClassStatus `json:"status,omitzero"`
}

// ProxyClassSpec describes how proxies are run.
// +kubebuilder:validation:XValidation:rule="!has(self.metrics) || !has(self.metrics.serviceMonitor) || !self.metrics.serviceMonitor.enable || self.metrics.enable",message="metrics.serviceMonitor.enable requires metrics.enable"
type ProxyClassSpec struct {
	// StatefulSet customises the StatefulSet that runs the proxy Pods.
	// +optional
	StatefulSet *StatefulSet `json:"statefulSet,omitempty"`

	// Metrics enables the proxies' Prometheus metrics endpoint (port 9002, path /metrics), and
	// optionally a ServiceMonitor for the Prometheus Operator.
	// +optional
	Metrics *Metrics `json:"metrics,omitempty"`

	// Tailscale sets options of the proxies' tailnet nodes.
	// +optional
	Tailscale *TailscaleConfig `json:"tailscale,omitempty"`

	// UseLetsEncryptStagingEnvironment makes the proxies request certificates from Let's
	// Encrypt's staging directory. Staging certificates are not trusted by browsers, but staging
	// has far higher rate limits: use it while testing. Switching back to production issues new
	// certificates.
	// +optional
	UseLetsEncryptStagingEnvironment bool `json:"useLetsEncryptStagingEnvironment,omitempty"`

	// StaticEndpoints would advertise NodePort endpoints for direct connections from tailnet
	// peers. Accepted so that the Tailscale operator's manifests apply; not served yet: the
	// ProxyClass says so in a Warning, and the proxies are reached as without it.
	// +optional
	StaticEndpoints *StaticEndpointsConfig `json:"staticEndpoints,omitempty"`
}

// StaticEndpointsConfig configures static endpoints.
type StaticEndpointsConfig struct {
	// NodePort configures static endpoints on NodePort Services.
	// +required
	NodePort *NodePortConfig `json:"nodePort"`
}

// NodePortConfig picks the NodePorts and the nodes whose ExternalIPs are advertised.
type NodePortConfig struct {
	// Ports are the port ranges the NodePorts are taken from.
	// +required
	// +kubebuilder:validation:MinItems=1
	Ports []PortRange `json:"ports"`

	// Selector picks the nodes whose ExternalIPs are advertised.
	// +optional
	Selector map[string]string `json:"selector,omitempty"`
}

// PortRange is a port, or the ports from Port to EndPort inclusive.
type PortRange struct {
	// Port is the first port of the range.
	// +required
	Port int32 `json:"port"`

	// EndPort is the last port of the range; unset for a single port.
	// +optional
	EndPort int32 `json:"endPort,omitempty"`
}

// StatefulSet customises a proxy StatefulSet.
type StatefulSet struct {
	// Labels added to the StatefulSet. Labels the operator manages cannot be overridden.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations added to the StatefulSet. Annotations the operator manages cannot be overridden.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// Pod customises the proxy Pods.
	// +optional
	Pod *Pod `json:"pod,omitempty"`
}

// Pod customises proxy Pods.
type Pod struct {
	// Labels added to the Pods. Labels the operator manages cannot be overridden.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations added to the Pods.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// Affinity rules for scheduling the Pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// Tolerations for the Pods.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// NodeSelector for the Pods.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// NodeName pins the Pods to one node.
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// TopologySpreadConstraints for the Pods, for example to spread ProxyGroup replicas across zones.
	// +optional
	// +listType=atomic
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`

	// PriorityClassName for the Pods.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// SecurityContext of the Pods. An L3 proxy needs IP forwarding on in its Pod: a
	// securityContext.sysctls entry net.ipv4.ip_forward=1 (and net.ipv6.conf.all.forwarding=1)
	// does that without the privileged init container, which the operator then leaves out; the
	// kubelet must allow these unsafe sysctls (--allowed-unsafe-sysctls).
	// +optional
	SecurityContext *corev1.PodSecurityContext `json:"securityContext,omitempty"`

	// ImagePullSecrets for pulling the proxy image from a private registry.
	// +optional
	// +listType=atomic
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// DNSPolicy of the Pods.
	// +optional
	// +kubebuilder:validation:Enum=ClusterFirstWithHostNet;ClusterFirst;Default;None
	DNSPolicy *corev1.DNSPolicy `json:"dnsPolicy,omitempty"`

	// DNSConfig of the Pods.
	// +optional
	DNSConfig *corev1.PodDNSConfig `json:"dnsConfig,omitempty"`

	// TailscaleContainer customises the proxy container.
	// +optional
	TailscaleContainer *Container `json:"tailscaleContainer,omitempty"`

	// TailscaleInitContainer customises the init container that enables IP forwarding for
	// kernel-mode (L3) proxies: a privileged container named sysctler that runs the proxy image's
	// `proxy sysctl` (those of Services and ProxyGroups). L7 proxies have none: an Ingress's
	// proxy ignores the field, with a Warning Event (ProxyClassFieldIgnored). A class whose Pod
	// sysctls turn forwarding on has none either, and is refused with this field set.
	// +optional
	TailscaleInitContainer *Container `json:"tailscaleInitContainer,omitempty"`
}

// Container customises a proxy container.
type Container struct {
	// Env variables added to the container, after the operator's own. A variable set here
	// overrides the operator's value of the same name; overriding a TS_* variable is allowed but
	// reported with a Warning Event, because it changes how the proxy behaves.
	// +optional
	// +listType=atomic
	Env []Env `json:"env,omitempty"`

	// Image of the container, overriding the operator's proxy image.
	// +optional
	Image string `json:"image,omitempty"`

	// ImagePullPolicy of the container.
	// +optional
	// +kubebuilder:validation:Enum=Always;Never;IfNotPresent
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Resources of the container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// SecurityContext of the container. The proxy needs NET_ADMIN for kernel DNAT; removing it
	// breaks L3 proxies.
	// +optional
	SecurityContext *corev1.SecurityContext `json:"securityContext,omitempty"`

	// Debug enables the proxy's debug endpoints (pprof) on port 9001.
	// +optional
	Debug *Debug `json:"debug,omitempty"`
}

// Env is one environment variable.
type Env struct {
	// Name of the variable.
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z][-._a-zA-Z0-9]*$`
	// +required
	Name string `json:"name"`

	// Value of the variable.
	// +optional
	Value string `json:"value,omitempty"`
}

// Debug configures the debug endpoints.
type Debug struct {
	// Enable serves pprof and other debug handlers on port 9001 of the Pod IP.
	// +optional
	Enable bool `json:"enable,omitempty"`
}

// Metrics configures the proxies' metrics.
type Metrics struct {
	// Enable serves Prometheus metrics on port 9002 of the Pod IP, path /metrics, and creates a
	// Service named `<proxy>-metrics` in front of it. Turning it on or off restarts no proxy.
	// +required
	Enable bool `json:"enable"`

	// ServiceMonitor creates a Prometheus Operator ServiceMonitor for the metrics Service.
	// Requires metrics.enable and the ServiceMonitor CRD in the cluster.
	// +optional
	ServiceMonitor *ServiceMonitor `json:"serviceMonitor,omitempty"`
}

// ServiceMonitor configures a Prometheus Operator ServiceMonitor.
type ServiceMonitor struct {
	// Enable creates the ServiceMonitor.
	// +required
	Enable bool `json:"enable"`

	// Labels added to the ServiceMonitor, for example the label your Prometheus selects on.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
}

// TailscaleConfig sets options of a proxy's tailnet node.
type TailscaleConfig struct {
	// AcceptRoutes makes the proxies accept subnet routes advertised by other tailnet nodes
	// (tailscale's --accept-routes): their tailnet node sends traffic for those subnets to the
	// routers, so that an L7 proxy answers clients behind a subnet router that keeps their
	// addresses. L3 proxies route only tailnet addresses into their tunnel. Changing it restarts
	// the proxies.
	// +optional
	AcceptRoutes bool `json:"acceptRoutes,omitempty"`
}

// ProxyClassStatus is the observed state of a ProxyClass.
type ProxyClassStatus struct {
	// Conditions: ProxyClassReady is True when the class is valid. Its observedGeneration tells
	// whether the operator has seen the latest spec.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true

// ProxyClassList is a list of ProxyClasses.
type ProxyClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyClass `json:"items"`
}
