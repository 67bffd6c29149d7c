// Package v1alpha1 holds the tailscale.com/v1alpha1 API: ProxyClass, ProxyGroup and
// ProxyGroupPolicy.
//
// +kubebuilder:object:generate=true
// +groupName=tailscale.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "tailscale.com", Version: "v1alpha1"}

	// SchemeBuilder registers this package's kinds with a runtime.Scheme. It is apimachinery's,
	// not controller-runtime's (deprecated), so that importing the API brings in no more than
	// apimachinery.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers every kind of this package, and the meta/v1 types (ListOptions and
// the like) for its group version.
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&ProxyClass{}, &ProxyClassList{},
		&ProxyGroup{}, &ProxyGroupList{},
		&ProxyGroupPolicy{}, &ProxyGroupPolicyList{},
		&Tailnet{}, &TailnetList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
