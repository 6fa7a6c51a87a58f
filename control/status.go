package control

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/netnsx"
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
	// OldState says where state a former lanes kept under the
	// namespace's old name may be, when it holds none under its own.
	OldState string `json:"old_state,omitempty"`
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
	// Coexistence lists host tuning daemons (irqbalance, tuned) that
	// write what lanes writes.
	Coexistence []Coexist `json:"coexistence,omitempty"`
	// ModeStatus is what the applied mode's policy reports of its own
	// datapath parts (plan.RegisterStatus: mflow's reassemblers);
	// ModeStatusError why it could not be read.
	ModeStatus      *plan.ModeStatus `json:"mode_status,omitempty"`
	ModeStatusError string           `json:"mode_status_error,omitempty"`
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
	// Stalled is the receive kthread (NAPI, cpumap) that last ran on the
	// core and stayed runnable without running longest during the
	// sample, if that was StallShown or more: its frames waited as long.
	Stalled *CoreStall `json:"stalled,omitempty"`
}

// CoreStall is a receive kthread that waited for its core.
type CoreStall struct {
	Comm string  `json:"comm"`
	PID  int     `json:"pid"`
	Ms   float64 `json:"ms"` // runnable without running, at least this long
}

// StallShown is the shortest stall a status reports: a few scheduler
// slices. Stalls are sampled every stallEvery, so a shorter one may be
// missed or read shorter, never longer.
const (
	StallShown = 60 * time.Millisecond
	stallEvery = 20 * time.Millisecond
)

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
	if !netnsx.Exists(opts.NetNS) {
		return nil, netnsx.NotFoundError(opts.NetNS)
	}
	if opts.Sample <= 0 {
		opts.Sample = 500 * time.Millisecond
	}
	dir, unsure := stateDirOf(opts.StateDir, opts.NetNS)
	s := &StatusReport{NetNS: opts.NetNS, Target: filepath.Base(dir), Mode: "vanilla", SampleSeconds: opts.Sample.Seconds()}
	if unsure != "" {
		s.OldState = legacyNote(unsure)
	}
	st, err := ReadState(dir)
	if err != nil {
		return nil, err
	}
	if st != nil {
		s.State, s.Mode = st, st.Mode
		// The applied form ("pid:N@C" for "pid:N"), so devices are
		// named as the journal names them.
		if Target(st.NetNS) == Target(opts.NetNS) {
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
	s.Coexistence = Coexistence()
	if src, ok := plan.StatusOf(s.Mode); ok && st != nil && src.Read != nil {
		if ms, err := src.Read(opts.NetNS); err != nil {
			s.ModeStatusError = err.Error()
		} else {
			s.ModeStatus = &ms
		}
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
	online, err := cpuset.Online()
	if err != nil {
		return nil, err
	}
	// Listing the threads walks /proc: before the load window opens.
	stalls := kthread.StartStalls(cpuload.IsRxKthread, stallEvery)
	defer stalls.End()
	s0, err := cpuload.ReadStat()
	if err != nil {
		return nil, err
	}
	n0, err := readNetRX()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	time.Sleep(d)
	worst := map[int]kthread.Stall{}
	stalled, _ := stalls.End()
	for _, st := range stalled {
		if st.Longest >= StallShown && st.Longest > worst[st.CPU].Longest {
			worst[st.CPU] = st
		}
	}
	s1, err := cpuload.ReadStat()
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
		if st, ok := worst[cpu]; ok {
			c.Stalled = &CoreStall{Comm: st.Comm, PID: st.PID, Ms: float64(st.Longest) / float64(time.Millisecond)}
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

// Coexist is a host tuning daemon that writes what lanes writes, and what
// the two would fight over.
type Coexist struct {
	Name string `json:"name"` // irqbalance, tuned
	PID  int    `json:"pid"`
	// Config is the file(s) the findings come from ("" = the daemon's
	// defaults).
	Config []string `json:"config,omitempty"`
	// Fights says what each would set that the other sets too, and how to
	// keep them apart, one line each.
	Fights []string `json:"fights"`
}

// Coexistence finds irqbalance and tuned running on the host.
func Coexistence() []Coexist { return coexistence("/proc", "/") }

// coexistence reads processes under proc and configuration under root
// (tests give their own trees).
func coexistence(proc, root string) []Coexist {
	var out []Coexist
	pids := daemons(proc, "irqbalance", "tuned")
	if pid := pids["irqbalance"]; pid > 0 {
		out = append(out, irqbalance(pid, root))
	}
	if pid := pids["tuned"]; pid > 0 {
		out = append(out, tuned(pid, root))
	}
	return out
}

// daemons finds the first process of each name (its comm) under proc.
func daemons(proc string, names ...string) map[string]int {
	out := map[string]int{}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "comm"))
		if err != nil {
			continue
		}
		comm := strings.TrimSpace(string(b))
		if slices.Contains(names, comm) && (out[comm] == 0 || pid < out[comm]) {
			out[comm] = pid
		}
	}
	return out
}

// irqbalance moves interrupts between cores (every 10 s by default):
// lanes reads the underlay NIC's IRQ core at apply and places its stages
// around it, and its agent adopts no container once that core moved.
func irqbalance(pid int, root string) Coexist {
	c := Coexist{Name: "irqbalance", PID: pid}
	var env map[string]string
	for _, f := range []string{"etc/default/irqbalance", "etc/sysconfig/irqbalance"} {
		if m, err := readEnvFile(filepath.Join(root, f)); err == nil {
			env = m
			c.Config = append(c.Config, "/"+f)
			break
		}
	}
	fight := "IRQ affinity: it moves the underlay NIC's interrupts between cores, while lanes places its stages around the IRQ core it read at apply (lanes agent adopts no container once that core moved)"
	switch {
	case strings.Contains(env["IRQBALANCE_ARGS"], "--banirq"):
		fight += "; IRQBALANCE_ARGS has --banirq: check that every receive IRQ of the underlay NIC is banned, or stop irqbalance"
	case env["IRQBALANCE_BANNED_CPULIST"] != "" || env["IRQBALANCE_BANNED_CPUS"] != "":
		fight += fmt.Sprintf("; it keeps IRQs off banned cores (%s): pin the underlay NIC's IRQs with IRQBALANCE_ARGS=\"--banirq=N\" for each, or stop irqbalance", cmp.Or(env["IRQBALANCE_BANNED_CPULIST"], env["IRQBALANCE_BANNED_CPUS"]))
	default:
		fight += ": pin the underlay NIC's IRQs (IRQBALANCE_ARGS=\"--banirq=N\" for each receive IRQ), or stop irqbalance"
	}
	c.Fights = append(c.Fights, fight)
	return c
}

// tuned applies a profile (with the profiles it includes) and, with
// dynamic tuning or its scheduler plugin's runtime, keeps applying it.
func tuned(pid int, root string) Coexist {
	c := Coexist{Name: "tuned", PID: pid}
	b, err := os.ReadFile(filepath.Join(root, "etc/tuned/active_profile"))
	if err != nil {
		c.Fights = append(c.Fights, "no active profile found (/etc/tuned/active_profile): check `tuned-adm active` for sysctl, sysfs and scheduler settings on what lanes sets")
		return c
	}
	seen := map[string]bool{}
	var visit func(profile string, depth int)
	visit = func(profile string, depth int) {
		if seen[profile] || depth > 10 || profile == "" {
			return
		}
		seen[profile] = true
		path, secs := readTunedProfile(root, profile)
		if path == "" {
			return
		}
		c.Config = append(c.Config, path)
		for _, inc := range strings.Split(secs["main"]["include"], ",") {
			visit(strings.TrimSpace(inc), depth+1)
		}
		c.Fights = append(c.Fights, tunedFights(profile, secs)...)
	}
	for _, p := range strings.Fields(string(b)) {
		visit(p, 0)
	}
	if len(c.Fights) == 0 {
		c.Fights = append(c.Fights, "its profiles set nothing lanes sets (no RPS maps, rps_default_mask, netdev_budget, scheduler or IRQ settings)")
	}
	return c
}

// tunedFights lists a profile's settings on what lanes sets.
func tunedFights(profile string, secs map[string]map[string]string) []string {
	var out []string
	for _, key := range []string{"net.core.rps_default_mask", "net.core.netdev_budget", "net.core.rps_sock_flow_entries"} {
		if v, ok := secs["sysctl"][key]; ok {
			out = append(out, fmt.Sprintf("profile %s sets %s=%s, which lanes modes set too (rps, prism): the profile's value returns whenever tuned applies it again", profile, key, v))
		}
	}
	for _, k := range sortedKeys(secs["sysfs"]) {
		if strings.Contains(k, "rps_cpus") || strings.Contains(k, "rps_flow_cnt") || strings.HasSuffix(k, "/threaded") {
			out = append(out, fmt.Sprintf("profile %s writes %s=%s: RPS maps or threaded NAPI of devices lanes steers", profile, k, secs["sysfs"][k]))
		}
	}
	var sched []string
	for _, k := range sortedKeys(secs["scheduler"]) {
		if k == "isolated_cores" || k == "ps_blacklist" || k == "irq_process" || strings.HasPrefix(k, "group.") || strings.HasPrefix(k, "default_irq_smp_affinity") {
			sched = append(sched, k+"="+secs["scheduler"][k])
		}
	}
	if len(sched) > 0 {
		out = append(out, fmt.Sprintf("profile %s moves threads and IRQs (%s): it can move the NAPI threads lanes pins and the NIC's interrupts lanes plans around; keep lanes' cores (cpus) out of isolated_cores, or drop those settings", profile, strings.Join(sched, ", ")))
	}
	if v, ok := secs["irqbalance"]["banned_cpus"]; ok {
		out = append(out, fmt.Sprintf("profile %s sets irqbalance's banned cores (%s)", profile, v))
	}
	return out
}

// readTunedProfile finds a profile's tuned.conf (/etc/tuned overrides the
// shipped ones) and reads its sections.
func readTunedProfile(root, profile string) (string, map[string]map[string]string) {
	for _, d := range []string{"etc/tuned", "etc/tuned/profiles", "usr/lib/tuned", "usr/lib/tuned/profiles"} {
		p := filepath.Join(root, d, profile, "tuned.conf")
		if b, err := os.ReadFile(p); err == nil {
			return "/" + filepath.Join(d, profile, "tuned.conf"), parseINI(string(b))
		}
	}
	return "", nil
}

// parseINI reads "[section]" and "key=value" lines (tuned's format).
func parseINI(s string) map[string]map[string]string {
	out := map[string]map[string]string{}
	sec := ""
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
			sec = strings.TrimSpace(l[1 : len(l)-1])
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				continue
			}
			if out[sec] == nil {
				out[sec] = map[string]string{}
			}
			out[sec][strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}

// readEnvFile reads KEY=VALUE lines (quotes taken off), as irqbalance's
// environment files hold them.
func readEnvFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "export "))
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if k, v, ok := strings.Cut(l, "="); ok {
			out[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return out, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
