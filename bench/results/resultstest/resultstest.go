// Package resultstest makes a synthetic results.File: several modes,
// workloads, points and repeats with plausible numbers, for the tests of
// the report and the plots and for trying them without a testbed.
package resultstest

import (
	"fmt"
	"math"
	"time"

	"github.com/lanesnet/lanes/bench/results"
)

// jitter spreads the repeats around the mode's value so medians, minima
// and maxima all differ: repeat 0 low, 1 at the value, 2 high.
var jitter = []float64{0.96, 1.0, 1.05}

// File returns a synthetic results file with three repeats per point. Its
// shape, which the tests rely on:
//   - modes native, vanilla, rps; memcached has no native runs;
//   - tcp_stream and udp_stream at 64, 1400 and 65536 (udp: 8972) bytes;
//   - tcp_multi at 1, 2, 4, 8 flows; pingpong at 64 B with latency CDFs;
//   - udp_stress at 64 B; memcached with latency and requests/s;
//   - one failed rps repeat of tcp_stream at 64 B (repeat 3).
func File() *results.File {
	start := time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)
	f := &results.File{
		Machine: results.Machine{
			Hostname: "bench1", Kernel: "6.18.0", CPUModel: "Synthetic CPU @ 3.0GHz", CPUs: 2, MemGiB: 8,
			Topology: "docker", IRQCPU: 0, GoVer: "go1.26.0", LanesVer: "v0.0.0-test",
		},
		Started:  start,
		Ended:    start.Add(42 * time.Minute),
		Args:     []string{"lanes", "bench", "--repeats", "3"},
		Repeats:  3,
		Modes:    []string{"native", "vanilla", "rps"},
		Duration: 10,
		Notes:    []string{"rps: rps_cpus=3 on the receiving container's eth0"},
	}
	// Relative cost of a mode: the overlay roughly halves single-flow
	// throughput, RPS wins part of it back.
	scale := map[string]float64{"native": 1, "vanilla": 0.45, "rps": 0.62}
	add := func(r results.Run, mode string, v float64, fill func(r *results.Run, v float64)) {
		f.Runs = append(f.Runs, repeats(r, mode, v, fill)...)
	}
	tput := func(r *results.Run, v float64) {
		r.ThroughputGbps = v
		r.PPS = v * 1e9 / 8 / float64(r.MsgSize)
		if r.Mode != "native" {
			r.OFO = uint64(v * 10)
			r.Retrans = uint64(v)
		}
	}
	for _, mode := range f.Modes {
		s := scale[mode]
		for _, p := range []struct {
			msg  int
			gbps float64
		}{{64, 2}, {1400, 20}, {65536, 40}} {
			add(results.Run{Workload: "tcp_stream", Proto: "tcp", MsgSize: p.msg, Flows: 1}, mode, p.gbps*s, tput)
		}
		for _, p := range []struct {
			msg  int
			gbps float64
		}{{64, 0.5}, {1400, 8}, {8972, 25}} {
			add(results.Run{Workload: "udp_stream", Proto: "udp", MsgSize: p.msg, Flows: 1}, mode, p.gbps*s, func(r *results.Run, v float64) {
				tput(r, v)
				r.DropsSocket = uint64(1000 * (1 - s))
			})
		}
		for _, n := range []int{1, 2, 4, 8} {
			// More flows spread over the cores until both are busy.
			v := 40 * s * math.Min(1.6, 1+0.3*math.Log2(float64(n)))
			add(results.Run{Workload: "tcp_multi", Proto: "tcp", MsgSize: 131072, Flows: n}, mode, v, tput)
		}
		lat := map[string]float64{"native": 18, "vanilla": 31, "rps": 36}[mode]
		add(results.Run{Workload: "pingpong", Proto: "tcp", MsgSize: 64, Flows: 1}, mode, lat, func(r *results.Run, v float64) {
			r.LatMinUs, r.LatP50Us, r.LatAvgUs, r.LatP99Us, r.LatP999Us = v*0.7, v, v*1.1, v*2.5, v*4
			r.PPS = 1e6 / v
			r.LatCDF = cdf(v)
		})
		add(results.Run{Workload: "udp_stress", Proto: "udp", MsgSize: 64, Flows: 1}, mode, 1.2e6*s, func(r *results.Run, v float64) {
			r.PPS, r.SentPPS = v, 1.5e6
			r.UDPReorder = uint64(10 * (1 - s))
			r.DropsSoftnet = uint64(1.5e6 - v)
			// CPU per datagram, generator excluded, and the IRQ core's
			// part: vanilla does everything there, rps half.
			work := map[string]float64{"native": 1500, "vanilla": 2000, "rps": 2400}[mode]
			irq := map[string]float64{"native": 1500, "vanilla": 2000, "rps": 1000}[mode]
			r.Extra = map[string]float64{"work_ns_per_msg": work, "work_irq_ns_per_msg": irq, "work_cores": v * work / 1e9}
		})
		if mode != "native" {
			add(results.Run{Workload: "memcached", Proto: "tcp", MsgSize: 100, Flows: 16}, mode, lat*3, func(r *results.Run, v float64) {
				r.LatP50Us, r.LatP99Us, r.LatAvgUs = v, v*4, v*1.3
				r.PPS = 16e6 / v
				r.Extra = map[string]float64{"gets_per_s": 14e6 / v}
			})
		}
	}
	f.Runs = append(f.Runs, results.Run{
		Mode: "rps", Workload: "tcp_stream", Proto: "tcp", MsgSize: 64, Flows: 1, Repeat: 3,
		Error: "iperf3: unable to connect to server",
	})
	return f
}

