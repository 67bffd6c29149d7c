package controller

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/tsingress/tsingress/internal/tailnet"
)

// reporter emits a reconciler's Events.
type reporter struct {
	Recorder recorder.EventRecorder
}

func (r reporter) eventf(obj client.Object, typ, reason, format string, a ...any) {
	r.Recorder.Eventf(obj, nil, typ, reason, "Reconcile", format, a...)
}

func (r reporter) findings(obj client.Object, fs []finding) {
	for _, f := range fs {
		typ := corev1.EventTypeNormal
		if f.warning {
			typ = corev1.EventTypeWarning
		}
		r.eventf(obj, typ, f.reason, "%s", f.message)
	}
}

// tailnetFailure turns a control-plane failure into a Warning Event with the API's stable
// reason and a bounded retry; other errors go back to the controller's backoff.
func (r reporter) tailnetFailure(obj client.Object, err error) (ctrl.Result, error) {
	reason := tailnet.ReasonOf(err)
	if reason == "" {
		return ctrl.Result{}, err
	}
	r.eventf(obj, corev1.EventTypeWarning, ReasonTailnetAPIFailed, "control plane: %s: %v", reason, err)
	return ctrl.Result{RequeueAfter: tailnetRetryAfter(err)}, nil
}

func tailnetRetryAfter(err error) time.Duration {
	if d, ok := tailnet.RetryAfter(err); ok && d > tailnetRetry {
		return d
	}
	return tailnetRetry
}
