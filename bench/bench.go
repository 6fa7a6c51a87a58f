// Package bench is `lanes bench`: it brings up the testbed, then measures
// every (workload point x mode) pair, interleaved and repeated, with the
// field's real tools, and writes results.json, report.md and plots.
//
// Modes are compared within one run and one machine state: for each repeat
// and each point, every mode runs back to back (in an order rotated per
// repeat), so slow drift of a shared, noisy machine hits all modes alike and
// ratios hold even when absolute numbers move.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesnet/lanes/bench/metrics"
	"github.com/lanesnet/lanes/bench/plot"
	"github.com/lanesnet/lanes/bench/report"
	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/bench/stress"
	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/testbed"
	"golang.org/x/sys/unix"
)

// Options say what to measure.
type Options struct {
	Modes     []string
	Workloads []string
	Quick     bool
	Out       string
	Repeats   int           // 0: 3
	Duration  time.Duration // per measurement; 0: 2 s quick, 10 s full
	Topology  testbed.Topology
	// Overlay has real daemons build the testbed's overlay
	// (testbed.Config.Overlay: flanneld, dockerd); Topology is then
	// theirs.
	Overlay string
	// NoForwardRules runs flanneld without its FORWARD accept rules
	// (testbed.Config.NoForwardRules).
	NoForwardRules bool
	Prefix         string // testbed prefix; default "lbench", apart from a user's testbed
	IRQCPU         int    // -1: the last core
	Keep           bool   // leave the testbed up afterwards
	// SenderApart polls the sending host's NIC off the IRQ core
	// (testbed.Config.SenderApart).
	SenderApart bool
	// BothHosts applies each mode to the sending host too, with its own
	// agent, as an operator runs lanes on every node; native stays the
	// hosts without the overlay, and the figures are still the
	// receiver's.
	BothHosts bool
	// ServiceApart runs the priority workloads' marked server on the
	// cores other than the IRQ core, beside their clients and the
	// background's receiver, as PRISM's evaluation ran its servers on
	// cores of their own; the default runs it on the receive core.
	ServiceApart bool
	// NIC is how the testbed polls each host's underlay NIC
	// (testbed.Config.NIC): testbed.NICThreaded ("" too) or
	// testbed.NICSoftirq.
	NIC string
	// Rates adds udp_stress points paced at these offered rates
	// (packets/s) to its unpaced one: the curve of delivered against
	// offered, whose peak is the receive capacity short of livelock.
	Rates []int
	// Loads replaces the priority workloads' background loads (fractions
	// of the receive core's capacity, 0 = idle) when not empty.
	Loads []float64
	// Train sends paced generator traffic (udp_stress's --rates points,
	// the priority workloads' background and its calibration) in trains of
	// this many datagrams back to back at the same average rate, as a NIC
	// that coalesces interrupts delivers it (stress.GenConfig.Train); 0 or
	// 1: evenly spaced, as before it existed. Unpaced udp_stress is line-rate
	// bursts anyway.
	Train int
	// Arrivals spaces that paced traffic (or its trains): "even" ("" too)
	// or "poisson", exponential gaps of the same mean, as the merged
	// traffic of many independent senders arrives (stress.GenConfig.Arrivals).
	Arrivals string
	// Background is the tool that offers the priority workloads'
	// low-priority background: BackgroundStress ("" too: the stress
	// generator's ready-made frames into the sending host's underlay) or
	// BackgroundSockperf (sockperf's throughput client in the sending
	// container, as PRISM's evaluation generated it: down the sender's
	// whole stack).
	Background string
	// Awake says how the priority workloads run with respect to idle
	// states: AwakeBoth (default: every point as-is and with the cores
	// kept awake), AwakeOn or AwakeOff (awake.go).
	Awake string
	// BPFStats reads the kernel's run-time statistics of lanes' programs
	// over each udp_stress measurement (progcost.go): their time and runs
	// per delivered datagram. The statistics cost every program run two
	// clock reads, in every mode that has programs, so they are off
	// unless asked for.
	BPFStats bool
	// AgentBinary runs each mode's agent as its own `lanes agent`
	// process from this binary (the lanes binary's own path), as an
	// operator runs it; "": inside the benchmark (tests, whose binary
	// is not lanes).
	AgentBinary string
	Progress    io.Writer
	Args        []string
}

// The tools that can offer the priority workloads' background (--background).
const (
	BackgroundStress   = "stress"
	BackgroundSockperf = "sockperf"
)

var Backgrounds = []string{BackgroundStress, BackgroundSockperf}

// ParseModeSpec splits a benchmark mode "falcon:load=busy:threshold=70"
// into the lanes mode and its settings (see results.ParseModeSpec).
var ParseModeSpec = results.ParseModeSpec

// KnownModes are the modes `lanes bench` can run: every registered lanes
// mode, and native, which is not a lanes mode but the reference path: host
// to host over the underlay. Asked when used, not at this package's
// init: the policies register their modes from their own init, which the
// binary (cmd/lanes) runs after this package's.
func KnownModes() []string { return append([]string{"native"}, plan.Modes()...) }

// DefaultWorkloads is what a plain run measures; Quick trims the points.
var DefaultWorkloads = append([]string{"tcp_stream", "udp_stream", "tcp_multi", "pingpong", "udp_stress", "memcached", "nginx"}, prioNames...)

// modeCPUs takes the benchmark's own mode setting "cpus" (the core set the
// mode may use, as `lanes apply --cpus`; "" for all online cores) out of a
// mode's settings. rps:cpus=1, for instance, is RPS that keeps every stage
// on core 1: the backlog hops without the second core.
func modeCPUs(params map[string]string) (cpus string, rest map[string]string) {
	cpus, _, rest = benchParams(params)
	return cpus, rest
}

// benchParams takes the benchmark's own mode settings out of a mode's
// settings (benchKeys): cpus (modeCPUs), idle-rule, xdp-pass
// (xdppass.go) and agent (agentOff). idle-rule=true, for modes with
// priority classes, keeps a rule in place that marks a flow no workload
// sends (idleRule below), so that bulk workloads run as they do on a host
// with a marked service that is silent; without it those workloads run
// with no rule at all. idleRule is "" when not given.
func benchParams(params map[string]string) (cpus, idleRule string, rest map[string]string) {
	rest = params
	for _, k := range benchKeys {
		if _, ok := params[k]; ok {
			rest = maps.Clone(params)
			break
		}
	}
	cpus, idleRule = rest["cpus"], rest["idle-rule"]
	for _, k := range benchKeys {
		delete(rest, k)
	}
	return cpus, idleRule, rest
}

