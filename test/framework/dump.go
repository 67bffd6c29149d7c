package framework

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DumpEvents writes a namespace's Events to GinkgoWriter, oldest first, for a failed spec.
func (c *Cluster) DumpEvents(ctx context.Context, ns string) {
	events := &corev1.EventList{}
	if err := c.K8s.List(ctx, events, client.InNamespace(ns)); err != nil {
		GinkgoWriter.Printf("listing the Events of %s: %v\n", ns, err)
		return
	}
	slices.SortFunc(events.Items, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	GinkgoWriter.Printf("\n----- Events in namespace %s -----\n", ns)
	for _, e := range events.Items {
		GinkgoWriter.Printf("%s %s %s/%s %s: %s\n", eventTime(e).Format(time.RFC3339), e.Type,
			strings.ToLower(e.InvolvedObject.Kind), e.InvolvedObject.Name, e.Reason, e.Message)
	}
}

// eventTime is when an Event last happened, whichever API recorded it.
func eventTime(e corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	return e.EventTime.Time
}

// DumpPods writes to GinkgoWriter what kubectl describe shows of a namespace's Pods, for a failed
// spec: phase, conditions, and each container's state, last termination and restarts.
func (c *Cluster) DumpPods(ctx context.Context, ns string) {
	pods := &corev1.PodList{}
	if err := c.K8s.List(ctx, pods, client.InNamespace(ns)); err != nil {
		GinkgoWriter.Printf("listing the Pods of %s: %v\n", ns, err)
		return
	}
	GinkgoWriter.Printf("\n----- Pods in namespace %s -----\n", ns)
	for _, p := range pods.Items {
		GinkgoWriter.Printf("%s: phase %s, node %s, IP %s, ready %v\n", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.PodIP, PodReady(&p))
		for _, c := range p.Status.Conditions {
			GinkgoWriter.Printf("  condition %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			GinkgoWriter.Printf("  container %s: ready %v, restarts %d, state %s", cs.Name, cs.Ready, cs.RestartCount, containerState(cs.State))
			if t := cs.LastTerminationState.Terminated; t != nil {
				GinkgoWriter.Printf(", last terminated %s (exit %d): %s", t.Reason, t.ExitCode, t.Message)
			}
			GinkgoWriter.Println()
		}
	}
}

func containerState(s corev1.ContainerState) string {
	switch {
	case s.Waiting != nil:
		return "waiting: " + s.Waiting.Reason + " " + s.Waiting.Message
	case s.Terminated != nil:
		return fmt.Sprintf("terminated: %s (exit %d) %s", s.Terminated.Reason, s.Terminated.ExitCode, s.Terminated.Message)
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.Format(time.RFC3339)
	}
	return "unknown"
}
