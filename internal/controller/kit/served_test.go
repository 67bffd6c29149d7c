package kit

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientevents "k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// The skeleton hands each object to the right step: a served one to Serve with the finalizer
// on, one it does not serve to Unserve, a missing one to neither.
func TestServed(t *testing.T) {
	for _, tc := range []struct {
		name          string
		exists        bool
		serves        bool
		wantServe     bool
		wantUnserve   bool
		wantFinalizer bool
	}{
		{name: "served", exists: true, serves: true, wantServe: true, wantFinalizer: true},
		{name: "not served", exists: true, serves: false, wantUnserve: true},
		{name: "gone", exists: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
			b := fake.NewClientBuilder()
			if tc.exists {
				b = b.WithObjects(svc)
			}
			c := b.Build()
			var served, unserved bool
			s := Served[*corev1.Service]{
				Client: c, Reporter: newReporter(clientevents.NewFakeRecorder(10)), Kind: "Service", Finalizer: FinalizerName,
				New:    func() *corev1.Service { return &corev1.Service{} },
				Serves: func(*corev1.Service) bool { return tc.serves },
				Serve:  func(context.Context, *corev1.Service) (ctrl.Result, error) { served = true; return ctrl.Result{}, nil },
				Unserve: func(context.Context, *corev1.Service) (ctrl.Result, error) {
					unserved = true
					return ctrl.Result{}, nil
				},
			}
			if _, err := s.Reconcile(t.Context(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(svc)}); err != nil {
				t.Fatal(err)
			}
			if served != tc.wantServe || unserved != tc.wantUnserve {
				t.Errorf("served %v, unserved %v; want %v, %v", served, unserved, tc.wantServe, tc.wantUnserve)
			}
			if !tc.exists {
				return
			}
			got := &corev1.Service{}
			if err := c.Get(t.Context(), client.ObjectKeyFromObject(svc), got); err != nil {
				t.Fatal(err)
			}
			if has := controllerutil.ContainsFinalizer(got, FinalizerName); has != tc.wantFinalizer {
				t.Errorf("finalizer present %v, want %v", has, tc.wantFinalizer)
			}
		})
	}
}

// Unserved clears the status of an object that stays and removes the finalizer either way.
func TestUnserved(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Finalizers: []string{FinalizerName}}}
	c := fake.NewClientBuilder().WithObjects(svc).Build()
	cleared := false
	if _, err := Unserved(t.Context(), c, newReporter(clientevents.NewFakeRecorder(10)), svc, FinalizerName, func(context.Context) error {
		cleared = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := &corev1.Service{}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(svc), got); err != nil {
		t.Fatal(err)
	}
	if !cleared || controllerutil.ContainsFinalizer(got, FinalizerName) {
		t.Errorf("status cleared %v, finalizers %v; want cleared and none", cleared, got.Finalizers)
	}
}
