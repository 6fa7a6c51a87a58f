package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/lanesnet/lanes/bench/metrics"
	"github.com/lanesnet/lanes/bench/stress"
	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
)

// PRISM's evaluation: a high-priority service between the containers while
// the stress generator (or, with --background sockperf, sockperf's
// throughput client, the paper's tool) offers low-priority UDP to the same
// receiving container (or, on the native path, host) at a fraction of what
// the receive core can take (point.background). The service's latency (and,
// for applications, its rate) is the result; the background's received
// rate is the low-priority throughput, which must not collapse.
//
//	prio_latency    UDP ping-pong at 1000 msg/s (Fig. 9, 10, 11): the
//	                sockperf server, lanes' paced client (see below)
//	prio_memcached  memcached + memaslap (Fig. 12)
//	prio_nginx      nginx + wrk, one connection, a page under 1 KB (Fig. 13)
//	prio_sporadic   the same ping-pong at 10 msg/s: a marked flow that
//	                pauses 100 ms between requests (not in the paper; what
//	                prism's quiet setting costs; only when asked for)
//	prio_mixed      the ping-pong of prio_latency and, beside it, the
//	                memcached of prio_memcached, each marked by its own
//	                rule: a light and a busy marked service at once (not
//	                in the paper; what high=auto's per-rule switch is for;
//	                only when asked for). The ping-pong's latency is the
//	                result, memcached's rate and p99 are in Extra
//	                (also_rps, also_p99_us)
//	prio_sporadic_mixed  prio_sporadic's ping-pong (10 msg/s) beside
//	                prio_mixed's marked memcached: a light marked flow
//	                that pauses 100 ms between requests beside a busy one,
//	                where bulk=auto has bulk in the NIC poll when each
//	                request comes (not in the paper; what bulk=auto costs;
//	                only when asked for; give it a long --duration)
//	prio_latency_sockperf  prio_latency with sockperf's own client, which
//	                busy-waits between messages on the generator's core
//	                (only when asked for: to compare with the client the
//	                papers ran)
//
// The ping-pongs run lanes' paced client (workload.PingPong.Paced)
// against the sockperf server: sockperf's client busy-waits for its next
// send on the one core the generator has, and the background then comes in
// bursts in step with the ping-pong rather than evenly spaced
// (bench/workload/paced.go says why).
const (
	prioLatencyWorkload   = "prio_latency"
	prioMemcachedWorkload = "prio_memcached"
	prioNginxWorkload     = "prio_nginx"
	prioSporadicWorkload  = "prio_sporadic"
	prioMixedWorkload     = "prio_mixed"
	prioSporadicMixed     = "prio_sporadic_mixed"
	prioLatencySockperf   = "prio_latency_sockperf"

	// bgPayload is the background datagrams' payload: small packets, the
	// receive path's per-packet cost, as the capacity was calibrated.
	bgPayload = 64
	// prioLead starts the background this long before the service's
	// client (sockperf's: this long after its start wait,
	// workload.SockperfTPStart), and it runs this much longer, so every
	// request sees it.
	prioLead = 700 * time.Millisecond
)

// prioSpec is one high-priority service and the points it is measured at.
type prioSpec struct {
	name    string
	fg      workload.Workload
	proto   string // "udp" or "tcp": the service's, also for its prio rule
	msgSize int
	flows   int
	rate    int // offered requests/s; 0: as fast as the tool goes
	// full and quick are the background loads, as fractions of the receive
	// core's capacity.
	full, quick []float64
	// also is a second marked service, run beside fg on port
	// alsoPortOffset above fg's, with its own rule (prio_mixed).
	also                   workload.Workload
	alsoProto              string
	alsoMsgSize, alsoFlows int
}

// A mixed workload's second service starts alsoLead before the first
// (memcached: about alsoStart to start its server and connect, then its
// rule's 0.3 s to switch) and its load runs alsoDuration: whole seconds
// (memaslap's -t), past the first one's end.
const (
	alsoLead  = time.Second
	alsoStart = 500 * time.Millisecond
)

