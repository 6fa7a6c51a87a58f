// Package resultstest makes a synthetic results.File: several modes,
// workloads, points and repeats with plausible numbers, for the tests of
// the report and the plots and for trying them without a testbed.
package resultstest

import (
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
		for rep, j := range jitter {
			r := r
			r.Mode, r.Repeat = mode, rep
			fill(&r, v*j)
			r.CPU = cpu(mode, rep)
			f.Runs = append(f.Runs, r)
		}
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
