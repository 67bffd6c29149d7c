package proxies

import (
	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

const ParentTypeProxyGroup = "proxygroup"

const SecretTypeState = "state"

const LabelReplica = "tailscale.com/replica"

const GroupConfigMapSuffix = "-ingress-config"

// Group names a ProxyGroup's children.
type Group struct{ Name string }

func (g Group) ConfigMap() string { return g.Name + GroupConfigMapSuffix }

// Replicas names the replicas' children: a config Secret each, which they cannot write.
func (g Group) Replicas() replicaSet { return replicaSet{name: g.Name, separateConfig: true} }

func (g Group) Labels() map[string]string {
	return map[string]string{kit.LabelManaged: "true", kit.LabelParentName: g.Name, kit.LabelParentType: ParentTypeProxyGroup}
}

func Replicas(pg *tsv1alpha1.ProxyGroup) int {
	if pg.Spec.Replicas == nil {
		return 2
	}
	return int(*pg.Spec.Replicas)
}