func alsoDuration(d time.Duration) time.Duration {
	return (d + 2*alsoLead + time.Second - 1).Truncate(time.Second)
}

// alsoPortOffset is where the second service of a mixed workload listens,
// above the first's port (the background takes 8 above). memcached, the
// one second service, listens on that one port whatever its connections.
const alsoPortOffset = 4

var prioSpecs = map[string]prioSpec{
	// The paper's sweep (Fig. 11) went from 10% to 95%; 65% is its
	// 60-70% of Fig. 9 and 10.
	prioLatencyWorkload: {name: prioLatencyWorkload, fg: workload.PingPong{Paced: true}, proto: "udp", msgSize: 64, flows: 1, rate: 1000,
		full: []float64{0, 0.1, 0.3, 0.5, 0.65, 0.8, 0.95}, quick: []float64{0, 0.65}},
	// The memcached workload's own point: 550 B objects, 8 connections.
	prioMemcachedWorkload: {name: prioMemcachedWorkload, fg: workload.Memcached{}, proto: "tcp", msgSize: 550, flows: 8,
		full: []float64{0, 0.65, 0.9}, quick: []float64{0, 0.65}},
	prioNginxWorkload: {name: prioNginxWorkload, fg: workload.Nginx{}, proto: "tcp", msgSize: 512, flows: 1,
		full: []float64{0, 0.65, 0.9}, quick: []float64{0, 0.65}},
	// Every request comes after a 100 ms pause: with prism's quiet set
	// shorter, each one ends a quiet time and finds bulk in the NIC poll.
	// Few samples per second: give it a long --duration.
	prioSporadicWorkload: {name: prioSporadicWorkload, fg: workload.PingPong{Paced: true}, proto: "udp", msgSize: 64, flows: 1, rate: 10,
		full: []float64{0, 0.65}, quick: []float64{0, 0.65}},
	prioMixedWorkload: {name: prioMixedWorkload, fg: workload.PingPong{Paced: true}, proto: "udp", msgSize: 64, flows: 1, rate: 1000,
		full: []float64{0, 0.65}, quick: []float64{0, 0.65},
		also: workload.Memcached{}, alsoProto: "tcp", alsoMsgSize: 550, alsoFlows: 8},
	prioSporadicMixed: {name: prioSporadicMixed, fg: workload.PingPong{Paced: true}, proto: "udp", msgSize: 64, flows: 1, rate: 10,
		full: []float64{0, 0.65}, quick: []float64{0, 0.65},
		also: workload.Memcached{}, alsoProto: "tcp", alsoMsgSize: 550, alsoFlows: 8},
	prioLatencySockperf: {name: prioLatencySockperf, fg: workload.PingPong{}, proto: "udp", msgSize: 64, flows: 1, rate: 1000,
		full: []float64{0, 0.1, 0.3, 0.5, 0.65, 0.8, 0.95}, quick: []float64{0, 0.65}},
}

// prioNames are the default priority workloads in the order they run;
// prioExtra are the others, run only when --workloads names them.
var (
	prioNames = []string{prioLatencyWorkload, prioMemcachedWorkload, prioNginxWorkload}
	prioExtra = []string{prioSporadicWorkload, prioMixedWorkload, prioSporadicMixed, prioLatencySockperf}
)

func isPrio(wl string) bool {
	_, ok := prioSpecs[wl]
	return ok
}

// points returns the spec's points, one per background load: loads when
// given, else the spec's own.
func (s prioSpec) points(quick bool, loads []float64) []point {
	bgs := s.full
	switch {
	case len(loads) > 0:
		bgs = loads
	case quick:
		bgs = s.quick
	}
	out := make([]point, len(bgs))
	for i, bg := range bgs {
		out[i] = point{workload: s.name, proto: s.proto, msgSize: s.msgSize, flows: s.flows, rate: s.rate, background: bg}
	}
	return out
}

