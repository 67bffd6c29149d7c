package proxytest

import corev1 "k8s.io/api/core/v1"

// EnvValue returns the value a container's environment gives name: its last entry wins, as in
// a running container.
func EnvValue(env []corev1.EnvVar, name string) string {
	v := ""
	for _, e := range env {
		if e.Name == name {
			v = e.Value
		}
	}
	return v
}
