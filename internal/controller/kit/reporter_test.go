package kit

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientevents "k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// drain returns the Events emitted so far, as "Type Reason Message".
func drain(rec *clientevents.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestReporterEmitsOnChange(t *testing.T) {
	rec := clientevents.NewFakeRecorder(100)
	r := newReporter(rec)
	obj := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-1"}}
	pass := func(complete bool, report func()) []string {
		report()
		r.Settle(obj, complete)
		return drain(rec)
	}
	expect := func(what string, got []string, want ...string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: Events %q, want %q", what, got, want)
		}
	}

	expect("first pass: the problem, and progress remembered silently (the operator may just have started)",
		pass(true, func() {
			r.Warning(obj, ReasonInvalidAnnotation, "bad tag %q", "k8s")
			r.Progress(obj, "joined", ReasonDeviceJoined, "joined as web.ts.net")
		}), "Warning InvalidAnnotation bad tag \"k8s\"")
	expect("steady state", pass(true, func() {
		r.Warning(obj, ReasonInvalidAnnotation, "bad tag %q", "k8s")
		r.Progress(obj, "joined", ReasonDeviceJoined, "joined as web.ts.net")
	}))
	expect("a problem reported twice in one pass", pass(true, func() {
		r.Warning(obj, ReasonInvalidAnnotation, "bad tag %q", "k8s")
		r.Warning(obj, ReasonInvalidAnnotation, "bad tag %q", "k8s")
	}))
	expect("a new message and a new step", pass(true, func() {
		r.Warning(obj, ReasonInvalidAnnotation, "bad tag %q", "x")
		r.Progress(obj, "serving", ReasonServing, "serving")
	}), "Warning InvalidAnnotation bad tag \"x\"", "Normal Serving serving")
	expect("a pass stopped by an error forgets nothing", pass(false, func() {}))
	expect("still standing", pass(true, func() { r.Warning(obj, ReasonInvalidAnnotation, "bad tag %q", "x") }))
	expect("fixed", pass(true, func() {}))
	expect("back again", pass(true, func() { r.Warning(obj, ReasonInvalidAnnotation, "bad tag %q", "x") }),
		"Warning InvalidAnnotation bad tag \"x\"")
	expect("progress is told once", pass(true, func() { r.Progress(obj, "serving", ReasonServing, "serving") }))
	r.Created(obj, ReasonProxyDeployed, "created %s", "ts-web")
	expect("a creation is told when it happens", drain(rec), "Normal ProxyDeployed created ts-web")

	r.Forget(client.ObjectKeyFromObject(obj))
	expect("forgotten: told again", pass(true, func() { r.Warning(obj, ReasonInvalidAnnotation, "bad tag %q", "x") }),
		"Warning InvalidAnnotation bad tag \"x\"")
	replaced := obj.DeepCopy()
	replaced.UID = "uid-2"
	expect("an object replaced under the same name starts afresh", pass(true, func() {
		r.Warning(replaced, ReasonInvalidAnnotation, "bad tag %q", "x")
	}), "Warning InvalidAnnotation bad tag \"x\"")
}