// prioWorkload runs a spec's service under background.
type prioWorkload struct {
	prioSpec
	target stress.Target
	gen    stress.GenConfig
	// rate is the background's offered rate (packets/s); 0 = idle.
	rate float64
	// sockperf offers the background with sockperf's throughput client
	// (--background sockperf) instead of the stress generator.
	sockperf bool
}

func (w *prioWorkload) Name() string { return w.name }

func (w *prioWorkload) Run(ctx context.Context, srv, cli workload.Endpoint, p workload.Point) (workload.Result, error) {
	wait, err := w.background(ctx, srv, cli, p)
	if err != nil {
		return workload.Result{}, err
	}
	// The second service starts first (alsoLead: its server's start and
	// its client's connections, then its rule's 0.3 s to switch) and runs
	// alsoDuration, past the first one's end, so the first one's whole
	// window sees it at full rate; a failure of the first stops it.
	alsoDone := make(chan struct{})
	var also workload.Result
	var aerr error
	alsoCtx, stopAlso := context.WithCancel(ctx)
	defer stopAlso()
	if w.also != nil {
		ap := workload.Point{Proto: w.alsoProto, MsgSize: w.alsoMsgSize, Flows: w.alsoFlows, Duration: alsoDuration(p.Duration), Port: p.Port + alsoPortOffset}
		go func() {
			defer close(alsoDone)
			also, aerr = w.also.Run(alsoCtx, srv, cli, ap)
		}()
		select {
		case <-time.After(alsoLead):
		case <-alsoDone: // failed while starting: no point running the first
			wait()
			return workload.Result{}, fmt.Errorf("%s beside it: %w", w.also.Name(), aerr)
		case <-ctx.Done():
		}
	} else {
		close(alsoDone)
	}
	fg := w.fg
	if pp, ok := fg.(workload.PingPong); ok && pp.Paced && w.rate <= 0 {
		// No generator keeps the client's core busy: the client does, as
		// sockperf's own would (workload.PingPong.Spin).
		pp.Spin = true
		fg = pp
	}
	res, ferr := fg.Run(ctx, srv, cli, p)
	if ferr != nil {
		stopAlso()
	}
	<-alsoDone
	bg, berr := wait()
	if ferr != nil && alsoCtx.Err() != nil && ctx.Err() == nil {
		aerr = nil // stopped for the first one's failure: not its own
	}
	if ferr != nil || aerr != nil {
		if aerr != nil {
			aerr = fmt.Errorf("%s beside it: %w", w.also.Name(), aerr)
		}
		return workload.Result{}, errors.Join(ferr, aerr)
	}
	if berr != nil {
		return workload.Result{}, fmt.Errorf("background: %w", berr)
	}
	if res.Extra == nil {
		res.Extra = map[string]float64{}
	}
	if w.also != nil {
		res.Extra["also_rps"] = also.PPS
		res.Extra["also_p99_us"] = also.LatP99Us
		res.Extra["also_p50_us"] = also.LatP50Us
	}
	res.Extra["bg_target_kpps"] = w.rate / 1e3
	res.Extra["bg_offered_kpps"] = bg.SentPPS / 1e3
	res.Extra["bg_received_kpps"] = bg.PPS / 1e3
	res.Extra["bg_lost"] = bg.Extra["udp_lost"]
	// Datagrams per train of the background (1: evenly spaced).
	res.Extra["bg_train"] = float64(max(w.gen.Train, 1))
	if w.sockperf {
		// 1: the run's background tool was sockperf's throughput client
		// (a setting, recorded on idle points too, as bg_train). It
		// reports neither its pacing's lapses nor the order datagrams
		// came in: those stay unset rather than 0, and the run's UDP
		// reorder count, the background's, is 0, not the service's.
		res.Extra["bg_sockperf"] = 1
		res.UDPReorder = 0
		return res, nil
	}
	// Times the background's pacer lost its core for longer than its burst
	// allowance (stress.GenStats.Stalls): the spacing the background was
	// calibrated with did not hold then, so modes compare unlike loads.
	res.Extra["bg_gen_stalls"] = bg.Extra["gen_stalls"]
	// The share of the background sent late, in catch-up bursts (the
	// same reason, shorter holds).
	if sent := bg.Extra["udp_sent"]; sent > 0 {
		res.Extra["bg_late_share"] = bg.Extra["gen_late"] / sent
	}
	// 1: the background's datagrams (trains) came at Poisson times.
	res.Extra["bg_poisson"] = bg.Extra["poisson"]
	// The run's UDP reorder count is the background's: the service's own
	// (sockperf's out_of_order) stays in Extra.
	res.UDPReorder = bg.UDPReorder
	return res, nil
}

