package falcon

import (
	"strings"
	"testing"
)

// The balancer's summary for `lanes status` says its state, the loads in
// core order, its counters (the damping only when it happened) and where
// the stages are.
func TestAgentStatusSummary(t *testing.T) {
	s := AgentStatus{Load: map[int]float64{1: 99.6, 0: 62}, StdDev: 18.8, Moves: 3, Fallbacks: 1, Damped: 1, FallbackBar: 90, Active: 2, Sampler: "sched"}
	got := strings.Join(s.Summary(), "\n")
	for _, want := range []string{
		"balancer: placing stages by hash and load",
		"load (moving average, from sched): cpu0 62%, cpu1 100%; std dev 18.8",
		"moves 3, fallbacks 1, damped 1 (the set's own spread work): falls back at 90%",
		"active (flow, stage) pairs: 2",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	s = AgentStatus{FallenBack: true, Home: []string{"bridge", "container"}}
	got = strings.Join(s.Summary(), "\n")
	if !strings.Contains(got, "fallen back: vanilla placement") || !strings.Contains(got, "at home (vanilla placement, no per-flow work): bridge, container") || strings.Contains(got, "damped") {
		t.Errorf("fallen-back summary:\n%s", got)
	}
}
