package results

import (
	"cmp"
	"slices"
	"sort"

	"github.com/lanesnet/lanes/internal/stats"
)

// Point is a workload point: everything that identifies a measurement
// except the mode and the repeat.
type Point struct {
	Workload   string
	Proto      string
	MsgSize    int
	Flows      int
	Background float64
	Rate       int  // offered packets/s, 0 = unpaced
	Awake      bool // cores kept out of idle states (Run.Awake)
}

// Key identifies a group of repeats: one mode at one point.
type Key struct {
	Mode string
	Point
}

// Point returns the run's workload point.
func (r *Run) Point() Point {
	return Point{Workload: r.Workload, Proto: r.Proto, MsgSize: r.MsgSize, Flows: r.Flows, Background: r.Background, Rate: r.Rate, Awake: r.Awake}
}

// Key returns the run's group key.
func (r *Run) Key() Key { return Key{Mode: r.Mode, Point: r.Point()} }

// Group is the repeats of one mode at one point.
type Group struct {
	Key
	Runs   []Run // repeats that measured something (no Error)
	Failed []Run // repeats with an Error; never part of the statistics
}

// Metric picks one number out of a run.
type Metric struct {
	Name string // short, for table headers: "throughput"
	Unit string // "Gbit/s", "µs", "" for counts
	Get  func(*Run) float64
}

// The metrics the report and the plots use. Others are one Metric literal
// away (see ExtraMetric).
var (
	Throughput = Metric{"throughput", "Gbit/s", func(r *Run) float64 { return r.ThroughputGbps }}
	PPS        = Metric{"rate", "msg/s", func(r *Run) float64 { return r.PPS }}
	SentPPS    = Metric{"offered", "msg/s", func(r *Run) float64 { return r.SentPPS }}
	LatP50     = Metric{"p50", "µs", func(r *Run) float64 { return r.LatP50Us }}
	LatP99     = Metric{"p99", "µs", func(r *Run) float64 { return r.LatP99Us }}
	LatP999    = Metric{"p99.9", "µs", func(r *Run) float64 { return r.LatP999Us }}
	LatAvg     = Metric{"avg", "µs", func(r *Run) float64 { return r.LatAvgUs }}
	LatMin     = Metric{"min", "µs", func(r *Run) float64 { return r.LatMinUs }}
	// RequestRate is PPS for request/response workloads: completed
	// operations (memcached) or requests (nginx) per second.
	RequestRate  = Metric{"rate", "req/s", func(r *Run) float64 { return r.PPS }}
	Retrans      = Metric{"retrans", "", func(r *Run) float64 { return float64(r.Retrans) }}
	OFO          = Metric{"ofo", "", func(r *Run) float64 { return float64(r.OFO) }}
	DSACK        = Metric{"dsack", "", func(r *Run) float64 { return float64(r.DSACK) }}
	UDPReorder   = Metric{"udp_reorder", "", func(r *Run) float64 { return float64(r.UDPReorder) }}
	DropsSoftnet = Metric{"drops_softnet", "", func(r *Run) float64 { return float64(r.DropsSoftnet) }}
	DropsSocket  = Metric{"drops_socket", "", func(r *Run) float64 { return float64(r.DropsSocket) }}
	DropsNIC     = Metric{"drops_nic", "", func(r *Run) float64 { return float64(r.DropsNIC) }}
	// CPUBusy is the summed busy percent over all CPUs (200 = two cores
	// saturated): the cost side of a throughput number.
	CPUBusy = Metric{"cpu_busy", "%", func(r *Run) float64 {
		var s float64
		for _, c := range r.CPU {
			s += 100 - c.Idle
		}
		return s
	}}
	// CPUSpread is the population standard deviation of the per-CPU busy
	// percent: how evenly the work is spread (MFLOW's figure of merit for
	// balance; 0 = every core equally busy).
	CPUSpread = Metric{"cpu_stddev", "%", func(r *Run) float64 {
		busy := make([]float64, len(r.CPU))
		for i, c := range r.CPU {
			busy[i] = 100 - c.Idle
		}
		return stats.StdDev(busy)
	}}
)

// AlsoRate and AlsoP99 are the second marked service of a mixed priority
// workload (prio_mixed: memcached beside the ping-pong): its request rate
// and p99 latency.
var (
	AlsoRate = Metric{"2nd service rate", "req/s", func(r *Run) float64 { return r.Extra["also_rps"] }}
	AlsoP99  = Metric{"2nd service p99", "µs", func(r *Run) float64 { return r.Extra["also_p99_us"] }}
)

// BackgroundKpps is the low-priority background a priority workload's
// receiver got (Kpps): PRISM must not starve it.
var BackgroundKpps = Metric{"background received", "Kpps", func(r *Run) float64 { return r.Extra["bg_received_kpps"] }}