// background starts the low-priority load (none when idle) and returns
// once it has run for prioLead (sockperf's: once it has started and run
// for prioLead); wait returns what its receiver got.
func (w *prioWorkload) background(ctx context.Context, srv, cli workload.Endpoint, p workload.Point) (wait func() (workload.Result, error), err error) {
	if w.rate <= 0 {
		return func() (workload.Result, error) { return workload.Result{}, nil }, nil
	}
	type bgResult struct {
		res workload.Result
		err error
	}
	done := make(chan bgResult, 1)
	g := w.gen
	g.Rate = w.rate
	bgp := workload.Point{MsgSize: bgPayload, Flows: 1, Duration: p.Duration + 2*prioLead, Port: p.Port + 8}
	if w.also != nil {
		// The second service starts after the background's lead and
		// runs alsoDuration once started; then the tail.
		bgp.Duration = prioLead + alsoStart + alsoDuration(p.Duration) + prioLead
	}
	// The background's receiver reads on the generator's core, as the
	// paper ran it on a core of its own: the receive core is for the
	// receive path and the high-priority server.
	bgSrv := srv
	bgSrv.CPUs = []int{g.CPU}
	var bgw workload.Workload = stress.NewUDPStress(w.target, g)
	bgCli := cli
	lead := prioLead
	if w.sockperf {
		// sockperf's client sends nothing for its first SockperfTPStart;
		// its -t (bgp.Duration) counts from then.
		lead += workload.SockperfTPStart
		// sockperf's client sends from the service client's container on
		// the generator's core, at SCHED_IDLE as the generator runs: it
		// sends with what that core's other tasks leave.
		bgw = workload.SockperfThroughput{Burst: max(g.Train, 1), Idle: true}
		bgp.Proto, bgp.Rate = "udp", int(math.Round(w.rate))
		bgCli.CPUs = []int{g.CPU}
	}
	go func() {
		r, err := bgw.Run(ctx, bgSrv, bgCli, bgp)
		done <- bgResult{r, err}
	}()
	wait = func() (workload.Result, error) { b := <-done; return b.res, b.err }
	select {
	case <-time.After(lead):
		return wait, nil
	case b := <-done:
		return nil, fmt.Errorf("background: ended before the service started: %v", b.err)
	case <-ctx.Done():
		wait()
		return nil, ctx.Err()
	}
}

// prioRule marks a point's high-priority service (its port on the
// receiving container, its protocol) in any mode with priority classes
// (prism*, falcon-prism, falcon:prio=true), until the
// returned undo. marked says whether a rule was added.
func (r *runner) prioRule(mode string, srv workload.Endpoint, port int, proto string) (marked bool, undo func(), err error) {
	base, params, _ := ParseModeSpec(mode)
	_, params = modeCPUs(params)
	if !plan.Prioritizes(base, params) {
		return false, func() {}, nil
	}
	rule := steer.Rule{Addr: srv.Addr, Port: uint16(port), Proto: 17}
	if proto == "tcp" {
		rule.Proto = 6
	}
	undo, err = r.addRule(rule)
	return err == nil, undo, err
}

