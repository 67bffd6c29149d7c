package kit

import (
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/tsingress/tsingress/internal/tailnet"
)

// Reporter emits a reconciler's Events when what they say changes, not on every pass: a
// problem (a Warning, or a Normal finding) once while it stands, a step of progress once. Each
// reconciler has its own memory, as an object may be passed from one to another.
type Reporter struct {
	Recorder recorder.EventRecorder
	memory   *EventMemory // nil: every Event is emitted
	// controller names the reconciler in the metrics, which count its passes (nil: none).
	controller string
	metrics    *OperatorMetrics
}

func newReporter(rec recorder.EventRecorder) Reporter {
	return Reporter{Recorder: rec, memory: &EventMemory{objects: map[types.NamespacedName]*objectEvents{}}}
}

// EventMemory is what a reconciler last told about each object, in this process.
type EventMemory struct {
	mu      sync.Mutex
	objects map[types.NamespacedName]*objectEvents
}

type objectEvents struct {
	uid types.UID
	// standing are the problems reported by the last pass that ran to its end; pass, those
	// reported by the pass under way.
	standing, pass map[string]bool
	// progress holds the last message of each step of progress.
	progress map[string]string
	// seen is set once a pass has settled. A step first met in this process before then is
	// remembered silently, so that a restarted operator does not repeat the progress of every
	// object; the first pass of a new object makes no progress that needs reporting that way.
	seen bool
}

// object returns obj's memory, new for an object that was replaced under the same name.
func (m *EventMemory) object(obj client.Object) *objectEvents {
	key := client.ObjectKeyFromObject(obj)
	o := m.objects[key]
	if o == nil || o.uid != obj.GetUID() {
		o = &objectEvents{uid: obj.GetUID(), standing: map[string]bool{}, pass: map[string]bool{}, progress: map[string]string{}}
		m.objects[key] = o
	}
	return o
}

func (r Reporter) emit(obj client.Object, typ, reason, msg string) {
	r.Recorder.Eventf(obj, nil, typ, reason, "Reconcile", "%s", msg)
}

// problem reports a problem of this pass; it is emitted unless it was already standing.
func (r Reporter) problem(obj client.Object, typ, reason, msg string) {
	if r.memory != nil {
		r.memory.mu.Lock()
		o := r.memory.object(obj)
		key := typ + "/" + reason + "/" + msg
		known := o.standing[key] || o.pass[key]
		o.pass[key] = true
		r.memory.mu.Unlock()
		if known {
			return
		}
	}
	r.emit(obj, typ, reason, msg)
}

func (r Reporter) Warning(obj client.Object, reason, format string, a ...any) {
	r.problem(obj, corev1.EventTypeWarning, reason, fmt.Sprintf(format, a...))
}

func (r Reporter) Findings(obj client.Object, fs []Finding) {
	for _, f := range fs {
		typ := corev1.EventTypeNormal
		if f.Warning {
			typ = corev1.EventTypeWarning
		}
		r.problem(obj, typ, f.Reason, f.Message)
	}
}

// Progress reports a step (step names it among the object's steps, e.g. one per replica) as a
// Normal Event, when its message differs from the one last reported for that step.
func (r Reporter) Progress(obj client.Object, step, reason, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if r.memory != nil {
		r.memory.mu.Lock()
		o := r.memory.object(obj)
		last, ok := o.progress[step]
		quiet := (ok && last == msg) || (!ok && !o.seen)
		o.progress[step] = msg
		r.memory.mu.Unlock()
		if quiet {
			return
		}
	}
	r.emit(obj, corev1.EventTypeNormal, reason, msg)
}

// Created reports a step that happened in this pass (a child created), always.
func (r Reporter) Created(obj client.Object, reason, format string, a ...any) {
	r.emit(obj, corev1.EventTypeNormal, reason, fmt.Sprintf(format, a...))
}

// Settle ends a pass. One that ran to its end (complete) decides which problems stand: one it
// did not report is over and is reported again if it comes back. One that stopped on an error
// may not have looked, and forgets nothing.
func (r Reporter) Settle(obj client.Object, complete bool) {
	if r.memory == nil {
		return
	}
	r.memory.mu.Lock()
	defer r.memory.mu.Unlock()
	o := r.memory.object(obj)
	r.metrics.Outcome(r.controller, warningReasons(o.pass), complete)
	if complete {
		o.standing = o.pass
	} else {
		for k := range o.pass {
			o.standing[k] = true
		}
	}
	o.pass, o.seen = map[string]bool{}, true
}

// Forget drops what was told about an object that is gone or no longer served.
func (r Reporter) Forget(key types.NamespacedName) {
	if r.memory == nil {
		return
	}
	r.memory.mu.Lock()
	defer r.memory.mu.Unlock()
	delete(r.memory.objects, key)
}

// TailnetFailure turns a control-plane failure into a Warning Event with the API's stable
// reason and a bounded retry; other errors go back to the controller's backoff.
func (r Reporter) TailnetFailure(obj client.Object, err error) (ctrl.Result, error) {
	reason := tailnet.ReasonOf(err)
	if reason == "" {
		return ctrl.Result{}, err
	}
	r.Warning(obj, ReasonTailnetAPIFailed, "control plane: %s: %v", reason, err)
	return ctrl.Result{RequeueAfter: tailnetRetryAfter(err)}, nil
}

func tailnetRetryAfter(err error) time.Duration {
	if d, ok := tailnet.RetryAfter(err); ok && d > TailnetRetry {
		return d
	}
	return TailnetRetry
}

// TailnetRetry is the least time before retrying after a control-plane error: such errors
// (bad credentials, tags not permitted) rarely fix themselves in seconds.
const TailnetRetry = time.Minute

// CleanupPoll re-checks a cleanup waiting for a StatefulSet, in case a watch event is missed.
const CleanupPoll = 5 * time.Second
