package proxies

import (
	"cmp"
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tsv1alpha1 "github.com/tsingress/tsingress/api/v1alpha1"
	"github.com/tsingress/tsingress/internal/controller/kit"
)

// ProxyClassOf names the ProxyClass that applies to the proxies of obj: a ProxyGroup's
// spec.proxyClass, an Ingress's or Service's label (else annotation), else the operator's
// default (def).
func ProxyClassOf(obj client.Object, def string) string {
	if pg, ok := obj.(*tsv1alpha1.ProxyGroup); ok {
		return cmp.Or(pg.Spec.ProxyClass, def)
	}
	return cmp.Or(obj.GetLabels()[kit.LabelProxyClass], obj.GetAnnotations()[kit.LabelProxyClass], def)
}

// appliedClass is the ProxyClass that applies to a proxy.
type appliedClass struct {
	found *tsv1alpha1.ProxyClass // as it is, ready or not; nil when none applies or it is missing
	// NotReady says why proxies cannot be configured with it yet; "" when they can.
	NotReady string
}

// Ready is the class to configure proxies with (nil: none), once notReady is "".
func (a appliedClass) Ready() *tsv1alpha1.ProxyClass {
	if a.NotReady != "" {
		return nil
	}
	return a.found
}

// Staging reports whether the class picks Let's Encrypt's staging directory, whose limits are
// for testing. A class being validated again still describes the proxies configured with it.
func (a appliedClass) Staging() bool {
	return a.found != nil && a.found.Spec.UseLetsEncryptStagingEnvironment
}

// ResolveProxyClass finds the ProxyClass that applies to the proxies of obj.
func ResolveProxyClass(ctx context.Context, c client.Reader, obj client.Object, def string) (appliedClass, error) {
	return ResolveProxyClassNamed(ctx, c, ProxyClassOf(obj, def))
}

// ResolveProxyClassNamed finds the ProxyClass of that name ("": none applies), for objects that
// name it elsewhere than in a label (a Gateway, through its GatewayClass's parametersRef).
func ResolveProxyClassNamed(ctx context.Context, c client.Reader, name string) (appliedClass, error) {
	if name == "" {
		return appliedClass{}, nil
	}
	pc := &tsv1alpha1.ProxyClass{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, pc); err != nil {
		if !apierrors.IsNotFound(err) {
			return appliedClass{}, fmt.Errorf("reading ProxyClass %s: %w", name, err)
		}
		pc = nil
	}
	return appliedClass{found: pc, NotReady: classNotReady(name, pc)}, nil
}

// classNotReady says why the named ProxyClass (nil: missing) cannot be used yet, or "".
func classNotReady(name string, pc *tsv1alpha1.ProxyClass) string {
	if pc == nil {
		return fmt.Sprintf("ProxyClass %q does not exist", name)
	}
	cond := meta.FindStatusCondition(pc.Status.Conditions, tsv1alpha1.ProxyClassReady)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.ObservedGeneration != pc.Generation {
		return fmt.Sprintf("ProxyClass %q is not ready", name)
	}
	return ""
}
