package proxies

import (
	corev1 "k8s.io/api/core/v1"
)

// A ProxyClass's security contexts are laid over the operator's field by field: a field the
// class leaves unset keeps the operator's protection, so turning one off takes an explicit value
// (runAsNonRoot: false, a seccompProfile of type Unconfined, capabilities.drop: []). Replacing
// the whole context would silently drop seccomp and runAsNonRoot for a class that only meant to
// set a group.

// mergePodSecurity returns base with every field that class sets replaced by the class's.
func mergePodSecurity(base, class *corev1.PodSecurityContext) *corev1.PodSecurityContext {
	if class == nil {
		return base
	}
	out := &corev1.PodSecurityContext{}
	if base != nil {
		out = base.DeepCopy()
	}
	c := class.DeepCopy()
	override(&out.SELinuxOptions, c.SELinuxOptions)
	override(&out.WindowsOptions, c.WindowsOptions)
	override(&out.RunAsUser, c.RunAsUser)
	override(&out.RunAsGroup, c.RunAsGroup)
	override(&out.RunAsNonRoot, c.RunAsNonRoot)
	overrideList(&out.SupplementalGroups, c.SupplementalGroups)
	override(&out.SupplementalGroupsPolicy, c.SupplementalGroupsPolicy)
	override(&out.FSGroup, c.FSGroup)
	overrideList(&out.Sysctls, c.Sysctls)
	override(&out.FSGroupChangePolicy, c.FSGroupChangePolicy)
	override(&out.SeccompProfile, c.SeccompProfile)
	override(&out.AppArmorProfile, c.AppArmorProfile)
	override(&out.SELinuxChangePolicy, c.SELinuxChangePolicy)
	return out
}

// mergeSecurity is mergePodSecurity for a container. Capabilities merge by list: a class that
// adds one keeps the operator's drop of ALL.
func mergeSecurity(base, class *corev1.SecurityContext) *corev1.SecurityContext {
	if class == nil {
		return base
	}
	out := &corev1.SecurityContext{}
	if base != nil {
		out = base.DeepCopy()
	}
	c := class.DeepCopy()
	if c.Capabilities != nil {
		if out.Capabilities == nil {
			out.Capabilities = &corev1.Capabilities{}
		}
		overrideList(&out.Capabilities.Add, c.Capabilities.Add)
		overrideList(&out.Capabilities.Drop, c.Capabilities.Drop)
	}
	override(&out.Privileged, c.Privileged)
	override(&out.SELinuxOptions, c.SELinuxOptions)
	override(&out.WindowsOptions, c.WindowsOptions)
	override(&out.RunAsUser, c.RunAsUser)
	override(&out.RunAsGroup, c.RunAsGroup)
	override(&out.RunAsNonRoot, c.RunAsNonRoot)
	override(&out.ReadOnlyRootFilesystem, c.ReadOnlyRootFilesystem)
	override(&out.AllowPrivilegeEscalation, c.AllowPrivilegeEscalation)
	override(&out.ProcMount, c.ProcMount)
	override(&out.SeccompProfile, c.SeccompProfile)
	override(&out.AppArmorProfile, c.AppArmorProfile)
	return out
}

// override sets *dst to v when the class set v.
func override[T any](dst **T, v *T) {
	if v != nil {
		*dst = v
	}
}

// overrideList sets *dst to v when the class set v; an explicit empty list counts as set.
func overrideList[S ~[]E, E any](dst *S, v S) {
	if v != nil {
		*dst = v
	}
}
