package kit

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SetCondition records a condition observed at generation gen. It reports whether anything
// changed, so callers write status only when needed.
func SetCondition(conds *[]metav1.Condition, typ string, ok bool, reason, msg string, gen int64) bool {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return meta.SetStatusCondition(conds, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
}
