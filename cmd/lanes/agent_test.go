package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/bench"
	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/cmd/lanes/cli"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/testbed"
)

// TestMain lets the test binary serve as lanes itself when started by
// that name (the benchmark's agents, `lanes agent`), and as the paced
// ping-pong client the priority workloads start.
func TestMain(m *testing.M) {
	workload.RunHelper()
	if filepath.Base(os.Args[0]) == "lanes" {
		cli.Execute()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The benchmark runs a mode's agent as its own `lanes agent` process, as
// deployed: the agent's report carries what the bench records of PRISM's
// stepping aside, its output lands in agent.log, and it is gone when the
// bench ends.
func TestBenchRunsTheAgentAsAProcess(t *testing.T) {
	testenv.Root(t)
	const prefix = "lba"
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	old := testbed.StateDir
	testbed.StateDir = t.TempDir()
	t.Cleanup(func() { testbed.Down(prefix); testbed.StateDir = old })
	o := bench.Options{
		Modes: []string{"prism-batch"}, Workloads: []string{"prio_latency"}, Loads: []float64{0}, Awake: bench.AwakeOn,
		Quick: true, Repeats: 2, Duration: time.Second, Out: out, Prefix: prefix, IRQCPU: -1, AgentBinary: self,
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	f, err := bench.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Runs) != 2 {
		t.Fatalf("%d runs, want 2", len(f.Runs))
	}
	for _, r := range f.Runs {
		if r.Error != "" {
			t.Errorf("repeat %d: %s", r.Repeat, r.Error)
		}
		if _, ok := r.Extra["prism_aside_at_end"]; !ok {
			t.Errorf("repeat %d: nothing read of the agent's stepping aside: %v", r.Repeat, r.Extra)
		}
	}
	if !slices.ContainsFunc(f.Notes, func(n string) bool { return strings.Contains(n, "its own `lanes agent` process") }) {
		t.Errorf("no note on where the agent ran: %q", f.Notes)
	}
	log, err := os.ReadFile(filepath.Join(out, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"prism-batch: agent: ", "running (on exit: keep)", "static placement restored"} {
		if !bytes.Contains(log, []byte(want)) {
			t.Errorf("agent.log lacks %q:\n%s", want, log)
		}
	}
	if left := nsx.List(prefix + "-"); len(left) > 0 {
		t.Errorf("testbed left behind: %v", left)
	}
	if pids := agentsOn(prefix); len(pids) > 0 {
		t.Errorf("lanes agent processes left running: %v", pids)
	}
}

// agentsOn lists the processes running `lanes agent` on the testbed's
// namespaces.
func agentsOn(prefix string) []string {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []string
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 3 && args[0] == "lanes" && args[1] == "agent" && strings.HasPrefix(args[3], prefix+"-") {
			pids = append(pids, filepath.Base(filepath.Dir(d)))
		}
	}
	return pids
}
