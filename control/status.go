package control

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/datapath/load"
	"github.com/lanesnet/lanes/topology"
)

// StatusOptions say what to report on.
type StatusOptions struct {
	NetNS    string
	StateDir string        // "" = DefaultStateDir
	Sample   time.Duration // how long to measure core load; 0 = 500ms
}

// StatusReport is what lanes status reports: the overlay, the mode in place and
// what each core is doing.
type StatusReport struct {
	NetNS  string `json:"netns"`
	Target string `json:"target"`
	// Mode is the applied mode; "vanilla" when lanes has no state for the
	// target.
	Mode  string `json:"mode"`
	State *State `json:"state,omitempty"`
	// Journaled is how many knobs lanes changed and can restore.
	Journaled     int                `json:"journaled"`
	Topology      *topology.Topology `json:"topology,omitempty"`
	TopologyError string             `json:"topology_error,omitempty"`
	SampleSeconds float64            `json:"sample_seconds"`
	Cores         []Core             `json:"cores"`
	// Steering is set when a steering datapath is pinned for the target.
	Steering *Steering `json:"steering,omitempty"`
	// Agent is the mode's agent's last report, when one ran since the
	// apply.
	Agent *AgentReport `json:"agent,omitempty"`
}

// Core is one online CPU over the sample.
type Core struct {
	CPU int `json:"cpu"`
	// Percent of the sample's wall time, as in bench results: system
	// includes irq, user includes nice, idle includes iowait.
	SoftIRQ float64 `json:"softirq"`
	System  float64 `json:"system"`
	User    float64 `json:"user"`
	Idle    float64 `json:"idle"`
	// NetRXPerSec is the rate of NET_RX softirqs on the core.
	NetRXPerSec float64 `json:"net_rx_per_s"`
	// Threads are the topology's NAPI threads pinned to the core (affinity
	// only this core) or that last ran on it.
	Threads []CoreThread `json:"napi_threads,omitempty"`
	// RPS lists the rx queues whose RPS map includes the core.
	RPS []CoreQueue `json:"rps,omitempty"`
	// Stages are the (flow, stage) pairs the steering datapath placed on
	// the core, busiest first, that saw traffic in the last seconds.
	Stages []FlowStage `json:"stages,omitempty"`
}

// CoreThread is a NAPI thread seen on a core.
type CoreThread struct {
	Comm    string `json:"comm"`
	PID     int    `json:"pid"`
	Device  string `json:"device"`
	NetNS   string `json:"netns"`
	Pinned  bool   `json:"pinned"`   // its affinity is this core alone
	LastRan bool   `json:"last_ran"` // it last ran here
	Policy  string `json:"policy"`
	Prio    int    `json:"priority"`
}

// CoreQueue is an rx queue steering packets to a core.
type CoreQueue struct {
	NetNS  string `json:"netns"`
	Device string `json:"device"`
	Queue  int    `json:"queue"`
}

// Status reports on a namespace. A namespace without an overlay still gets
// its cores reported (TopologyError says why there is no topology).
func Status(opts StatusOptions) (*StatusReport, error) {
	if !knobs.NetNSExists(opts.NetNS) {
		return nil, knobs.NoNetNSError(opts.NetNS)
	}
	if opts.Sample <= 0 {
		opts.Sample = 500 * time.Millisecond
	}
	dir := Dir(opts.StateDir, opts.NetNS)
	s := &StatusReport{NetNS: opts.NetNS, Target: Target(opts.NetNS), Mode: "vanilla", SampleSeconds: opts.Sample.Seconds()}
	st, err := ReadState(dir)
	if err != nil {
		return nil, err
	}
	if st != nil {
		s.State, s.Mode = st, st.Mode
		// The applied form ("pid:N@C" for "pid:N"), so devices are
		// named as the journal names them.
		if Target(st.NetNS) == s.Target {
			opts.NetNS = st.NetNS
		}
	}
	ents, err := knobs.ReadEntries(dir)
	if err != nil {
		return nil, err
	}
	s.Journaled = len(ents)
	if s.Agent, err = ReadAgentReport(dir); err != nil {
		return nil, err
	}

	// Sample first: discovery itself costs CPU and would show in the load.
	cores, err := sampleCores(opts.Sample)
	if err != nil {
		return nil, err
	}
	s.Cores = cores
	topo, err := topology.Discover(opts.NetNS)
	if err != nil {
		s.TopologyError = err.Error()
		return s, nil
	}
	s.Topology = topo
	placeThreads(s)
	if err := steering(s, opts.NetNS); err != nil {
		return nil, fmt.Errorf("reading the steering datapath: %w", err)
	}
	return s, nil
}

