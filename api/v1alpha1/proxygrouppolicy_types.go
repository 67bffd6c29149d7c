package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProxyGroupPolicy limits the ProxyGroups the Ingresses and Services of its namespace may name
// in `tailscale.com/proxy-group`, as the Tailscale operator's kind of the name does. Once a
// namespace has one, an object there may use only a ProxyGroup that one of its policies lists;
// an object that names another is not served (`ProxyGroupNotPermitted`).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=pgp
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=`.metadata.creationTimestamp`
type ProxyGroupPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec lists the ProxyGroups the namespace's objects may use.
	// +optional
	Spec ProxyGroupPolicySpec `json:"spec,omitzero"`

	// Status is the state of the policy as the operator last observed it.
	// +optional
	Status ProxyGroupPolicyStatus `json:"status,omitzero"`
}

// ProxyGroupPolicySpec lists ProxyGroups by name.
type ProxyGroupPolicySpec struct {
	// Ingress names the ProxyGroups the namespace's Ingresses, and its Services exposed to the
	// tailnet (tailscale.com/expose, or loadBalancerClass tailscale), may use. Empty: none.
	// +optional
	Ingress []string `json:"ingress,omitempty"`

	// Egress names the ProxyGroups the namespace's other Services may use, for egress to the
	// tailnet, which this operator does not serve.
	// +optional
	Egress []string `json:"egress,omitempty"`
}

// ProxyGroupPolicyStatus is the observed state of a ProxyGroupPolicy.
type ProxyGroupPolicyStatus struct {
	// Conditions of the policy.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true

// ProxyGroupPolicyList is a list of ProxyGroupPolicies.
type ProxyGroupPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyGroupPolicy `json:"items"`
}