// BackgroundOffered is what the generator offered the low-priority
// receiver (Kpps).
var BackgroundOffered = Metric{"background offered", "Kpps", func(r *Run) float64 { return r.Extra["bg_offered_kpps"] }}

// BackgroundAsked is the share of the background asked for (the load's
// share of the calibrated capacity) that the generator offered (%):
// below 100 its core could not keep the pace (busy with a service's
// client, say), and the point ran under a lighter load than its label.
var BackgroundAsked = Metric{"background offered", "% of asked", func(r *Run) float64 {
	if t := r.Extra["bg_target_kpps"]; t > 0 {
		return 100 * r.Extra["bg_offered_kpps"] / t
	}
	return 0
}}

// BackgroundLate is the share of the background the generator sent late,
// in catch-up bursts after it lost its core for more than one packet's
// interval (%): the background the point is labelled with was evenly
// spaced only to the extent this is small.
var BackgroundLate = Metric{"background sent late", "%", func(r *Run) float64 { return 100 * r.Extra["bg_late_share"] }}

// GuardDemotions is how often prism's starvation guard (in `lanes agent`)
// stepped in during a run: recorded only for modes whose agent has one.
var GuardDemotions = Metric{"guard demotions", "per run", func(r *Run) float64 { return r.Extra["guard_demotions"] }}

// recordedBy names, for metrics runs record only since some build, the
// Extra entry whose presence says a run did: older runs read 0 there,
// where 0 is also a real value.
var recordedBy = map[string]string{
	BackgroundAsked.Name + "\x00" + BackgroundAsked.Unit: "bg_target_kpps",
	BackgroundLate.Name + "\x00" + BackgroundLate.Unit:   "bg_late_share",
	GuardDemotions.Name + "\x00" + GuardDemotions.Unit:   "guard_demotions",
}

// StatRecorded summarises m over the repeats that recorded it (recordedBy;
// every repeat for a metric every run records).
func (g *Group) StatRecorded(m Metric) Stat {
	key, ok := recordedBy[m.Name+"\x00"+m.Unit]
	if !ok {
		return g.Stat(m)
	}
	var vs []float64
	for i := range g.Runs {
		if _, ok := g.Runs[i].Extra[key]; ok {
			vs = append(vs, m.Get(&g.Runs[i]))
		}
	}
	return Summarize(vs)
}

// Lost is the share of a ping-pong's messages that got no reply (%): the
// paced client counts a loss and goes on, so a run under heavy background
// has latencies for the answered ones and this beside them.
var Lost = Metric{"lost", "%", func(r *Run) float64 {
	if s := r.Extra["sent"]; s > 0 {
		return 100 * r.Extra["dropped"] / s
	}
	return 0
}}

// BackgroundShare is the share of the offered background its receiver
// got (%): below 100 the low-priority traffic lost packets.
var BackgroundShare = Metric{"background received", "% of offered", func(r *Run) float64 {
	if o := r.Extra["bg_offered_kpps"]; o > 0 {
		return 100 * r.Extra["bg_received_kpps"] / o
	}
	return 0
}}

// WorkPerMsg is the CPU one delivered datagram cost the receiving host,
// the generator's own time excluded (udp_stress): receive path and sink,
// including the work spent on frames dropped after they entered the path,
// and whatever else ran then but SCHED_IDLE threads (lanes' own agent,
// the benchmark's bookkeeping). Runs that could not measure it have none:
// summarise it with StatMeasured.
var WorkPerMsg = Metric{"CPU per datagram", "ns", func(r *Run) float64 { return r.Extra["work_ns_per_msg"] }}

// WorkCores is how many cores' worth of time the receive path and the
// sink took over a udp_stress run (generator excluded).
var WorkCores = Metric{"receive work", "cores", func(r *Run) float64 { return r.Extra["work_cores"] }}

// WorkIRQPerMsg is the IRQ core's part of WorkPerMsg (ns): what the core
// that polls the NIC spends per delivered datagram.
var WorkIRQPerMsg = Metric{"IRQ core's part", "ns", func(r *Run) float64 { return r.Extra["work_irq_ns_per_msg"] }}

// The Run.Extra keys of lanes' BPF programs' cost per delivered datagram
// (udp_stress under bench --bpf-stats): their run time in all (ns), their
// runs, and each program's run time as BPFNsPerMsg+":"+name. A mode
// without programs has them at zero; a run without the statistics has
// none.
const (
	BPFNsPerMsg   = "bpf_ns_per_msg"
	BPFRunsPerMsg = "bpf_runs_per_msg"
)

// HasBPFCost says whether r was measured with the statistics on.
func HasBPFCost(r *Run) bool {
	_, ok := r.Extra[BPFNsPerMsg]
	return ok
}

