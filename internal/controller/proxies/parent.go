package proxies

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tsingress/tsingress/internal/controller/kit"
)

const ParentTypeIngress = "ingress"

const ParentTypeService = "svc"

// ParentTypeGateway is a Gateway API Gateway served by a standalone proxy.
const ParentTypeGateway = "gateway"

const SecretTypeConfState = "config-state"

// Parent identifies the user object a proxy serves.
type Parent struct {
	Typ, Namespace, Name string
}

func ParentOf(typ string, obj client.Object) Parent {
	return Parent{Typ: typ, Namespace: obj.GetNamespace(), Name: obj.GetName()}
}

func (p Parent) Labels() map[string]string {
	return map[string]string{
		kit.LabelManaged:    "true",
		kit.LabelParentName: p.Name,
		kit.LabelParentNS:   p.Namespace,
		kit.LabelParentType: p.Typ,
	}
}

// ProxyName is the stable name of a parent's proxy StatefulSet (and prefix of its other
// children): readable, unique per parent (a hash of the full identity is appended), and
// short enough for every Kubernetes name it is used in.
func (p Parent) ProxyName() string {
	sum := sha256.Sum256([]byte(p.Typ + "/" + p.Namespace + "/" + p.Name))
	suffix := hex.EncodeToString(sum[:])[:8]
	base := kit.DNSLabelish(fmt.Sprintf("ts-%s-%s", p.Namespace, p.Name))
	if max := kit.MaxStatefulSetName - len(suffix) - 1; len(base) > max {
		base = strings.TrimRight(base[:max], "-.")
	}
	return base + "-" + suffix
}

// replicas names the children of a parent's proxy, a single replica.
func (p Parent) replicas() replicaSet { return replicaSet{name: p.ProxyName()} }
