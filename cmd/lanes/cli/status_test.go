package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/topology"
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

// With priority classes and no rule, status says bulk keeps the NIC poll.
func TestStatusSaysBulkStaysWhileNoRule(t *testing.T) {
	for _, tc := range []struct {
		name  string
		st    control.Steering
		shown bool
	}{
		{"no rule", control.Steering{Prio: true, BulkInlineIdle: true}, true},
		{"a rule", control.Steering{Prio: true, BulkInlineIdle: true, Rules: []string{"dst 198.19.0.21 udp"}}, false},
		{"bulk queued always", control.Steering{Prio: true}, false},
	} {
		var b strings.Builder
		ctlPrintStatus(&b, &control.StatusReport{Mode: "prism", State: &control.State{Mode: "prism"}, Steering: &tc.st})
		if got := strings.Contains(b.String(), "bulk flows run in the NIC poll"); got != tc.shown {
			t.Errorf("%s: says bulk runs in the NIC poll: %v, want %v:\n%s", tc.name, got, tc.shown, b.String())
		}
	}
}

func TestCtlInFlight(t *testing.T) {
	for _, c := range []struct {
		f    control.FlowStage
		want string
	}{
		{control.FlowStage{IdleMs: 5000}, ""},
		{control.FlowStage{IdleMs: 50, InFlight: 3}, ""},
		{control.FlowStage{IdleMs: 500, InFlight: 3}, "; 3 frames still in flight after 500 ms idle"},
		{control.FlowStage{IdleMs: 500, Uncounted: true}, "one uncounted"},
	} {
		if got := ctlInFlight(c.f); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want %q", c.f, got, c.want)
		}
	}
}

// A VXLAN device with threaded NAPI gets a warning under the topology:
// its GRO cells' threads may empty a cell from another core.
func TestStatusWarnsOfThreadedVXLAN(t *testing.T) {
	topo := &topology.Topology{VXLANs: []topology.VXLAN{{Device: topology.Device{Name: "vxlan0", Threaded: "1"}, VNI: 42}}}
	var b strings.Builder
	ctlPrintTopology(&b, topo)
	if !strings.Contains(b.String(), "vxlan0: threaded NAPI is on") {
		t.Errorf("no warning for a threaded VXLAN device:\n%s", b.String())
	}
	topo.VXLANs[0].Threaded = "0"
	b.Reset()
	ctlPrintTopology(&b, topo)
	if strings.Contains(b.String(), "warning") {
		t.Errorf("warning for a VXLAN device without threaded NAPI:\n%s", b.String())
	}
}

// lanes status says where each underlay NIC is polled: by its pinned
// threads, in softirq where its receive interrupts go, or that lanes
// cannot tell and how to tell it.
func TestStatusSaysWhereTheNICIsPolled(t *testing.T) {
	for _, tc := range []struct {
		dev  topology.Device
		want string
	}{
		{topology.Device{Name: "ul2", Threaded: "1", NAPIThreads: []kthread.Info{{Comm: "napi/ul2-9", CPUs: []int{1}}}}, "threaded NAPI: napi/ul2-9 on 1"},
		{topology.Device{Name: "eth0", Threaded: "0", IRQs: []topology.IRQ{{IRQ: 37, Name: "virtio2-config", CPUs: []int{0}}, {IRQ: 38, Name: "virtio2-input.0", CPUs: []int{1}, Receive: true}}}, "softirq NAPI, receive interrupts: irq 38 virtio2-input.0 on 1"},
		{topology.Device{Name: "ul2", Threaded: "0"}, "softirq NAPI, no receive interrupt found (its IRQ core cannot be read: modes take --set irq-cpus=N)"},
	} {
		var b strings.Builder
		ctlPrintTopology(&b, &topology.Topology{Underlays: []topology.Device{tc.dev}})
		if !strings.Contains(b.String(), "underlay host/"+tc.dev.Name+": "+tc.want) {
			t.Errorf("%s: status says\n%s\nwant %q", tc.dev.Name, b.String(), tc.want)
		}
	}
}

// lanes status fails (exit 1) when the applied mode expects an agent that
// does not run: a mode with a run-time part and no report, or any mode
// whose agent reported and stopped reporting.
func TestStatusFailsWithoutTheAgent(t *testing.T) {
	falcon := &control.State{Mode: "falcon", Phase: control.Applied, Plan: control.Summary{Agent: "falcon-balancer"}}
	rps := &control.State{Mode: "rps", Phase: control.Applied, Plan: control.Summary{Changes: 4}}
	for _, tc := range []struct {
		name string
		s    control.StatusReport
		want string // "" = no error
	}{
		{"nothing applied", control.StatusReport{Mode: "vanilla"}, ""},
		{"agent running", control.StatusReport{NetNS: "h2", State: falcon, Agent: &control.AgentReport{PID: 7, Running: true}}, ""},
		{"agent never started", control.StatusReport{NetNS: "h2", State: falcon},
			"mode falcon on netns h2 has a run-time part (falcon-balancer) and no agent runs it: start it (systemctl start lanes, or lanes agent --netns h2)"},
		{"agent killed", control.StatusReport{State: falcon, Agent: &control.AgentReport{PID: 7, At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)}},
			"the agent of falcon on netns host (pid 7) last reported at 2026-01-02 03:04:05 and is not running: start it (systemctl start lanes, or lanes agent)"},
		{"static mode, no agent", control.StatusReport{State: rps}, ""},
		{"static mode, agent killed", control.StatusReport{State: rps, Agent: &control.AgentReport{PID: 7, At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)}},
			"the agent of rps on netns host (pid 7) last reported at 2026-01-02 03:04:05 and is not running: start it (systemctl start lanes, or lanes agent)"},
		{"apply interrupted", control.StatusReport{State: &control.State{Mode: "falcon", Phase: control.Applying, Plan: control.Summary{Agent: "falcon-balancer"}}}, ""},
	} {
		err := ctlAgentErr(&tc.s)
		if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && got != tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.name, err, tc.want)
		}
	}
}

// status names the daemons that write what lanes writes, with their
// fights, one a line.
func TestStatusSaysWhatDaemonsFightOver(t *testing.T) {
	var b strings.Builder
	ctlPrintStatus(&b, &control.StatusReport{Mode: "rps", Coexistence: []control.Coexist{
		{Name: "irqbalance", PID: 812, Config: []string{"/etc/default/irqbalance"}, Fights: []string{"IRQ affinity: x"}},
	}})
	if !strings.Contains(b.String(), "coexistence: irqbalance runs (pid 812, /etc/default/irqbalance):\n  IRQ affinity: x\n") {
		t.Errorf("status:\n%s", b.String())
	}
}

// A receive kthread that waited for its core is named under the cores.
func TestStatusNamesAStalledKthread(t *testing.T) {
	s := control.StatusReport{Mode: "falcon", Cores: []control.Core{
		{CPU: 0, Stalled: &control.CoreStall{Comm: "cpumap/0/map:76", PID: 3647, Ms: 1450}},
		{CPU: 1},
	}}
	var b strings.Builder
	ctlPrintStatus(&b, &s)
	out := b.String()
	if !strings.Contains(out, "core 0: cpumap/0/map:76 (pid 3647) stayed runnable 1450 ms without running") {
		t.Errorf("the stalled kthread is not named:\n%s", out)
	}
	if strings.Contains(out, "core 1:") {
		t.Errorf("core 1 had no stall:\n%s", out)
	}
}