// StatBPF summarises over g's runs that were measured with the
// statistics on an Extra value that may rightly be zero (a mode without
// programs).
func (g *Group) StatBPF(key string) Stat {
	var vs []float64
	for i := range g.Runs {
		if HasBPFCost(&g.Runs[i]) {
			vs = append(vs, g.Runs[i].Extra[key])
		}
	}
	return Summarize(vs)
}

// ExtraMetric reads r.Extra[name] (zero when absent).
func ExtraMetric(name, unit string) Metric {
	return Metric{name, unit, func(r *Run) float64 { return r.Extra[name] }}
}

// Stat summarises a metric over repeats.
type Stat struct {
	N                int
	Median, Min, Max float64
}

// Summarize returns the median, min and max of vs; N = 0 when empty. The
// median of an even count is the mean of the middle two.
func Summarize(vs []float64) Stat {
	if len(vs) == 0 {
		return Stat{}
	}
	s := slices.Clone(vs)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Stat{N: n, Median: med, Min: s[0], Max: s[n-1]}
}

// Stat summarises m over the group's successful repeats.
func (g *Group) Stat(m Metric) Stat {
	vs := make([]float64, len(g.Runs))
	for i := range g.Runs {
		vs[i] = m.Get(&g.Runs[i])
	}
	return Summarize(vs)
}

// StatMeasured summarises m over the repeats that measured it (m non-zero):
// for figures a run records only when it could take them (the work per
// datagram), where a missing one must not count as 0.
func (g *Group) StatMeasured(m Metric) Stat {
	var vs []float64
	for i := range g.Runs {
		if v := m.Get(&g.Runs[i]); v != 0 {
			vs = append(vs, v)
		}
	}
	return Summarize(vs)
}

// MedianRun returns the successful repeat whose m is the group's median
// (the lower middle one for even counts), so a plot can show one real
// distribution rather than a blend; nil when no repeat succeeded.
func (g *Group) MedianRun(m Metric) *Run {
	if len(g.Runs) == 0 {
		return nil
	}
	idx := make([]int, len(g.Runs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return m.Get(&g.Runs[idx[a]]) < m.Get(&g.Runs[idx[b]]) })
	return &g.Runs[idx[(len(idx)-1)/2]]
}

// CPU returns the per-CPU median of each field of the split over the
// group's repeats, sorted by CPU. Fields are medianed independently, so
// the parts need not sum to exactly 100.
func (g *Group) CPU() []CPUUse {
	byCPU := map[int][]CPUUse{}
	for _, r := range g.Runs {
		for _, c := range r.CPU {
			byCPU[c.CPU] = append(byCPU[c.CPU], c)
		}
	}
	cpus := make([]int, 0, len(byCPU))
	for c := range byCPU {
		cpus = append(cpus, c)
	}
	sort.Ints(cpus)
	out := make([]CPUUse, 0, len(cpus))
	for _, c := range cpus {
		us := byCPU[c]
		med := func(f func(CPUUse) float64) float64 {
			vs := make([]float64, len(us))
			for i, u := range us {
				vs[i] = f(u)
			}
			return Summarize(vs).Median
		}
		out = append(out, CPUUse{
			CPU:      c,
			SoftIRQ:  med(func(u CPUUse) float64 { return u.SoftIRQ }),
			System:   med(func(u CPUUse) float64 { return u.System }),
			User:     med(func(u CPUUse) float64 { return u.User }),
			Idle:     med(func(u CPUUse) float64 { return u.Idle }),
			Kthreads: med(func(u CPUUse) float64 { return u.Kthreads }),
			NetRX:    uint64(med(func(u CPUUse) float64 { return float64(u.NetRX) }) + 0.5),
		})
	}
	return out
}

// Agg is a File's runs grouped by mode and point.
type Agg struct {
	// Groups in a stable order: workload (first appearance), point
	// (proto, msg size, flows, background ascending), mode (File.Modes
	// order, then first appearance).
	Groups []*Group
	byKey  map[Key]*Group
	modes  []string
}

// Aggregate groups f's runs.
func (f *File) Aggregate() *Agg { return Aggregate(f.Runs, f.Modes) }