// benchKeys are the mode settings the benchmark takes for itself (see
// benchParams, and xdppass.go for xdp-pass).
var benchKeys = []string{"cpus", "idle-rule", "xdp-pass", "agent"}

// agentOff says whether mode asks for agent=false (Validate checked it):
// the mode runs without lanes agent, as `lanes apply` leaves it, so that
// a run can set the agent's cost (its samples, its tracing programs)
// against the mode with it.
func agentOff(mode string) bool {
	_, params, _ := ParseModeSpec(mode)
	on, err := strconv.ParseBool(params["agent"])
	return err == nil && !on
}

// idleRuleOn says whether mode asks for idle-rule (Validate checked it).
func idleRuleOn(mode string) bool {
	_, params, _ := ParseModeSpec(mode)
	_, idle, _ := benchParams(params)
	on, _ := strconv.ParseBool(idle)
	return on
}

// idleRule is idle-rule's rule (dst 198.19.0.254 port 9 udp): an address
// in the benchmarking range that no testbed interface has.
var idleRule = steer.Rule{Addr: netip.MustParseAddr("198.19.0.254"), Port: 9, Proto: 17}

// QuickWorkloads keeps --quick under five minutes for three modes.
var QuickWorkloads = []string{"tcp_stream", "udp_stream", "pingpong", "udp_stress"}

