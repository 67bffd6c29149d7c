package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

const parentTypeIngress = "ingress"

const parentTypeService = "svc"

const secretTypeConfState = "config-state"

// parent identifies the user object a proxy serves.
type parent struct {
	typ, namespace, name string
}

func parentOf(typ string, obj client.Object) parent {
	return parent{typ: typ, namespace: obj.GetNamespace(), name: obj.GetName()}
}

func (p parent) labels() map[string]string {
	return map[string]string{
		LabelManaged:    "true",
		LabelParentName: p.name,
		LabelParentNS:   p.namespace,
		LabelParentType: p.typ,
	}
}

// proxyName is the stable name of a parent's proxy StatefulSet (and prefix of its other
// children): readable, unique per parent (a hash of the full identity is appended), and
// short enough for every Kubernetes name it is used in.
func (p parent) proxyName() string {
	sum := sha256.Sum256([]byte(p.typ + "/" + p.namespace + "/" + p.name))
	suffix := hex.EncodeToString(sum[:])[:8]
	base := dnsLabelish(fmt.Sprintf("ts-%s-%s", p.namespace, p.name))
	if max := maxStatefulSetName - len(suffix) - 1; len(base) > max {
		base = strings.TrimRight(base[:max], "-.")
	}
	return base + "-" + suffix
}

// replicas names the children of a parent's proxy, a single replica.
func (p parent) replicas() replicaSet { return replicaSet{name: p.proxyName()} }