// repeats returns three repeats of r under mode, fill setting the
// measured values around v (jitter).
func repeats(r results.Run, mode string, v float64, fill func(r *results.Run, v float64)) []results.Run {
	var out []results.Run
	for rep, j := range jitter {
		r := r
		r.Mode, r.Repeat = mode, rep
		fill(&r, v*j)
		r.CPU = cpu(mode, rep)
		out = append(out, r)
	}
	return out
}

// PrioBackgrounds are the loads of PrioFile's prio_latency.
var PrioBackgrounds = []float64{0, 0.1, 0.3, 0.5, 0.65, 0.8, 0.95}

// PrioFile returns a synthetic run of the priority workloads: modes
// native, vanilla and prism-batch; prio_latency at every load of
// PrioBackgrounds with latency CDFs, prio_memcached at 0 and 65%. Latency
// grows with the load, less under prism-batch; the background receiver
// gets 99% of what was offered (100 Kpps = 100%).
func PrioFile() *results.File {
	f := File()
	f.Runs = nil
	f.Modes = []string{"native", "vanilla", "prism-batch"}
	f.Notes = nil
	slow := map[string]float64{"native": 0.5, "vanilla": 1, "prism-batch": 0.4}
	base := map[string]float64{"native": 25, "vanilla": 40, "prism-batch": 41}
	bg := func(r *results.Run) {
		if r.Background > 0 {
			r.Extra = map[string]float64{"bg_target_kpps": 100 * r.Background, "bg_offered_kpps": 100 * r.Background, "bg_received_kpps": 99 * r.Background, "bg_late_share": 0.02}
		}
	}
	for _, mode := range f.Modes {
		for _, load := range PrioBackgrounds {
			lat := base[mode] * (1 + 4*slow[mode]*load)
			r := results.Run{Workload: "prio_latency", Proto: "udp", MsgSize: 64, Flows: 1, Background: load}
			f.Runs = append(f.Runs, repeats(r, mode, lat, func(r *results.Run, v float64) {
				r.LatMinUs, r.LatP50Us, r.LatAvgUs, r.LatP99Us, r.LatP999Us = v*0.6, v, v*1.1, v*3, v*5
				r.PPS = 1000
				r.LatCDF = cdf(v)
				bg(r)
			})...)
		}
		for _, load := range []float64{0, 0.65} {
			lat := 3 * base[mode] * (1 + 4*slow[mode]*load)
			r := results.Run{Workload: "prio_memcached", Proto: "tcp", MsgSize: 550, Flows: 8, Background: load}
			f.Runs = append(f.Runs, repeats(r, mode, lat, func(r *results.Run, v float64) {
				r.LatMinUs, r.LatP50Us, r.LatAvgUs, r.LatP99Us = v*0.5, v, v*1.2, v*4
				r.PPS = 8e6 / v
				bg(r)
			})...)
		}
	}
	return f
}

