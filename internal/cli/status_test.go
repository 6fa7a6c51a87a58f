package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
)

// lanes status says whether the applied mode's agent runs: running, killed
// (its last report), or none reporting.
func TestStatusSaysWhetherTheAgentRuns(t *testing.T) {
	applied := &control.State{Mode: "prism", Plan: control.Summary{Agent: "prism-guard"}}
	for _, tc := range []struct {
		name  string
		s     control.StatusReport
		want  string
		never string
	}{
		{"none reporting", control.StatusReport{Mode: "prism", State: applied}, "agent NOT RUNNING: this mode's run-time part (prism-guard)", "agent (pid"},
		{"running", control.StatusReport{Mode: "prism", State: applied, Agent: &control.AgentReport{PID: 7, Mode: "prism", At: time.Now(), Running: true}}, "agent (pid 7", "NOT"},
		{"killed", control.StatusReport{Mode: "prism", State: applied, Agent: &control.AgentReport{PID: 7, Mode: "prism", At: time.Now()}}, "agent NOT RUNNING (last report of pid 7", "run-time part"},
		{"no agent in the mode", control.StatusReport{Mode: "rps", State: &control.State{Mode: "rps"}}, "", "agent"},
	} {
		var b strings.Builder
		ctlPrintStatus(&b, &tc.s)
		if out := b.String(); !strings.Contains(out, tc.want) || strings.Contains(out, tc.never) {
			t.Errorf("%s: output lacks %q or has %q:\n%s", tc.name, tc.want, tc.never, out)
		}
	}
}
