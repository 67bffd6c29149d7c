package kit

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
)

// Outcomes of a reconcile pass that reported no Warning, besides the reasons of those it did.
const (
	OutcomeReconciled = "Reconciled"     // no Warning, no error
	OutcomeError      = "ReconcileError" // ended on an error, retried with backoff
)

// OperatorMetrics are the operator's own metrics, besides controller-runtime's: how reconcile
// passes end, the Warnings that stand, the certificate ledger's use of the CA's weekly limits,
// and the proxies and devices the operator manages. All but the outcomes are read from the
// cache at each scrape.
type OperatorMetrics struct {
	Outcomes *prometheus.CounterVec

	Mu       sync.Mutex
	Memories map[string]*EventMemory // by controller
}

// Reporter returns the Event reporter of a controller, whose passes these metrics count.
func (m *OperatorMetrics) Reporter(rec recorder.EventRecorder, controller string) Reporter {
	r := newReporter(rec)
	r.controller, r.metrics = controller, m
	m.Mu.Lock()
	defer m.Mu.Unlock()
	m.Memories[controller] = r.memory
	return r
}

// Outcome counts a pass: the Warning reasons it reported, or how it ended without any.
func (m *OperatorMetrics) Outcome(controller string, warnings []string, complete bool) {
	if m == nil {
		return
	}
	for _, reason := range warnings {
		m.Outcomes.WithLabelValues(controller, reason).Inc()
	}
	switch {
	case !complete:
		m.Outcomes.WithLabelValues(controller, OutcomeError).Inc()
	case len(warnings) == 0:
		m.Outcomes.WithLabelValues(controller, OutcomeReconciled).Inc()
	}
}

// warningReasons lists the distinct Warning reasons among an object's problem keys
// (type/reason/message).
func warningReasons(keys map[string]bool) []string {
	seen := map[string]bool{}
	var out []string
	for k := range keys {
		parts := strings.SplitN(k, "/", 3)
		if len(parts) == 3 && parts[0] == corev1.EventTypeWarning && !seen[parts[1]] {
			seen[parts[1]] = true
			out = append(out, parts[1])
		}
	}
	return out
}

// StandingWarnings counts, per reason, the objects on which a Warning of that reason stands.
func (m *EventMemory) StandingWarnings() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for _, o := range m.objects {
		for _, reason := range warningReasons(o.standing) {
			out[reason]++
		}
	}
	return out
}
