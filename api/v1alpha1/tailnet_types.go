package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Tailnet is another tailnet the Tailscale operator's ProxyGroups may join (spec.tailnet), with
// the credentials of an OAuth client of it: the kind of the name the Tailscale operator defines,
// accepted so that its users' manifests apply. This operator serves its own tailnet only: a
// Tailnet is reported TailnetReady=False (TailnetNotServed), and a ProxyGroup that names one is
// refused (ProxyGroupInvalid).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=tn
// +kubebuilder:printcolumn:name="Status",type="string",JSONPath=`.status.conditions[?(@.type == "TailnetReady")].reason`,description="Status of the deployed Tailnet resources."
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type Tailnet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec names the tailnet's control server and credentials.
	Spec TailnetSpec `json:"spec"`

	// Status is the state of the Tailnet as the operator last observed it.
	// +optional
	Status TailnetStatus `json:"status,omitzero"`
}

// TailnetSpec is where a tailnet is and how to authenticate with it.
type TailnetSpec struct {
	// LoginURL is the tailnet's control server; empty means Tailscale's.
	// +optional
	LoginURL string `json:"loginUrl,omitempty"`

	// Credentials name the Secret of the tailnet's OAuth client.
	Credentials TailnetCredentials `json:"credentials"`
}

// TailnetCredentials name the Secret, in the operator's namespace, holding client_id and either
// client_secret or audience (workload identity federation).
type TailnetCredentials struct {
	// SecretName is the Secret's name.
	SecretName string `json:"secretName"`
}

// TailnetStatus is the observed state of a Tailnet.
type TailnetStatus struct {
	// Conditions of the Tailnet: TailnetReady.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true

// TailnetList is a list of Tailnets.
type TailnetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Tailnet `json:"items"`
}
