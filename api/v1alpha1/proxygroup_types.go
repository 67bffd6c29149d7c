package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyGroupType says what a ProxyGroup's replicas do.
// +kubebuilder:validation:Enum=ingress;egress;kube-apiserver
type ProxyGroupType string

const (
	// ProxyGroupTypeIngress replicas serve Ingresses and Services annotated with
	// `tailscale.com/proxy-group: <name>` to the tailnet, through Tailscale Services.
	ProxyGroupTypeIngress ProxyGroupType = "ingress"
	// ProxyGroupTypeEgress is accepted so that existing manifests apply, but this operator does
	// not run egress groups: it reports them as invalid.
	ProxyGroupTypeEgress ProxyGroupType = "egress"
	// ProxyGroupTypeKubeAPIServer is accepted so that existing manifests apply, but this operator
	// does not run API server proxies: it reports them as invalid.
	ProxyGroupTypeKubeAPIServer ProxyGroupType = "kube-apiserver"
)

// Tag is a tailnet ACL tag, such as `tag:k8s`.
// +kubebuilder:validation:Pattern=`^tag:[a-zA-Z][a-zA-Z0-9-]*$`
// +kubebuilder:validation:MaxLength=128
type Tag string

// ProxyGroup is a set of proxy replicas that together serve many Ingresses and Services to the
// tailnet. Each served object gets a Tailscale Service (one MagicDNS name and VIP address)
// advertised by every replica that is ready to serve it, so a replica restart causes no downtime.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=pg
// +kubebuilder:printcolumn:name="Type",type="string",JSONPath=`.spec.type`,description="What the replicas do."
// +kubebuilder:printcolumn:name="Replicas",type="integer",JSONPath=`.spec.replicas`,description="Desired number of replicas."
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=`.status.conditions[?(@.type == "ProxyGroupReady")].status`,description="Whether every replica is up on the tailnet."
// +kubebuilder:printcolumn:name="Available",type="string",JSONPath=`.status.conditions[?(@.type == "ProxyGroupAvailable")].status`,description="Whether at least one replica is up on the tailnet."
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=`.status.conditions[?(@.type == "ProxyGroupReady")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type ProxyGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec describes the group.
	// +required
	Spec ProxyGroupSpec `json:"spec"`

	// Status is the state of the group as the operator last observed it.
	// +optional
	Status ProxyGroupStatus `json:"status,omitzero"`
}

// ProxyGroupSpec describes a ProxyGroup.
// +kubebuilder:validation:XValidation:rule="!has(self.kubeAPIServer) || self.type == 'kube-apiserver'",message="kubeAPIServer applies to ProxyGroups of type kube-apiserver only"
type ProxyGroupSpec struct {
	// Type of the group. Only `ingress` is served by this operator. Immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="type is immutable"
	Type ProxyGroupType `json:"type"`

	// Tags given to the replicas' tailnet devices. Defaults to the operator's proxy tags
	// (tag:k8s unless configured otherwise). The operator's OAuth client must own these tags.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	Tags []Tag `json:"tags,omitempty"`

	// Replicas is the number of proxy replicas. Scaling down removes the surplus replicas'
	// tailnet devices.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas,omitempty"`

	// HostnamePrefix names the replicas' tailnet devices `<prefix>-<ordinal>`. Defaults to the
	// ProxyGroup's name.
	// +optional
	// +kubebuilder:validation:MaxLength=30
	// +kubebuilder:validation:Pattern=`^[a-z0-9][a-z0-9-]{0,28}[a-z0-9]$|^[a-z0-9]$`
	HostnamePrefix string `json:"hostnamePrefix,omitempty"`

	// ProxyClass customises the replicas, overriding the operator's default ProxyClass.
	// +optional
	ProxyClass string `json:"proxyClass,omitempty"`

	// Tailnet names a Tailnet object whose credentials the replicas join another tailnet with;
	// empty is the operator's own. Accepted so that the Tailscale operator's manifests apply;
	// this operator serves its own tailnet only and reports a group naming another as invalid.
	// Immutable.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="ProxyGroup tailnet is immutable"
	Tailnet string `json:"tailnet,omitempty"`

	// KubeAPIServer configures a group of type kube-apiserver, which this operator does not
	// run: accepted so that the Tailscale operator's manifests apply.
	// +optional
	KubeAPIServer *KubeAPIServerConfig `json:"kubeAPIServer,omitempty"`
}

// KubeAPIServerConfig configures the API server proxies of a kube-apiserver ProxyGroup.
type KubeAPIServerConfig struct {
	// Hostname the API server proxies are exposed under; the ProxyGroup's name by default.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`
	Hostname string `json:"hostname,omitempty"`

	// Mode of the API server proxy: auth (requests impersonate the caller's tailnet identity)
	// or noauth.
	// +optional
	// +kubebuilder:validation:Enum=auth;noauth
	Mode *string `json:"mode,omitempty"`
}

// ProxyGroupStatus is the observed state of a ProxyGroup.
type ProxyGroupStatus struct {
	// Conditions: ProxyGroupReady is True when every replica is up on the tailnet;
	// ProxyGroupAvailable is True when at least one is.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Devices lists the replicas that are up on the tailnet.
	// +optional
	// +listType=map
	// +listMapKey=hostname
	Devices []TailnetDevice `json:"devices,omitempty"`

	// URL of a kube-apiserver group's API server proxy; never set by this operator, which runs
	// no such groups.
	// +optional
	URL string `json:"url,omitempty"`
}

// TailnetDevice is a replica's device on the tailnet.
type TailnetDevice struct {
	// Hostname is the device's MagicDNS name.
	// +required
	Hostname string `json:"hostname"`

	// TailnetIPs are the device's tailnet addresses.
	// +optional
	// +listType=atomic
	TailnetIPs []string `json:"tailnetIPs,omitempty"`

	// StaticEndpoints are the endpoints tailnet peers may reach the device at directly, from a
	// ProxyClass's staticEndpoints; none while this operator does not serve them.
	// +optional
	// +listType=atomic
	StaticEndpoints []string `json:"staticEndpoints,omitempty"`
}

// +kubebuilder:object:root=true

// ProxyGroupList is a list of ProxyGroups.
type ProxyGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyGroup `json:"items"`
}