// Aggregate groups runs; modeOrder (may be nil) orders the modes, and
// modes not in it follow in order of first appearance.
func Aggregate(runs []Run, modeOrder []string) *Agg {
	a := &Agg{byKey: map[Key]*Group{}}
	wlRank := map[string]int{}
	modeRank := map[string]int{}
	for _, m := range modeOrder {
		if _, ok := modeRank[m]; !ok {
			modeRank[m] = len(modeRank)
			a.modes = append(a.modes, m)
		}
	}
	for _, r := range runs {
		if _, ok := wlRank[r.Workload]; !ok {
			wlRank[r.Workload] = len(wlRank)
		}
		if _, ok := modeRank[r.Mode]; !ok {
			modeRank[r.Mode] = len(modeRank)
			a.modes = append(a.modes, r.Mode)
		}
		k := r.Key()
		g := a.byKey[k]
		if g == nil {
			g = &Group{Key: k}
			a.byKey[k] = g
			a.Groups = append(a.Groups, g)
		}
		if r.Error != "" {
			g.Failed = append(g.Failed, r)
		} else {
			g.Runs = append(g.Runs, r)
		}
	}
	for _, g := range a.Groups {
		sort.SliceStable(g.Runs, func(i, j int) bool { return g.Runs[i].Repeat < g.Runs[j].Repeat })
	}
	slices.SortStableFunc(a.Groups, func(x, y *Group) int {
		return cmp.Or(
			cmp.Compare(wlRank[x.Workload], wlRank[y.Workload]),
			comparePoint(x.Point, y.Point),
			cmp.Compare(modeRank[x.Mode], modeRank[y.Mode]),
		)
	})
	// Modes that only appear in modeOrder but ran nothing are kept: a
	// table can still show that they are missing.
	return a
}

func comparePoint(x, y Point) int {
	return cmp.Or(
		cmp.Compare(x.Proto, y.Proto),
		cmp.Compare(x.MsgSize, y.MsgSize),
		cmp.Compare(x.Flows, y.Flows),
		cmp.Compare(x.Background, y.Background),
		cmp.Compare(x.Rate, y.Rate),
		compareBool(y.Awake, x.Awake), // awake first: the baseline
	)
}

func compareBool(x, y bool) int {
	switch {
	case x == y:
		return 0
	case !x:
		return -1
	}
	return 1
}

// Group returns the group of k, or nil.
func (a *Agg) Group(k Key) *Group { return a.byKey[k] }

// Modes returns the modes in report order.
func (a *Agg) Modes() []string { return slices.Clone(a.modes) }

// Workloads returns the workloads that have runs, in first-run order.
func (a *Agg) Workloads() []string {
	var out []string
	for _, g := range a.Groups {
		if !slices.Contains(out, g.Workload) {
			out = append(out, g.Workload)
		}
	}
	return out
}

// Points returns the distinct points of a workload, sorted.
func (a *Agg) Points(workload string) []Point {
	var out []Point
	for _, g := range a.Groups {
		if g.Workload == workload && !slices.Contains(out, g.Point) {
			out = append(out, g.Point)
		}
	}
	return out
}

// ModesAt returns the modes that have a group at p, in report order.
func (a *Agg) ModesAt(p Point) []string {
	var out []string
	for _, m := range a.modes {
		if a.byKey[Key{m, p}] != nil {
			out = append(out, m)
		}
	}
	return out
}

// Ratio returns the median of m for k divided by the median of m for the
// same point in mode base ("vanilla", "native"). ok is false when either
// group is missing or has no successful repeat, or the base median is 0:
// a missing baseline means no ratio, not a failure.
func (a *Agg) Ratio(k Key, m Metric, base string) (ratio float64, ok bool) {
	g, b := a.byKey[k], a.byKey[Key{base, k.Point}]
	if g == nil || b == nil || len(g.Runs) == 0 || len(b.Runs) == 0 {
		return 0, false
	}
	bm := b.Stat(m).Median
	if bm == 0 {
		return 0, false
	}
	return g.Stat(m).Median / bm, true
}

// PairedRatio is the spread of k's mode against base at k's point, round
// by round: the ratio of m in each repeat that both measured (the modes
// are interleaved, so a repeat's two runs saw the same state of the
// machine), and a distribution-free interval for those ratios' median at
// conf or the nearest below it that n pairs allow (MedianInterval). A
// target is decided where the interval clears it.
func (a *Agg) PairedRatio(k Key, m Metric, base string, conf float64) (lo, hi, coverage float64, n int, ok bool) {
	g, b := a.byKey[k], a.byKey[Key{base, k.Point}]
	if g == nil || b == nil {
		return 0, 0, 0, 0, false
	}
	byRepeat := map[int]float64{}
	for i := range b.Runs {
		byRepeat[b.Runs[i].Repeat] = m.Get(&b.Runs[i])
	}
	var rs []float64
	for i := range g.Runs {
		if v, ok := byRepeat[g.Runs[i].Repeat]; ok && v != 0 {
			rs = append(rs, m.Get(&g.Runs[i])/v)
		}
	}
	lo, hi, coverage, ok = stats.MedianInterval(rs, conf)
	return lo, hi, coverage, len(rs), ok
}