// addRule adds a prio rule on the receiver until the returned undo.
func (r *runner) addRule(rule steer.Rule) (undo func(), err error) {
	set, err := control.OpenPrio(r.tb.Receiver().NetNS)
	if err != nil {
		return nil, err
	}
	if err := set.Add(rule); err != nil {
		set.Close()
		return nil, err
	}
	return func() {
		set.Del(rule)
		set.Close()
	}, nil
}

// calibrate finds what the receive core can take under vanilla, the 100% of
// the priority workloads' background loads, on the overlay or the native
// path. udp_stress at full rate is the first guess, but at full rate the
// receive core may be in livelock and deliver far less than it could, and
// differently from run to run, and a background sized from that takes only a
// fraction of the core. So the background itself is then offered, paced, at
// half and at 65% of the estimate, as the priority runs offer it (its
// receiver on the generator's core), and the receive core's busy share is
// measured: the capacity is the received rate over that share, from the
// second probe, which sits at the paper's operating point.
func (r *runner) calibrate(ctx context.Context, native bool, d time.Duration) error {
	if err := r.apply("vanilla"); err != nil {
		return err
	}
	mode := "vanilla"
	if native {
		mode = "native"
	}
	srv, cli, err := r.endpoints(mode, point{workload: "udp_stress"})
	if err != nil {
		return err
	}
	res, err := stress.NewUDPStress(r.stressTarget(native), r.stressGen()).Run(ctx, srv, cli, workload.Point{MsgSize: bgPayload, Flows: 1, Duration: d, Port: r.port()})
	if err == nil {
		// A measurement cut short by an interrupt measures nothing.
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("calibrating the %s background: %w", pathName(native), err)
	}
	if res.PPS < 1000 {
		return fmt.Errorf("calibrating the %s background: the receive core took only %.0f packets/s", pathName(native), res.PPS)
	}
	est := res.PPS
	how := fmt.Sprintf("udp_stress at full rate %.0f Kpps", res.PPS/1e3)
	for _, share := range []float64{0.5, 0.65} {
		got, busy, err := r.probe(ctx, native, srv, cli, share*est, d)
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return fmt.Errorf("calibrating the %s background: %w", pathName(native), err)
		}
		how += fmt.Sprintf("; %.0f Kpps paced: receive core %.0f%% busy", got/1e3, 100*busy)
		if busy < 0.05 || got < 1000 {
			break // too little to extrapolate from: keep the estimate
		}
		est = got / busy
	}
	r.capacity[native] = est
	r.calibration[native] = how
	fmt.Fprintf(r.o.Progress, "priority workloads: %s receive core capacity %.0f Kpps (vanilla; %s)\n", pathName(native), est/1e3, how)
	return nil
}

// probe offers the background at rate packets/s for d, as the priority
// runs do, and returns what its receiver got (packets/s) and the busy share
// of the receive core meanwhile (0..1).
func (r *runner) probe(ctx context.Context, native bool, srv, cli workload.Endpoint, rate float64, d time.Duration) (float64, float64, error) {
	g := r.stressGen()
	g.Rate = rate
	bgSrv := srv
	bgSrv.CPUs = []int{g.CPU}
	before, err := metrics.Take(metrics.Config{Kthreads: []string{}})
	if err != nil {
		return 0, 0, err
	}
	res, err := stress.NewUDPStress(r.stressTarget(native), g).Run(ctx, bgSrv, cli, workload.Point{MsgSize: bgPayload, Flows: 1, Duration: d, Port: r.port()})
	if err != nil {
		return 0, 0, err
	}
	after, err := metrics.Take(metrics.Config{Kthreads: []string{}})
	if err != nil {
		return 0, 0, err
	}
	for _, u := range metrics.Diff(before, after).CPU {
		if u.CPU == r.o.IRQCPU {
			return res.PPS, (100 - u.Idle) / 100, nil
		}
	}
	return 0, 0, fmt.Errorf("no CPU figures for the receive core %d", r.o.IRQCPU)
}

func pathName(native bool) string {
	if native {
		return "native path"
	}
	return "overlay"
}