// BatchBatches are BatchFile's batch sizes.
var BatchBatches = []int{16, 64, 256, 1024}

// BatchFile returns a synthetic MFLOW batch-size comparison: modes vanilla
// and mflow:batch=N for N in BatchBatches, on udp_stress (64 B) and
// tcp_stream (64 KiB). Reordering falls as the batch grows: udp_reorder
// 10000/N, ofo 20000/N and dsack 1000/N (times the repeat's jitter);
// vanilla reorders nothing.
func BatchFile() *results.File {
	f := File()
	f.Runs = nil
	f.Notes = nil
	f.Modes = []string{"vanilla"}
	for _, n := range BatchBatches {
		f.Modes = append(f.Modes, fmt.Sprintf("mflow:batch=%d", n))
	}
	for i, mode := range f.Modes {
		n := 0.0 // vanilla: no micro-flows, nothing reordered
		if i > 0 {
			n = float64(BatchBatches[i-1])
		}
		order := func(per float64) uint64 {
			if n == 0 {
				return 0
			}
			return uint64(per / n)
		}
		f.Runs = append(f.Runs, repeats(results.Run{Workload: "udp_stress", Proto: "udp", MsgSize: 64, Flows: 1}, mode, 1, func(r *results.Run, j float64) {
			r.PPS, r.SentPPS = 400e3*j, 1e6
			r.UDPReorder = order(10000 * j)
		})...)
		f.Runs = append(f.Runs, repeats(results.Run{Workload: "tcp_stream", Proto: "tcp", MsgSize: 65536, Flows: 1}, mode, 1, func(r *results.Run, j float64) {
			r.ThroughputGbps = 8 * j
			r.OFO, r.DSACK = order(20000*j), order(1000*j)
		})...)
	}
	return f
}

// cpu is a two-CPU split shaped like the mode: vanilla piles receive work
// on the IRQ core, rps moves part of it to the other core.
func cpu(mode string, rep int) []results.CPUUse {
	j := jitter[rep]
	switch mode {
	case "native":
		return []results.CPUUse{
			{CPU: 0, SoftIRQ: 35 * j, System: 20, User: 10, Idle: 35 - 35*(j-1), NetRX: 90000},
			{CPU: 1, SoftIRQ: 5, System: 25, User: 30, Idle: 40, NetRX: 1000},
		}
	case "vanilla":
		return []results.CPUUse{
			{CPU: 0, SoftIRQ: 80 * j, System: 12, User: 2, Idle: 6 - 80*(j-1), NetRX: 120000},
			{CPU: 1, SoftIRQ: 3, System: 15, User: 20, Idle: 62, NetRX: 800},
		}
	default:
		return []results.CPUUse{
			{CPU: 0, SoftIRQ: 55 * j, System: 15, User: 5, Idle: 25 - 55*(j-1), NetRX: 100000, Kthreads: 4},
			{CPU: 1, SoftIRQ: 35, System: 18, User: 22, Idle: 25, NetRX: 60000, Kthreads: 2},
		}
	}
}

// cdf is a latency distribution with its median at p50 and a long tail.
func cdf(p50 float64) []results.CDFPoint {
	var out []results.CDFPoint
	for i := 1; i <= 40; i++ {
		p := float64(i) / 40
		if p == 1 {
			p = 0.9999
		}
		// Log-logistic quantile: symmetric in log space around p50, with a
		// tail that reaches ~5x the median by p99.99.
		out = append(out, results.CDFPoint{Us: p50 * math.Pow(p/(1-p), 0.18), Fraction: p})
	}
	return out
}
