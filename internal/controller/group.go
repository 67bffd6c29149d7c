package controller

import tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"

const parentTypeProxyGroup = "proxygroup"

const secretTypeState = "state"

const labelReplica = "tailscale.com/replica"

const groupConfigMapSuffix = "-ingress-config"

// group names a ProxyGroup's children.
type group struct{ name string }

func (g group) configMap() string { return g.name + groupConfigMapSuffix }

// replicas names the replicas' children: a config Secret each, which they cannot write.
func (g group) replicas() replicaSet { return replicaSet{name: g.name, separateConfig: true} }

func (g group) labels() map[string]string {
	return map[string]string{LabelManaged: "true", LabelParentName: g.name, LabelParentType: parentTypeProxyGroup}
}

func replicas(pg *tsv1alpha1.ProxyGroup) int {
	if pg.Spec.Replicas == nil {
		return 2
	}
	return int(*pg.Spec.Replicas)
}