// prioWorkloads are the priority workloads of this run.
func (r *runner) prioWorkloads() []string {
	var out []string
	for _, w := range r.o.Workloads {
		if isPrio(w) {
			out = append(out, w)
		}
	}
	return out
}

func (r *runner) prioServices() string {
	var out []string
	for _, w := range r.prioWorkloads() {
		s := prioSpecs[w]
		d := fmt.Sprintf("%s: %s", w, s.fg.Name())
		if s.rate > 0 {
			d += fmt.Sprintf(" at %d/s", s.rate)
		}
		out = append(out, d)
	}
	return strings.Join(out, "; ")
}

// prioCalibrate measures the capacity of every path a priority workload
// of this run takes, and says what the native path can show.
func (r *runner) prioCalibrate(ctx context.Context) error {
	if len(r.prioWorkloads()) == 0 {
		return nil
	}
	r.capacity = map[bool]float64{}
	r.calibration = map[bool]string{}
	d := min(r.o.Duration, 3*time.Second)
	var caps []string
	for _, native := range []bool{false, true} {
		if !r.hasPath(native) {
			continue
		}
		if err := r.calibrate(ctx, native, d); err != nil {
			return err
		}
		caps = append(caps, fmt.Sprintf("%.0f Kpps on the %s", r.capacity[native]/1e3, pathName(native)))
	}
	var hows []string
	for _, native := range []bool{false, true} {
		if h, ok := r.calibration[native]; ok {
			hows = append(hows, pathName(native)+": "+h)
		}
	}
	r.file.Notes = append(r.file.Notes, fmt.Sprintf("%s: background 100%% = %s, the receive core's capacity under vanilla at the start (64 B datagrams, %v per probe): "+
		"the received rate over the receive core's busy share while the background ran paced (%s); "+
		"the background is that share of it, offered by %s to the high-priority server's container (native: host), low priority, "+
		"its receiver on the generator's core; the service (%s) runs %s, high priority in prism modes. %s",
		strings.Join(r.prioWorkloads(), ", "), strings.Join(caps, " and "), d, strings.Join(hows, "; "), r.bgTool(), r.prioServices(), r.serviceWhere(), r.bgShape()))
	if r.hasPath(true) {
		r.file.Notes = append(r.file.Notes, "Native path (PRISM's Fig. 10): the priority workloads run host to host over the underlay, "+
			"their background plain UDP (no VXLAN) to the receiving host. lanes' prism modes steer VXLAN frames only, so the native path "+
			"is measured only as the kernel does it (mode native); the paper found no gain there: the host path has one stage, little to preempt.")
	}
	return nil
}

// bgTool says what offered the background.
func (r *runner) bgTool() string {
	if r.o.Background == BackgroundSockperf {
		return "sockperf's throughput client (--background sockperf) from the sending container (native: host), down its whole stack, at SCHED_IDLE on the generator's core"
	}
	return "the stress generator (ready-made frames into the sending host's underlay)"
}

// serviceWhere says where the marked service's server runs.
func (r *runner) serviceWhere() string {
	if r.o.ServiceApart {
		return "off the receive core (--service-apart), on the cores of its client and the background's receiver"
	}
	return "on the receive core"
}

// bgShape says how the background's datagrams are spaced.
func (r *runner) bgShape() string {
	if r.o.Background == BackgroundSockperf {
		shape := "evenly spaced at sockperf's pacing (--train 1)"
		if r.o.Train > 1 {
			shape = fmt.Sprintf("in bursts of %d back to back at the average rate (--train: sockperf --burst)", r.o.Train)
		}
		return "Background datagrams offered " + shape + "; the capacity was calibrated with the stress generator at the same spacing."
	}
	return "Background datagrams offered " + trainShape(r.o.Train, r.o.Arrivals) + "; the capacity was calibrated with the same spacing."
}

// hasPath says whether a mode of this run takes the native path (true)
// or the overlay (false).
func (r *runner) hasPath(native bool) bool {
	for _, m := range r.o.Modes {
		if (m == "native") == native {
			return true
		}
	}
	return false
}