// Validate checks options before anything is touched, one line per problem.
func (o *Options) Validate() error {
	if len(o.Modes) == 0 {
		o.Modes = []string{"native", "vanilla", "rps"}
	}
	seen := map[string]bool{}
	for _, m := range o.Modes {
		base, params, err := ParseModeSpec(m)
		if err != nil {
			return err
		}
		if !slices.Contains(KnownModes(), base) {
			return fmt.Errorf("unknown mode %q: use --modes with some of %s", m, strings.Join(KnownModes(), ","))
		}
		if base == "native" && len(params) > 0 {
			return fmt.Errorf("mode %q: native is the kernel's host path and takes no settings", m)
		}
		if base != "native" {
			p, err := plan.Lookup(base)
			if err != nil {
				return err
			}
			if c, given := params["cpus"]; given && c == "" {
				return fmt.Errorf("mode %q: cpus= is empty: give a core list like 1 or 0-1, or drop it for all cores", m)
			}
			rawParams := params
			cpus, idle, params := benchParams(params)
			if cpus != "" {
				if _, err := cpuset.ParseList(cpus); err != nil {
					return fmt.Errorf("mode %q: cpus=%s: %v (a core list like 1 or 0-1)", m, cpus, err)
				}
			}
			if xp, given := rawParams["xdp-pass"]; given {
				on, err := strconv.ParseBool(xp)
				if err != nil {
					return fmt.Errorf("mode %q: xdp-pass=%s: want true or false", m, xp)
				}
				if on && base != "vanilla" && base != "rps" {
					return fmt.Errorf("mode %q: xdp-pass=true attaches a pass-through XDP program, for modes without XDP of their own (vanilla, rps): drop it", m)
				}
			}
			if ag, given := rawParams["agent"]; given {
				if _, err := strconv.ParseBool(ag); err != nil {
					return fmt.Errorf("mode %q: agent=%s: want true or false", m, ag)
				}
			}
			if idle != "" {
				on, err := strconv.ParseBool(idle)
				if err != nil {
					return fmt.Errorf("mode %q: idle-rule=%s: want true or false", m, idle)
				}
				if on && !plan.Prioritizes(base, params) {
					return fmt.Errorf("mode %q: idle-rule=true keeps a prio rule in place, but %s has no priority classes: drop it or use a prism mode", m, base)
				}
			}
			if err := plan.CheckParams(p, params); err != nil {
				return err
			}
		}
		if seen[m] {
			return fmt.Errorf("mode %q given twice in --modes", m)
		}
		seen[m] = true
	}
	if len(o.Workloads) == 0 {
		o.Workloads = DefaultWorkloads
		if o.Quick {
			o.Workloads = QuickWorkloads
		}
	}
	for _, w := range o.Workloads {
		if w == "udp_stress" || isPrio(w) {
			continue
		}
		if _, err := workload.Lookup(w); err != nil {
			return fmt.Errorf("%v; udp_stress and %s too (use --workloads)", err, strings.Join(append(slices.Clone(prioNames), prioExtra...), ", "))
		}
	}
	for _, r := range o.Rates {
		if r < 1000 || r > 100_000_000 {
			return fmt.Errorf("--rates: %d packets/s is outside 1k..100M (give Kpps like 300k or packets/s)", r)
		}
	}
	for _, l := range o.Loads {
		if l < 0 || l >= 1 {
			return fmt.Errorf("--loads: %g%% is outside 0..99%% of the receive core", l*100)
		}
	}
	if len(o.Loads) > 0 && !slices.ContainsFunc(o.Workloads, isPrio) {
		return fmt.Errorf("--loads sets the background of %s, which --workloads leaves out: add one", strings.Join(prioNames, ", "))
	}
	if len(o.Rates) > 0 && !slices.Contains(o.Workloads, "udp_stress") {
		return errors.New("--rates paces udp_stress, which --workloads leaves out: add it")
	}
	if o.Train < 0 || o.Train > stress.MaxTrain {
		return fmt.Errorf("--train must be 1..%d datagrams (the receiving veth's ring), got %d", stress.MaxTrain, o.Train)
	}
	if o.Arrivals == "" {
		o.Arrivals = stress.ArrivalsEven
	}
	if err := stress.CheckArrivals(o.Arrivals); err != nil {
		return fmt.Errorf("--%v", err)
	}
	shape := "" // the flag that shapes paced generator traffic, if one does
	switch {
	case o.Train > 1:
		shape = "--train"
	case o.Arrivals == stress.ArrivalsPoisson:
		shape = "--arrivals"
	}
	if shape != "" && !slices.ContainsFunc(o.Workloads, isPrio) && len(o.Rates) == 0 {
		return fmt.Errorf("%s shapes paced generator traffic (udp_stress with --rates, the background of %s), and this run has none: add one", shape, strings.Join(prioNames, ", "))
	}
	if o.Background == "" {
		o.Background = BackgroundStress
	}
	switch {
	case !slices.Contains(Backgrounds, o.Background):
		return fmt.Errorf("--background %q: use %s", o.Background, strings.Join(Backgrounds, " or "))
	case o.Background == BackgroundSockperf && !slices.ContainsFunc(o.Workloads, isPrio):
		return fmt.Errorf("--background sockperf offers the background of %s, and this run has none: add one or leave --background out", strings.Join(prioNames, ", "))
	case o.Background == BackgroundSockperf && o.Arrivals == stress.ArrivalsPoisson:
		return errors.New("--arrivals poisson needs --background stress: sockperf paces its messages evenly (or in --train bursts)")
	}
	if o.Repeats == 0 {
		o.Repeats = 3
	}
	if o.Repeats < 1 || o.Repeats > 100 {
		return fmt.Errorf("--repeats must be 1..100, got %d", o.Repeats)
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
		if o.Quick {
			o.Duration = 2 * time.Second
		}
	}
	if o.Duration < time.Second || o.Duration > 10*time.Minute {
		return fmt.Errorf("--duration must be between 1s and 10m, got %s", o.Duration)
	}
	if o.Out == "" {
		return errors.New("--out is empty: give a directory for results.json, report.md and plots")
	}
	if o.Prefix == "" {
		o.Prefix = "lbench"
	}
	if o.Overlay != "" || o.NoForwardRules {
		cfg := testbed.Config{Overlay: o.Overlay, Topology: o.Topology, NoForwardRules: o.NoForwardRules}.WithDefaults()
		if err := cfg.ValidateOverlay(); err != nil {
			return err
		}
		o.Topology = cfg.Topology
	}
	if o.Topology == "" {
		o.Topology = testbed.Docker
	}
	if o.IRQCPU < 0 {
		o.IRQCPU = runtime.NumCPU() - 1
	}
	if o.ServiceApart && runtime.NumCPU() < 2 {
		return fmt.Errorf("--service-apart needs a core besides the receive core; this machine has %d: leave it out", runtime.NumCPU())
	}
	if o.NIC == "" {
		o.NIC = testbed.NICThreaded
	}
	if !slices.Contains(testbed.NICModes, o.NIC) {
		return fmt.Errorf("--nic %q: use %s", o.NIC, strings.Join(testbed.NICModes, " or "))
	}
	if o.Awake == "" {
		o.Awake = AwakeBoth
	}
	if !slices.Contains(AwakeModes, o.Awake) {
		return fmt.Errorf("--awake %q: use %s", o.Awake, strings.Join(AwakeModes, ", "))
	}
	if o.Awake != AwakeOff && slices.ContainsFunc(o.Workloads, isPrio) {
		if err := awakeAvailable(); err != nil {
			return fmt.Errorf("--awake %s: %w: use --awake off", o.Awake, err)
		}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	return nil
}

// point is one workload configuration to measure under every mode.
type point struct {
	workload string
	proto    string
	msgSize  int
	flows    int
	rate     int
	// background is a priority workload's low-priority load, a fraction
	// of the receive core's capacity.
	background float64
	// awake keeps the cores out of idle states during the run (awake.go).
	awake bool
}

func (p point) String() string {
	s := p.workload
	if p.workload == "pingpong" && p.proto != "" {
		s += "/" + p.proto
	}
	if p.msgSize > 0 {
		s += fmt.Sprintf(" %dB", p.msgSize)
	}
	if p.flows > 1 {
		s += fmt.Sprintf(" x%d", p.flows)
	}
	if isPrio(p.workload) {
		s += fmt.Sprintf(" bg%.0f%%", 100*p.background)
	}
	if p.awake {
		s += " awake"
	}
	if p.workload == "udp_stress" && p.rate > 0 {
		s += fmt.Sprintf(" @%dK", p.rate/1000)
	}
	return s
}

// points expands workloads into the points the seed papers measured:
// message sizes 16 B / 4 KB / 64 KB for streams, 1..8 flows, 64 B ping-pong.
func points(workloads []string, quick bool, rates []int, loads []float64, awake string) []point {
	var out []point
	for _, w := range workloads {
		switch w {
		case "tcp_stream":
			for _, s := range []int{16, 4096, 65536} {
				out = append(out, point{workload: w, proto: "tcp", msgSize: s, flows: 1})
			}
		case "udp_stream":
			for _, s := range []int{16, 4096, 65507} {
				out = append(out, point{workload: w, proto: "udp", msgSize: s, flows: 1})
			}
		case "tcp_multi":
			flows := []int{1, 2, 4, 8}
			if quick {
				flows = []int{1, 4}
			}
			for _, f := range flows {
				out = append(out, point{workload: w, proto: "tcp", msgSize: 65536, flows: f})
			}
		case "pingpong":
			out = append(out, point{workload: w, proto: "udp", msgSize: 64, flows: 1})
			if !quick {
				out = append(out, point{workload: w, proto: "tcp", msgSize: 64, flows: 1})
			}
		case "udp_stress":
			out = append(out, point{workload: w, proto: "udp", msgSize: 64, flows: 1})
			for _, r := range rates {
				out = append(out, point{workload: w, proto: "udp", msgSize: 64, flows: 1, rate: r})
			}
		case "memcached":
			out = append(out, point{workload: w, proto: "tcp", msgSize: 550, flows: 8})
		case "nginx":
			out = append(out, point{workload: w, proto: "tcp", msgSize: 1024, flows: 4})
		default:
			if s, ok := prioSpecs[w]; ok {
				out = append(out, awakePoints(s.points(quick, loads), awake)...)
			} else {
				out = append(out, point{workload: w, flows: 1})
			}
		}
	}
	return out
}

// Run measures and writes results into o.Out. It returns the results even
// when some measurements failed (they are recorded with their error).
func Run(ctx context.Context, o Options) (*results.File, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("lanes bench needs root: it builds namespaces and changes kernel knobs")
	}
	if o.BPFStats {
		if err := checkProgCost(); err != nil {
			return nil, fmt.Errorf("--bpf-stats: %w: drop --bpf-stats", err)
		}
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	// The bench journals into lanes' own state dir, under its testbed's
	// namespace names, so that a bench that was killed leaves state that
	// `lanes reset --all` finds, and the next bench restores it first
	// (before its namespaces are rebuilt, while global knobs still can be).
	stateDir := control.DefaultStateDir
	unlock, err := lockBench(o.Prefix)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := resetLeftovers(o.Progress, stateDir, o.Prefix); err != nil {
		return nil, fmt.Errorf("restoring what an earlier bench left: %w (or run lanes reset --all --state-dir %s)", err, stateDir)
	}
	built := "lanes"
	if o.Overlay != "" {
		built = o.Overlay
	}
	fmt.Fprintf(o.Progress, "bringing up the %s testbed built by %s (IRQ core %d, %s NAPI)...\n", o.Topology, built, o.IRQCPU, o.NIC)
	tb, err := testbed.Up(testbed.Config{Prefix: o.Prefix, Topology: o.Topology, Overlay: o.Overlay, NoForwardRules: o.NoForwardRules, IRQCPU: o.IRQCPU, SenderApart: o.SenderApart, NIC: o.NIC})
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	if st := testbed.StopStrays(o.Prefix); len(st) > 0 {
		fmt.Fprintf(o.Progress, "stopped %d processes an earlier run left in the testbed: %s\n", len(st), strayList(st))
	}
	r := &runner{o: o, tb: tb, stateDir: stateDir, agentLog: &syncWriter{w: io.Discard}}
	if lf, err := os.Create(filepath.Join(o.Out, "agent.log")); err == nil {
		defer lf.Close()
		r.agentLog.w = lf
	}
	defer func() {
		// Restore every knob before the namespaces go, then remove them.
		r.stopAgent()
		if r.xdpPassOff != nil {
			r.xdpPassOff()
		}
		if err := resetLeftovers(io.Discard, stateDir, o.Prefix); err != nil {
			fmt.Fprintf(o.Progress, "restoring the bench's knobs: %v: run lanes reset --all\n", err)
		}
		if !o.Keep {
			testbed.Down(o.Prefix)
		}
	}()
	f := &results.File{
		Machine:  machine(tb),
		Started:  time.Now().UTC(),
		Args:     o.Args,
		Quick:    o.Quick,
		Repeats:  o.Repeats,
		Modes:    o.Modes,
		Duration: o.Duration.Seconds(),
	}
	if o.BothHosts {
		f.Notes = append(f.Notes, bothHostsNote)
	}
	if o.NoForwardRules {
		f.Notes = append(f.Notes, noForwardRulesNote)
	}
	r.file = f
	err = r.all(ctx)
	for _, note := range []string{stallNote(f.Runs), depthNote(f.Runs)} {
		if note != "" {
			f.Notes = append(f.Notes, note)
		}
	}
	f.Ended = time.Now().UTC()
	if werr := r.write(); werr != nil && err == nil {
		err = werr
	}
	if werr := Render(f, o.Out); werr != nil && err == nil {
		err = werr
	}
	r.write()
	return f, err
}

// Render writes f's plots and report.md into dir: at the end of a run,
// and again for a kept results.json (`lanes bench report DIR`), so an old
// run gets the tables of the current build. A plot that fails is a note
// in the report, not a failure.
func Render(f *results.File, dir string) error {
	files, err := plot.All(f, dir)
	if err != nil {
		f.Notes = append(f.Notes, "plotting failed: "+err.Error())
	}
	return report.Write(filepath.Join(dir, "report.md"), f, report.Options{Plots: files})
}

type runner struct {
	o        Options
	tb       *testbed.Testbed
	stateDir string
	file     *results.File
	applied  string
	// agent runs the applied mode's run-time part (Falcon's balancer)
	// while that mode is measured (nil: none); its status tells what a
	// guard did during each run. senderAgent is the sending host's,
	// with Options.BothHosts.
	agent, senderAgent benchAgent
	// xdpPassOff detaches vanilla:xdp-pass's program (xdppass.go).
	xdpPassOff func() error
	// agentLog receives the agents' decisions (agent.log in the output
	// directory), stamped with the time and the mode: what the balancer
	// did during a run is there to look at next to its figures.
	agentLog *syncWriter
	runs     int // measurements started, for port allocation
	// capacity is what the receive core takes (packets/s) on the native
	// path (true) and the overlay (false), measured before the priority
	// workloads run: the 100% of their background loads.
	capacity map[bool]float64
	// calibration says how capacity was found, per path.
	calibration map[bool]string
}

// port gives every measurement its own block of ports: a server that
// closed first leaves TIME_WAIT sockets on its port, and tools without
// SO_REUSEADDR (sockperf) then cannot bind it again for a while.
func (r *runner) port() int {
	r.runs++
	return 20000 + (r.runs%2000)*16
}

func (r *runner) write() error {
	return r.file.Write(filepath.Join(r.o.Out, "results.json"))
}

func (r *runner) all(ctx context.Context) error {
	pts := points(r.o.Workloads, r.o.Quick, r.o.Rates, r.o.Loads, r.o.Awake)
	total := len(pts) * len(r.o.Modes) * r.o.Repeats
	if slices.Contains(r.o.Modes, "native") && slices.Contains(r.o.Workloads, "udp_stress") {
		r.file.Notes = append(r.file.Notes, "udp_stress on the native path injects plain UDP (no VXLAN) to the receiving host, its sink there.")
	}
	if len(r.o.Rates) > 0 && slices.Contains(r.o.Workloads, "udp_stress") {
		r.file.Notes = append(r.file.Notes, "udp_stress's paced points (--rates): datagrams offered "+trainShape(r.o.Train, r.o.Arrivals)+"; the unpaced point sends as fast as the generator goes.")
	}
	if r.o.BPFStats && slices.Contains(r.o.Workloads, "udp_stress") {
		r.file.Notes = append(r.file.Notes, progCostNote)
	}
	if err := r.prioCalibrate(ctx); err != nil {
		return err
	}
	done := 0
	start := time.Now()
	for rep := 0; rep < r.o.Repeats; rep++ {
		for _, p := range pts {
			// Rotate the mode order each repeat: no mode always runs
			// first (after a mode switch) or last.
			modes := slices.Clone(r.o.Modes)
			k := rep % len(modes)
			modes = append(modes[k:], modes[:k]...)
			for _, mode := range modes {
				if err := ctx.Err(); err != nil {
					return err
				}
				run := r.one(ctx, mode, p, rep)
				r.file.Runs = append(r.file.Runs, run)
				done++
				r.progress(done, total, start, run)
				if err := r.write(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (r *runner) progress(done, total int, start time.Time, run results.Run) {
	eta := time.Duration(float64(time.Since(start)) / float64(done) * float64(total-done)).Round(time.Second)
	var what string
	switch {
	case run.Error != "":
		what = "FAILED: " + run.Error
	case run.LatP50Us > 0 && run.ThroughputGbps == 0:
		what = fmt.Sprintf("p50 %.1f us, p99 %.1f us", run.LatP50Us, run.LatP99Us)
	case run.LatP50Us > 0 && isPrio(run.Workload):
		what = fmt.Sprintf("%.0f req/s, p50 %.1f us, p99 %.1f us", run.PPS, run.LatP50Us, run.LatP99Us)
	case run.Workload == "udp_stress":
		what = fmt.Sprintf("%.0f Kpps received of %.0f Kpps offered", run.PPS/1e3, run.SentPPS/1e3)
	default:
		what = fmt.Sprintf("%.2f Gbit/s, %.0f Kmsg/s", run.ThroughputGbps, run.PPS/1e3)
	}
	var cpus []string
	for _, c := range run.CPU {
		cpus = append(cpus, fmt.Sprintf("cpu%d %.0f%%", c.CPU, 100-c.Idle))
	}
	if isPrio(run.Workload) && run.Error == "" {
		what += fmt.Sprintf(", background %.0f Kpps received", run.Extra["bg_received_kpps"])
		if d, ok := run.Extra["nic_frames_per_poll"]; ok {
			what += fmt.Sprintf(", %.2f frames a NIC poll", d)
			if a, ok := run.Extra["prism_aside_at_end"]; ok && a == 1 {
				what += " (PRISM aside)"
			}
		}
		// Said at once: the point then ran under a lighter load than its
		// label (the generator's core was busy), in every mode alike.
		if asked, offered := run.Extra["bg_target_kpps"], run.Extra["bg_offered_kpps"]; asked > 0 && offered < 0.9*asked {
			what += fmt.Sprintf(" (only %.0f%% of the %.0f Kpps asked was offered)", 100*offered/asked, asked)
		}
	}
	// Said at once too: a receive kthread on the generator's core
	// waited for it (rxwait.go) a tenth of a second or more.
	if ms := run.Extra["gen_core_cpumap_stall_ms"]; ms >= stallFlagMs {
		what += fmt.Sprintf(" [a cpumap kthread on the generator's core stalled %.0f ms]", ms)
	}
	fmt.Fprintf(r.o.Progress, "[%d/%d] repeat %d/%d  %-22s %-8s %s  (%s)  eta %s\n",
		done, total, run.Repeat+1, r.o.Repeats, point{workload: run.Workload, proto: run.Proto, msgSize: run.MsgSize, flows: run.Flows, background: run.Background, rate: run.Rate, awake: run.Awake}, run.Mode, what, strings.Join(cpus, ", "), eta)
}

// one measures one point under one mode.
func (r *runner) one(ctx context.Context, mode string, p point, rep int) results.Run {
	run := results.Run{Mode: mode, Workload: p.workload, Proto: p.proto, MsgSize: p.msgSize, Flows: p.flows, Background: p.background, Awake: p.awake, Repeat: rep}
	if p.workload == "udp_stress" {
		// Elsewhere rate is a workload's own setting (the priority
		// workloads' foreground), the same at every point.
		run.Rate = p.rate
	}
	fail := func(err error) results.Run { run.Error = err.Error(); return run }
	if err := r.apply(mode); err != nil {
		return fail(err)
	}
	if r.agent != nil {
		fmt.Fprintf(r.agentLog, "%s %s: measuring %s, repeat %d\n", time.Now().UTC().Format("15:04:05.000"), mode, p, rep+1)
	}
	if p.awake {
		release, err := holdAwake()
		if err != nil {
			return fail(err)
		}
		defer release()
	}
	srv, cli, err := r.endpoints(mode, p)
	if err != nil {
		return fail(err)
	}
	w, err := r.workload(mode, p)
	if err != nil {
		return fail(err)
	}
	mcfg := metrics.Config{
		RecvNS: []string{srv.NetNS},
		SendNS: []string{cli.NetNS},
		NICs:   []metrics.Dev{{NetNS: r.tb.Receiver().NetNS, Name: r.tb.Receiver().Underlay}},
	}
	before, err := metrics.Take(mcfg)
	if err != nil {
		return fail(fmt.Errorf("metrics: %w", err))
	}
	s := r.tb.Sender()
	wire0, _ := wireDrops(s.NetNS, s.Underlay)
	steer0, steered := steerCounts(r.tb.Receiver().NetNS)
	wp := workload.Point{Proto: p.proto, MsgSize: p.msgSize, Flows: p.flows, Duration: r.o.Duration, Rate: p.rate, Port: r.port()}
	marked, markedAlso := false, false
	if idleRuleOn(mode) {
		undo, err := r.addRule(idleRule)
		if err != nil {
			return fail(fmt.Errorf("idle-rule: %w", err))
		}
		defer undo()
	}
	if isPrio(p.workload) {
		var undo func()
		marked, undo, err = r.prioRule(mode, srv, wp.Port, p.proto)
		if err != nil {
			return fail(fmt.Errorf("marking %s high priority: %w", prioSpecs[p.workload].fg.Name(), err))
		}
		defer undo()
		if sp := prioSpecs[p.workload]; sp.also != nil {
			m, undo, err := r.prioRule(mode, srv, wp.Port+alsoPortOffset, sp.alsoProto)
			if err != nil {
				return fail(fmt.Errorf("marking %s high priority: %w", sp.also.Name(), err))
			}
			defer undo()
			markedAlso = m
		}
	}
	var work *workMeter
	var cost *progCost
	if p.workload == "udp_stress" {
		// The statistics first: a failure there leaves nothing started.
		if r.o.BPFStats {
			if cost, err = startProgCost(); err != nil {
				return fail(err)
			}
		}
		work = startWork()
	}
	var nic *nicMeter
	if isPrio(p.workload) {
		nic = startNICPolls(r.tb.Receiver().NetNS, r.tb.Receiver().Underlay, r.o.IRQCPU)
	}
	var stall *kthread.Stalls
	if p.workload == "udp_stress" || isPrio(p.workload) && r.o.Background != BackgroundSockperf {
		stall = startRxStall(r.stressGen().CPU)
	}
	guard0, guarded := guardStatus(r.agentStatus(time.Time{}))
	runStart := time.Now()
	res, werr := w.Run(ctx, srv, cli, wp)
	runEnd := time.Now()
	if d, ok := longestStall(stall); ok {
		if run.Extra == nil {
			run.Extra = map[string]float64{}
		}
		run.Extra["gen_core_cpumap_stall_ms"] = float64(d) / float64(time.Millisecond)
	}
	if fpp, ok := nic.stop(); ok {
		if run.Extra == nil {
			run.Extra = map[string]float64{}
		}
		run.Extra["nic_frames_per_poll"] = fpp
	}
	workNs, irqNs, window, workOK := work.stop(r.o.IRQCPU)
	ran, costErr := cost.stop()
	after, err := metrics.Take(mcfg)
	if err == nil {
		metrics.Diff(before, after).Apply(&run)
	}
	if wire1, err := wireDrops(s.NetNS, s.Underlay); err == nil && wire1 >= wire0 {
		run.DropsNIC += wire1 - wire0
	}
	if steer1, ok := steerCounts(r.tb.Receiver().NetNS); ok && steered {
		// Placement changes during the run, all stages: how many moved,
		// how many of those gave up waiting for the old queue (drain
		// time), and frames the kernel dropped that were counted out.
		d := steer1.Sub(steer0)
		if run.Extra == nil {
			run.Extra = map[string]float64{}
		}
		run.Extra["steer_moved"] = float64(d.Moved)
		run.Extra["steer_undrained"] = float64(d.Undrained)
		run.Extra["steer_dropped"] = float64(d.Dropped)
		run.Extra["steer_settled"] = float64(d.Settled)
	}
	// What the agent says of the run, from a report it published after
	// the run's end (a process agent publishes once a round): read once
	// every meter has stopped, so that the wait for it is in none.
	agentEnd := r.agentStatus(runEnd)
	if _, counted := run.Extra["nic_frames_per_poll"]; counted {
		// At the repeat's length from its start: inside the measured
		// window, which the workload's warm-up puts after the start.
		if on, ok := prismAside(agentEnd, runStart.Add(wp.Duration)); ok {
			run.Extra["prism_aside_at_end"] = 0
			if on {
				run.Extra["prism_aside_at_end"] = 1
			}
		}
	}
	if guard1, ok := guardStatus(agentEnd); ok && guarded && guard1.Demotions >= guard0.Demotions {
		// What prism's guard did during the run: how often it stepped
		// in, and whether it held its target demoted at the end (a
		// demotion from an earlier run may still hold).
		if run.Extra == nil {
			run.Extra = map[string]float64{}
		}
		run.Extra["guard_demotions"] = float64(guard1.Demotions - guard0.Demotions)
		run.Extra["guard_demoted_at_end"] = 0
		if guard1.Demoted {
			run.Extra["guard_demoted_at_end"] = 1
		}
	}
	if werr != nil {
		return fail(werr)
	}
	run.ThroughputGbps = res.ThroughputGbps
	run.PPS = res.PPS
	run.SentPPS = res.SentPPS
	run.LatAvgUs, run.LatMinUs, run.LatP50Us, run.LatP99Us, run.LatP999Us = res.LatAvgUs, res.LatMinUs, res.LatP50Us, res.LatP99Us, res.LatP999Us
	run.LatCDF = res.LatCDF
	if res.UDPReorder > 0 {
		run.UDPReorder = res.UDPReorder
	}
	for k, v := range res.Extra {
		if run.Extra == nil {
			run.Extra = map[string]float64{}
		}
		run.Extra[k] = v
	}
	if got := res.Extra["udp_received"]; workOK && got > 0 {
		// CPU per delivered datagram, generator excluded (workMeter),
		// and how many cores' worth the receive path and sink kept busy.
		run.Extra["work_ns_per_msg"] = float64(workNs.Nanoseconds()) / got
		// Over the generator's active time (rate = datagrams / active
		// time), not the meter's window, which adds setup and drain.
		active := window.Seconds()
		if res.PPS > 0 {
			active = min(active, got/res.PPS)
		}
		run.Extra["work_cores"] = workNs.Seconds() / active
		run.Extra["work_irq_ns_per_msg"] = float64(irqNs.Nanoseconds()) / got
	}
	if got := res.Extra["udp_received"]; cost != nil && costErr == nil && got > 0 {
		if run.Extra == nil {
			run.Extra = map[string]float64{}
		}
		recordProgCost(run.Extra, ran, got)
	}
	if marked {
		// The service was high priority: a record that the rule was in
		// place, for readers and tests.
		if run.Extra == nil {
			run.Extra = map[string]float64{}
		}
		run.Extra["prio_marked"] = 1
	}
	if markedAlso {
		run.Extra["prio_marked_also"] = 1 // prio_mixed's second service too
	}
	return run
}

// steerCounts is the receiver's steering datapath's counters, summed over
// stages, if one is pinned.
func steerCounts(ns string) (steer.Counters, bool) {
	dir := plan.PinDir(ns)
	if !steer.Pinned(dir) {
		return steer.Counters{}, false
	}
	d, err := steer.Open(dir)
	if err != nil {
		return steer.Counters{}, false
	}
	defer d.Close()
	st, err := d.Stats()
	if err != nil {
		return steer.Counters{}, false
	}
	var sum steer.Counters
	for _, c := range st {
		sum = sum.Add(c)
	}
	return sum, true
}

const noForwardRulesNote = "flanneld ran with --iptables-forward-rules=false (--flanneld-forward-rules=false): no iptables table on the hosts, their FORWARD policy accept."

const bothHostsNote = "Each mode ran on both hosts (--both-hosts), each with its own agent, as an operator runs lanes on every node; the figures are the receiving host's."

// apply puts the receiving host (and with Options.BothHosts the sending
// one) into mode. native and vanilla both mean "as the kernel does it": no
// lanes change.
func (r *runner) apply(mode string) error {
	want := mode
	if mode == "native" {
		want = "vanilla"
	}
	if r.applied == want {
		return nil
	}
	r.stopAgent()
	r.applied = ""
	if r.xdpPassOff != nil {
		if err := r.xdpPassOff(); err != nil {
			return fmt.Errorf("detaching the pass-through XDP program: %w", err)
		}
		r.xdpPassOff = nil
	}
	base, params, err := ParseModeSpec(want)
	if err != nil {
		return err
	}
	cpus, params := modeCPUs(params)
	if cpu, ok := r.tb.GivenIRQCPU(); ok {
		params = plan.WithIRQ(base, params, cpu)
	}
	if r.o.BothHosts {
		// The sender first: the receiver's agent then settles with
		// the sender's path as it will be measured.
		ag, _, err := r.applyOn(r.tb.Sender().NetNS, mode+"@sender", want, base, params, cpus)
		if err != nil {
			return fmt.Errorf("on the sending host: %w", err)
		}
		r.senderAgent = ag
	}
	ag, st, err := r.applyOn(r.tb.Receiver().NetNS, mode, want, base, params, cpus)
	if err != nil {
		return err
	}
	r.agent = ag
	if xdpPassOn(want) {
		rc := r.tb.Receiver()
		if r.xdpPassOff, err = attachXDPPass(rc.NetNS, rc.Underlay); err != nil {
			return err
		}
	}
	if ag != nil {
		r.noteAgentOnce()
		// Measure the mode as it runs on a host, not its first second:
		// an agent needs a few rounds to bring Falcon's stages home
		// and parkAfter rounds (1 s) to park them. A reconciler alone
		// changes no placement.
		if st.Plan.Agent != "" {
			time.Sleep(agentSettle)
		}
	}
	r.applied = want
	return nil
}

// agentSettle is how long a freshly started agent runs before the
// measurement starts.
const agentSettle = 1500 * time.Millisecond

func (r *runner) stopAgent() {
	if r.agent != nil {
		r.agent.stop()
		r.agent = nil
	}
	if r.senderAgent != nil {
		r.senderAgent.stop()
		r.senderAgent = nil
	}
}

// applyOn applies mode want (base with params on cpus) to namespace ns and
// starts its agent where it has one, as `lanes apply` advises (a static
// mode with a steering datapath gets lanes agent's queue reconciler);
// label names it in the agent log.
func (r *runner) applyOn(ns, label, want, base string, params map[string]string, cpus string) (benchAgent, *control.State, error) {
	st, err := control.Apply(control.Options{Mode: base, NetNS: ns, StateDir: r.stateDir, Params: params, CPUs: cpus})
	if err != nil {
		return nil, nil, fmt.Errorf("applying %s: %w", want, err)
	}
	if st.Plan.Agent == "" && !steer.Pinned(plan.PinDir(st.NetNS)) {
		return nil, st, nil
	}
	if agentOff(want) {
		fmt.Fprintf(r.agentLog, "%s %s: agent=false: no agent\n", time.Now().UTC().Format("15:04:05.000"), label)
		return nil, st, nil
	}
	var ag benchAgent
	if r.o.AgentBinary != "" {
		ag, err = startProcAgent(r.o.AgentBinary, st.NetNS, r.stateDir, &agentOutput{log: r.agentLog, mode: label})
	} else {
		ag, err = startInAgent(st.NetNS, r.stateDir, func(format string, args ...any) {
			fmt.Fprintf(r.agentLog, "%s %s: %s\n", time.Now().UTC().Format("15:04:05.000"), label, fmt.Sprintf(format, args...))
		})
	}
	if err != nil {
		return nil, st, fmt.Errorf("starting the %s agent: %w", want, err)
	}
	return ag, st, nil
}

// noteAgentOnce says in the report, once, where the modes' agents ran.
func (r *runner) noteAgentOnce() {
	note := agentNoteIn
	if r.o.AgentBinary != "" {
		note = agentNoteProc
	}
	if !slices.Contains(r.file.Notes, note) {
		r.file.Notes = append(r.file.Notes, note)
	}
}

const (
	agentNoteProc = "Each mode's agent ran as its own `lanes agent` process, as deployed: its threads off the cores that poll the NIC where another core is left."
	agentNoteIn   = "Each mode's agent ran inside the benchmark's process, its threads on any core (a test binary; `lanes bench` runs them as their own process)."
)

// agentStatus is the running agent's status as of since (nil: no agent).
func (r *runner) agentStatus(since time.Time) []byte {
	if r.agent == nil {
		return nil
	}
	return r.agent.status(since)
}

// endpoints: overlay modes run container to container across hosts; native
// runs host to host over the underlay. The sending application is pinned
// off the IRQ core, so the receive path being measured has that core.
func (r *runner) endpoints(mode string, p point) (srv, cli workload.Endpoint, err error) {
	s, rc := r.tb.Sender(), r.tb.Receiver()
	var sendCPUs []int
	for c := 0; c < runtime.NumCPU(); c++ {
		if c != r.o.IRQCPU {
			sendCPUs = append(sendCPUs, c)
		}
	}
	if mode == "native" {
		srv = workload.Endpoint{NetNS: rc.NetNS, Addr: rc.UnderlayAddr.Addr()}
		cli = workload.Endpoint{NetNS: s.NetNS, Addr: s.UnderlayAddr.Addr(), CPUs: sendCPUs}
	} else {
		srv = workload.Endpoint{NetNS: rc.Containers[0].NetNS, Addr: rc.Containers[0].Addr.Addr()}
		cli = workload.Endpoint{NetNS: s.Containers[0].NetNS, Addr: s.Containers[0].Addr.Addr(), CPUs: sendCPUs}
	}
	if cpus := appCPUs(p.workload, r.o.IRQCPU, sendCPUs, r.o.ServiceApart); cpus != nil {
		srv.CPUs = cpus
	}
	return srv, cli, nil
}

// appCPUs is where the receiving application of a receive-path workload
// runs (nil: wherever the workload puts it). udp_stress's sink and the
// priority workloads' marked server read on the receive core, so vanilla
// runs the whole receive path, application included, on one core (the
// papers' baseline); the generator keeps the other cores busy with what
// receive work leaves them (stressGen). serviceApart (--service-apart)
// puts the marked server on those other cores instead, as PRISM's
// evaluation gave its servers cores of their own.
func appCPUs(workload string, irq int, others []int, serviceApart bool) []int {
	switch {
	case isPrio(workload) && serviceApart:
		return others
	case workload == "udp_stress" || isPrio(workload):
		return []int{irq}
	}
	return nil
}

func (r *runner) workload(mode string, p point) (workload.Workload, error) {
	native := mode == "native"
	if s, ok := prioSpecs[p.workload]; ok {
		return &prioWorkload{prioSpec: s, target: r.stressTarget(native), gen: r.stressGen(), rate: p.background * r.capacity[native], sockperf: r.o.Background == BackgroundSockperf}, nil
	}
	if p.workload == "udp_stress" {
		return stress.NewUDPStress(r.stressTarget(native), r.stressGen()), nil
	}
	return workload.Lookup(p.workload)
}

// stressTarget aims the generator at the receiving container through the
// overlay, or (native) with plain UDP at the receiving host.
func (r *runner) stressTarget(native bool) stress.Target {
	s, rc := r.tb.Sender(), r.tb.Receiver()
	t := stress.Target{
		SenderNetNS: s.NetNS,
		SenderDev:   s.Underlay,
		SrcMAC:      s.UnderlayMAC,
		DstMAC:      rc.UnderlayMAC,
		SrcIP:       s.UnderlayAddr.Addr(),
		DstIP:       rc.UnderlayAddr.Addr(),
		VNI:         rc.VNI,
		VXLANPort:   uint16(rc.Port),
		Plain:       native,
	}
	if native {
		return t
	}
	if r.tb.Config.Topology == testbed.Docker {
		t.InnerSrcMAC = s.Containers[0].MAC
		t.InnerDstMAC = rc.Containers[0].MAC
	} else {
		t.InnerSrcMAC = s.VXLANMAC
		t.InnerDstMAC = rc.VXLANMAC
	}
	return t
}

// stressGen pins the generator off the IRQ core and lets it yield that
// core: Falcon and MFLOW measured receive capacity with senders on other
// machines, so the receiver had every core. On 2 cores the generator's core
// is the only one a mode can move receive work to; at normal priority a
// saturating generator starves kthreads there (on a PREEMPT_NONE kernel
// a kthread waits for a busy task on its core to yield: docs/architecture.md,
// "What a stock kernel forces"), at SCHED_IDLE it sends with what receive
// work leaves (mostly: see rxwait.go).
func (r *runner) stressGen() stress.GenConfig {
	cpu := 0
	if r.o.IRQCPU == 0 {
		cpu = runtime.NumCPU() - 1
	}
	return stress.GenConfig{CPU: cpu, Yield: true, Train: r.o.Train, Arrivals: r.o.Arrivals}
}

// ParseLoads reads --loads: a comma-separated list of percentages of the
// receive core ("0,65,95").
func ParseLoads(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSuffix(strings.TrimSpace(f), "%")
		if f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, fmt.Errorf("--loads: %q is not a percentage (give numbers like 0,65,95)", f)
		}
		if slices.Contains(out, v/100) {
			return nil, fmt.Errorf("--loads: %g%% given twice", v)
		}
		out = append(out, v/100)
	}
	return out, nil
}

// ParseRates reads --rates: a comma-separated list of packet rates, each a
// number with an optional k or M suffix ("300k,1.2M", "450000").
func ParseRates(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		mult := 1.0
		switch {
		case strings.HasSuffix(f, "k"), strings.HasSuffix(f, "K"):
			mult, f = 1e3, f[:len(f)-1]
		case strings.HasSuffix(f, "M"):
			mult, f = 1e6, f[:len(f)-1]
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("--rates: %q is not a packet rate (give numbers like 300k, 1.2M or 450000)", f)
		}
		r := int(v * mult)
		if slices.Contains(out, r) {
			return nil, fmt.Errorf("--rates: %d packets/s given twice", r)
		}
		out = append(out, r)
	}
	slices.Sort(out)
	return out, nil
}

// trainShape says how paced generator traffic is spaced (--train).
func trainShape(train int, arrivals string) string {
	if arrivals == stress.ArrivalsPoisson {
		if train > 1 {
			return fmt.Sprintf("in trains of %d back to back (--train) starting at Poisson times (--arrivals poisson: exponential gaps of the mean spacing), as a NIC that coalesces interrupts hands over the traffic of many senders", train)
		}
		return "at Poisson times (--arrivals poisson: exponential gaps of the mean spacing), as the merged traffic of many independent senders arrives"
	}
	if train > 1 {
		return fmt.Sprintf("in trains of %d back to back at the average rate (--train), as a NIC that coalesces interrupts hands them over", train)
	}
	return "evenly spaced (--train 1)"
}

// resetLeftovers restores the knobs of every target of this bench's testbed
// (state directories named prefix-...) under stateDir, and only those: an
// operator's own targets in the same directory are not the bench's to touch.
func resetLeftovers(progress io.Writer, stateDir, prefix string) error {
	ents, err := os.ReadDir(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", stateDir, err)
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !testbed.IsTestbedNS(prefix, e.Name()) {
			continue
		}
		res, err := control.Reset(e.Name(), stateDir)
		if err != nil {
			errs = append(errs, err)
		}
		if res != nil && !res.Nothing {
			fmt.Fprintf(progress, "restored what an earlier bench left in %s\n", e.Name())
		}
	}
	return errors.Join(errs...)
}

// strayList names up to three stray processes, and how many more.
func strayList(st []testbed.Stray) string {
	var names []string
	for i, s := range st {
		if i == 3 {
			names = append(names, fmt.Sprintf("and %d more", len(st)-3))
			break
		}
		names = append(names, s.String())
	}
	return strings.Join(names, ", ")
}

// benchLockDir holds one lock file per testbed prefix; /run/lock is the
// system's place for them (a tmpfs: nothing outlives a reboot).
var benchLockDir = "/run/lock"

// lockBench makes sure one bench at a time uses the testbed with this
// prefix: a second one would rebuild the first one's testbed and restore
// its knobs under it (resetLeftovers). The kernel drops the lock when the
// bench dies, so a killed bench never blocks the next.
func lockBench(prefix string) (unlock func(), err error) {
	if err := os.MkdirAll(benchLockDir, 0o755); err != nil {
		return nil, fmt.Errorf("bench lock: %w", err)
	}
	path := filepath.Join(benchLockDir, "lanes-bench-"+prefix+".lock")
	for tries := 0; tries < 5; tries++ {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|unix.O_NOFOLLOW, 0o644)
		if err != nil {
			return nil, fmt.Errorf("bench lock: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("another lanes bench is running on the testbed %q: wait for it to end, or give this one another --prefix", prefix)
			}
			return nil, fmt.Errorf("bench lock %s: %w", path, err)
		}
		// The bench before may have removed the file between our open
		// and our lock (it removes it while it still holds it): then we
		// hold a lock nobody else can see, and must take the file that
		// is at the path now.
		held, herr := f.Stat()
		there, terr := os.Stat(path)
		if herr == nil && terr == nil && os.SameFile(held, there) {
			return func() {
				os.Remove(path) // while still locked, so no one locks it after us
				f.Close()
			}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("bench lock %s: keeps being removed and made again", path)
}

// guardFields are what the benchmark reads of prism's guard's status,
// high=auto's stepping aside among them.
type guardFields struct {
	Watch     string `json:"watch"`
	Demotions uint64 `json:"demotions"`
	Demoted   bool   `json:"demoted"`
	High      *struct {
		Aside *struct {
			On    bool      `json:"on"`
			Since time.Time `json:"since"`
		} `json:"aside"`
	} `json:"high_auto"`
}

// guardOf reads prism's guard's status from an agent (its JSON, as
// `lanes status --json` shows it, so the benchmark needs no policy
// package): at the top (prism-batch's guard agent) or under "guard"
// (prism-sync's agent, which runs the guard beside its own work); ok is
// false where the agent has neither.
func guardOf(b []byte) (guardFields, bool) {
	if b == nil {
		return guardFields{}, false
	}
	var v struct {
		guardFields
		Guard *guardFields `json:"guard"`
	}
	if json.Unmarshal(b, &v) != nil {
		return guardFields{}, false
	}
	switch {
	case v.Watch != "" || v.High != nil:
		return v.guardFields, true
	case v.Guard != nil:
		return *v.Guard, true
	}
	return guardFields{}, false
}

// guardStatus is the starvation guard's part: ok is false for an agent
// without a guard, or whose guard has nothing to watch.
func guardStatus(status []byte) (guardFields, bool) {
	g, ok := guardOf(status)
	return g, ok && g.Watch != ""
}

// prismAside says whether PRISM stood aside (high_auto.aside.on) at the
// moment at (zero: when the agent reported); ok is false for an agent
// that does not step aside. The report comes a second or two after at,
// with the background stopped: a state that changed after at
// (aside.since) held the other way at at, as no two changes fit in that
// time (stepping aside takes a second of samples).
func prismAside(status []byte, at time.Time) (on, ok bool) {
	g, _ := guardOf(status)
	if g.High == nil || g.High.Aside == nil {
		return false, false
	}
	a := g.High.Aside
	if !at.IsZero() && a.Since.After(at) {
		return !a.On, true
	}
	return a.On, true
}