// placeThreads lists, per core, the topology's NAPI threads and RPS maps on it.
func placeThreads(s *StatusReport) {
	idx := map[int]*Core{}
	for i := range s.Cores {
		idx[s.Cores[i].CPU] = &s.Cores[i]
	}
	for _, d := range s.Topology.AllDevices() {
		for _, th := range d.NAPIThreads {
			pinned := len(th.CPUs) == 1
			for _, c := range s.Cores {
				here := (pinned && th.CPUs[0] == c.CPU) || th.LastCPU == c.CPU
				if !here {
					continue
				}
				idx[c.CPU].Threads = append(idx[c.CPU].Threads, CoreThread{
					Comm: th.Comm, PID: th.PID, Device: d.Name, NetNS: d.NetNS,
					Pinned: pinned && th.CPUs[0] == c.CPU, LastRan: th.LastCPU == c.CPU,
					Policy: th.Policy, Prio: th.Priority,
				})
			}
		}
		for _, q := range d.RxQueues {
			for _, cpu := range q.RPS {
				if c := idx[cpu]; c != nil {
					c.RPS = append(c.RPS, CoreQueue{NetNS: d.NetNS, Device: d.Name, Queue: q.Index})
				}
			}
		}
	}
}

func sampleCores(d time.Duration) ([]Core, error) {
	online, err := knobs.OnlineCPUs()
	if err != nil {
		return nil, err
	}
	s0, err := load.ReadStat()
	if err != nil {
		return nil, err
	}
	n0, err := readNetRX()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	time.Sleep(d)
	s1, err := load.ReadStat()
	if err != nil {
		return nil, err
	}
	n1, err := readNetRX()
	if err != nil {
		return nil, err
	}
	secs := time.Since(start).Seconds()
	var cores []Core
	for _, cpu := range online {
		a, b := s0[cpu], s1[cpu]
		c := Core{CPU: cpu}
		if tot := float64(b.Total() - a.Total()); tot > 0 {
			pct := func(x uint64) float64 { return 100 * float64(x) / tot }
			c.SoftIRQ = pct(b.SoftIRQ - a.SoftIRQ)
			c.System = pct(b.System - a.System + b.IRQ - a.IRQ)
			c.User = pct(b.User - a.User + b.Nice - a.Nice)
			c.Idle = pct(b.Idle - a.Idle + b.IOWait - a.IOWait)
		}
		if cpu < len(n0) && cpu < len(n1) && secs > 0 {
			c.NetRXPerSec = float64(n1[cpu]-n0[cpu]) / secs
		}
		cores = append(cores, c)
	}
	return cores, nil
}

// readNetRX returns the NET_RX softirq count per CPU from /proc/softirqs,
// indexed by CPU number (the header names the columns).
func readNetRX() ([]uint64, error) {
	b, err := os.ReadFile("/proc/softirqs")
	if err != nil {
		return nil, fmt.Errorf("reading /proc/softirqs: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) == 0 {
		return nil, fmt.Errorf("empty /proc/softirqs")
	}
	var cols []int
	for _, h := range strings.Fields(lines[0]) {
		n, err := strconv.Atoi(strings.TrimPrefix(h, "CPU"))
		if err != nil {
			return nil, fmt.Errorf("unexpected /proc/softirqs header %q", lines[0])
		}
		cols = append(cols, n)
	}
	for _, l := range lines[1:] {
		fs := strings.Fields(l)
		if len(fs) == 0 || fs[0] != "NET_RX:" {
			continue
		}
		out := make([]uint64, slices.Max(append(cols, 0))+1)
		for i, v := range fs[1:] {
			if i < len(cols) {
				out[cols[i]], _ = strconv.ParseUint(v, 10, 64)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("no NET_RX line in /proc/softirqs")
}

// AgentDown says why the agent this target expects is not running, or ""
// when none is expected or it runs. An agent is expected for an applied
// mode with a run-time part (State.Plan.Agent), and for any mode whose
// agent reported since the apply and stopped reporting (killed: one that
// stops cleanly removes its report).
func (s *StatusReport) AgentDown() string {
	st := s.State
	if st == nil || st.Phase != Applied {
		return ""
	}
	switch a := s.Agent; {
	case a != nil && a.Running:
		return ""
	case a != nil:
		return fmt.Sprintf("the agent of %s on netns %s (pid %d) last reported at %s and is not running", st.Mode, label(s.NetNS), a.PID, a.At.Local().Format(time.DateTime))
	case st.Plan.Agent != "":
		return fmt.Sprintf("mode %s on netns %s has a run-time part (%s) and no agent runs it", st.Mode, label(s.NetNS), st.Plan.Agent)
	}
	return ""
}
