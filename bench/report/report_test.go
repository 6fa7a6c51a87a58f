package report

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/bench/results/resultstest"
)

func TestMarkdown(t *testing.T) {
	f := resultstest.File()
	f.Runs[len(f.Runs)-1].Error = "iperf3: a | b" // a pipe must not split the list item's table-free text
	has(t, Markdown(f, Options{Plots: []string{"plots/throughput_tcp_stream.png"}}),
		"# lanes bench report",
		"| host | bench1 |",
		"| kernel | 6.18.0 |",
		"| CPU | 2 × Synthetic CPU @ 3.0GHz |",
		"| date | 2025-03-14 09:26 UTC (42m0s) |",
		"- rps: rps_cpus=3 on the receiving container's eth0", // notes
		"## tcp_stream",
		"| point | mode | throughput Gbit/s | vs vanilla | vs native | n |",
		// native 20, vanilla 20*0.45 = 9, rps 20*0.62 = 12.4 Gbit/s; jitter 0.96/1/1.05.
		"| 1400 B | native | 20.00 [19.20–21.00] | 2.22 | 1.00 | 3 |",
		"|  | vanilla | 9.00 [8.64–9.45] | 1.00 | 0.45 | 3 |",
		"|  | rps | 12.40 [11.90–13.02] | 1.38 | 0.62 | 3 |",
		"|  | rps | 1.24 [1.19–1.30] | 1.38 | 0.62 | 3 (1 failed) |",
		"| 128 KiB, 8 flows | native |",
		"| p50 µs | vs vanilla | vs native | p99 µs |",
		"|  | vanilla | 31.0 [29.8–32.6] | 1.00 | 1.72 | 77.5 [74.4–81.4] | 1.00 | 1.72 | 3 |",
		"| 64 B | native | 1.20M [1.15M–1.26M] | 2.22 | 1.00 | 3 |", // udp_stress pps
		// memcached has no native runs: no ratio, a dash.
		"| 100 B, 16 flows | vanilla | 93.0 [89.3–97.7] | 1.00 | – | 372.0 [357.1–390.6] | 1.00 | – | 3 |",
		// CPU split and counters.
		"| point | mode | cpu0 si/sys/usr/kt | cpu1 si/sys/usr/kt | busy % of 200 | busy σ | retrans | ofo | dsack | udp_reorder | drops_softnet | drops_socket | drops_nic |",
		"|  | vanilla | 80/12/2/0 | 3/15/20/0 | 132 | 28.0 | 9 | 90 | 0 | 0 | 0 | 0 | 0 |",
		"|  | rps | 55/15/5/4 | 35/18/22/2 | 150 | 1.1 | 0 | 0 | 0 | 3 | 756.0k | 0 | 0 |",
		"## Failed runs",
		"- rps tcp_stream tcp, 64 B, repeat 3: iperf3: a \\| b",
		"![throughput_tcp_stream](plots/throughput_tcp_stream.png)",
	)
}

func TestTable(t *testing.T) {
	txt := Table(resultstest.File())
	for _, re := range []string{
		`(?m)^tcp_stream$`,
		`(?m)^point\s+mode\s+throughput Gbit/s\s+vs vanilla\s+vs native\s+n$`,
		`(?m)^1400 B\s+native\s+20\.00 \[19\.20–21\.00\]\s+2\.22\s+1\.00\s+3$`,
		`(?m)^\s+rps\s+12\.40 \[11\.90–13\.02\]\s+1\.38\s+0\.62\s+3$`,
		`(?m)^\s+rps\s+1\.24 \[1\.19–1\.30\]\s+1\.38\s+0\.62\s+3 \(1 failed\)$`,
		`(?m)^100 B, 16 flows\s+vanilla\s+93\.0 \[89\.3–97\.7\]\s+1\.00\s+–\s+372\.0`,
	} {
		if !regexp.MustCompile(re).MatchString(txt) {
			t.Errorf("table does not match %s", re)
		}
	}
	// Fixed width: the medians of a block end in the same column.
	lines := strings.Split(txt, "\n")
	col := -1
	for _, l := range lines[2:11] {
		i := strings.Index(l, " [")
		if col < 0 {
			col = i
		}
		if i != col {
			t.Errorf("medians not aligned:\n%s", strings.Join(lines[:11], "\n"))
			break
		}
	}
	if t.Failed() {
		t.Log("\n" + txt)
	}
}

func TestEmptyAndPartial(t *testing.T) {
	f := &results.File{}
	if md := Markdown(f, Options{}); !strings.Contains(md, "# lanes bench report") {
		t.Errorf("empty report: %q", md)
	}
	if s := Table(f); s != "" {
		t.Errorf("empty table: %q", s)
	}
	// Only failures, an unknown workload, no baselines: no crash, no ratio.
	f.Runs = []results.Run{
		{Mode: "falcon", Workload: "prio_latency", Background: 0.5, LatP50Us: 12, LatP99Us: 40},
		{Mode: "falcon", Workload: "prio_latency", Background: 0.5, Error: "boom"},
		{Mode: "mflow", Workload: "mystery", Flows: 1, PPS: 1000},
		{Mode: "mflow", Workload: "only_failed", Error: "nope"},
	}
	md := Markdown(f, Options{})
	for _, want := range []string{
		"| bg 50% | falcon | 12.0 | – | – | 40.0 | – | – | 0 | – | – | 1 (1 failed) |",
		"| – | mflow | 1000 | – | – | 1 |",
		"| – | mflow | failed | – | – | 0 (1 failed) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q\n%s", want, md)
		}
	}
	_ = Table(f)
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	plot := filepath.Join(dir, "plots", "cdf_pingpong.png")
	if err := Write(filepath.Join(dir, "report.md"), resultstest.File(), Options{Plots: []string{plot}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "](plots/cdf_pingpong.png)") {
		t.Error("plot link not relative to the report")
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int]string{64: "64 B", 1400: "1400 B", 65536: "64 KiB", 1 << 20: "1 MiB", 1500: "1500 B"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// Every load of a priority workload is in its tables, with the service's
// request rate where it has one and the background's rates per load.
func TestPrioReport(t *testing.T) {
	md := Markdown(resultstest.PrioFile(), Options{})
	has(t, md,
		"## prio_latency",
		"| point | mode | p50 µs | vs vanilla | vs native | p99 µs | vs vanilla | vs native | background received Kpps | vs vanilla | vs native | n |",
		// vanilla at 65%: 40 * (1 + 4*0.65) = 144 µs p50, p99 3x.
		"| 64 B, bg 65% | native |",
		"|  | vanilla | 144.0 [138.2–151.2] | 1.00 | 2.50 | 432.0 [414.7–453.6] | 1.00 | 2.50 | 64.4 | 1.00 | 1.00 | 3 |",
		// The detail table: min, avg, p50, p99, p99.9, background.
		"| point | mode | min µs | avg µs | p50 µs | p99 µs | p99.9 µs | lost % | background offered Kpps | background offered % of asked | background sent late % | background received Kpps | background received % of offered |",
		"|  | vanilla | 86.4 | 158.4 | 144.0 | 432.0 | 720.0 | 0 | 65 | 100 | 2 | 64.4 | 99.0 |",
		"| 64 B, bg 0% | native | 15.0 | 27.5 | 25.0 | 75.0 | 125.0 | 0 | – | – | – | – | – |",
		"## prio_memcached",
		"| point | mode | rate req/s | vs vanilla | vs native | p50 µs |",
	)
	for _, bg := range resultstest.PrioBackgrounds {
		if want := fmt.Sprintf("| 64 B, bg %.0f%% | native |", 100*bg); strings.Count(md, want) != 3 {
			t.Errorf("load %.0f%% not in the primary, detail and CPU tables (%d)", 100*bg, strings.Count(md, want))
		}
	}
	if strings.Contains(md, "Out of order vs batch size") {
		t.Error("batch section without batch variants")
	}
}

// The udp_stress work table: CPU per datagram, its IRQ core part and the
// two capacities they allow (1e6/ns Kpps per saturated core).
func TestWorkReport(t *testing.T) {
	md := Markdown(resultstest.File(), Options{})
	has(t, md,
		"Work per datagram: CPU time of the receive path and the sink per delivered datagram",
		"| point | mode | received Kpps | CPU per datagram ns | vs vanilla | IRQ core's part ns | receive work cores | bound: IRQ core saturated Kpps | bound: 2 cores saturated Kpps |",
		"| 64 B | native | 1200 | 1500 | 0.75 | 1500 | 1.80 | 667 | 1333 |",
		"|  | rps | 744 | 2400 | 1.20 | 1000 | 1.79 | 1000 | 833 |",
	)
	if n := strings.Count(md, "Work per datagram"); n != 1 {
		t.Errorf("work table under %d workloads, want udp_stress only", n)
	}
}

func TestBatchReport(t *testing.T) {
	has(t, Markdown(resultstest.BatchFile(), Options{}),
		"## Out of order vs batch size",
		"### udp_stress",
		"| point | mode | batch | udp_reorder | rate msg/s |",
		// 10000/16 = 625 reordered at batch 16; jitter 0.96/1/1.05.
		"| 64 B | mflow | 16 | 625 [600–656] | 400.0k [384.0k–420.0k] |",
		"|  | mflow | 1024 | 9 [9–10] |",
		"|  | vanilla | – | 0 |",
		"### tcp_stream",
		"| point | mode | batch | ofo | dsack | throughput Gbit/s |",
		"| 64 KiB | mflow | 16 | 1250 [1200–1312] | 62 [60–65] | 8.00 [7.68–8.40] |",
	)
}

// has checks that md contains every string of want, and shows md if not.
func has(t *testing.T, md string, want ...string) {
	t.Helper()
	ok := true
	for _, w := range want {
		if !strings.Contains(md, w) {
			t.Errorf("report lacks %q", w)
			ok = false
		}
	}
	if !ok {
		t.Log(md)
	}
}

// A run with the NIC-like reference (vanilla:xdp-pass=true) compares every
// mode with it too, in a column of its own.
func TestNICLikeColumn(t *testing.T) {
	f := resultstest.File()
	f.Modes = append(f.Modes, NICLike)
	for i := range 3 {
		f.Runs = append(f.Runs, results.Run{Mode: NICLike, Workload: "tcp_stream", Proto: "tcp", MsgSize: 1400, Flows: 1, Repeat: i, ThroughputGbps: 8})
	}
	has(t, Markdown(f, Options{}),
		"| point | mode | throughput Gbit/s | vs vanilla | vs native | vs xdp-pass | n |",
		// vanilla 9, rps 12.4, native 20 Gbit/s against 8.
		"|  | vanilla | 9.00 [8.64–9.45] | 1.00 | 0.45 | 1.12 | 3 |",
		"|  | rps | 12.40 [11.90–13.02] | 1.38 | 0.62 | 1.55 | 3 |",
		"|  | vanilla:xdp-pass=true | 8.00 | 0.89 | 0.40 | 1.00 | 3 |",
	)
	if strings.Contains(Markdown(resultstest.File(), Options{}), "vs xdp-pass") {
		t.Error("a run without the NIC-like reference has its column")
	}
	// Spelled another way, with another bench setting.
	for i := range f.Runs {
		if f.Runs[i].Mode == NICLike {
			f.Runs[i].Mode = "vanilla:cpus=0-1:xdp-pass=1"
		}
	}
	f.Modes[len(f.Modes)-1] = "vanilla:cpus=0-1:xdp-pass=1"
	has(t, Markdown(f, Options{}), "|  | vanilla:cpus=0-1:xdp-pass=1 | 8.00 | 0.89 | 0.40 | 1.00 | 3 |")
}

// The report says whether vanilla waits behind bulk at each load, against
// its idle latency at the same baseline: awake with awake, as-is with
// as-is.
func TestQueueingTable(t *testing.T) {
	run := func(bg float64, awake bool, p50, p99 float64) results.Run {
		return results.Run{Mode: "vanilla", Workload: "prio_latency", Proto: "udp", MsgSize: 64, Flows: 1, Background: bg, Awake: awake, LatP50Us: p50, LatP99Us: p99}
	}
	f := &results.File{Runs: []results.Run{
		run(0, true, 40, 50), run(0.65, true, 80, 200),
		run(0, false, 60, 150), run(0.65, false, 55, 120),
	}}
	md := Markdown(f, Options{})
	for _, want := range []string{
		"| 64 B, bg 65%, awake | 2.00 | 4.00 | yes |",
		"| 64 B, bg 65%, as-is | 0.92 | 0.80 | no: nothing for PRISM to remove |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q\n%s", want, md)
		}
	}
}

// The no-harm table: a mode's p50, p99 and p99.9 against vanilla's with
// their same-repeat intervals, worse or better only where the interval
// clears 1, undecided under five pairs.
func TestHarmTable(t *testing.T) {
	var runs []results.Run
	add := func(mode string, bg float64, rep int, p50, p99, p999 float64) {
		runs = append(runs, results.Run{Mode: mode, Workload: "prio_latency", Proto: "udp", MsgSize: 64, Flows: 1, Background: bg, Awake: true, Repeat: rep,
			LatP50Us: p50, LatP99Us: p99, LatP999Us: p999})
	}
	for rep := range 5 {
		j := 1 + 0.1*float64(rep)
		add("vanilla", 0.65, rep, 40*j, 200*j, 800*j)
		// p50 always 1.2x, p99 always half, p99.9 either side of 1.
		add("prism-sync", 0.65, rep, 48*j, 100*j, []float64{600, 1000, 700, 1100, 900}[rep]*j)
		add("vanilla", 0.3, rep, 40*j, 100*j, 500*j)
		add("prism-sync", 0.3, rep, 40*j*[]float64{0.9, 1.1, 1, 0.95, 1.05}[rep], 100*j, 500*j)
	}
	for rep := range 3 {
		add("vanilla", 0, rep, 30, 60, 300)
		add("prism-sync", 0, rep, 45, 60, 300)
	}
	has(t, Markdown(&results.File{Runs: runs}, Options{}),
		"| point | mode | p50 vs vanilla | p99 vs vanilla | p99.9 vs vanilla | verdict |",
		"| 64 B, bg 0%, awake | prism-sync | 1.50 | 1.00 | 1.00 | undecided (fewer than 5 repeats) |",
		"| 64 B, bg 30%, awake | prism-sync | 1.01 (0.90–1.10) | 1.00 (1.00–1.00) | 1.00 (1.00–1.00) | within noise |",
		"| 64 B, bg 65%, awake | prism-sync | 1.20 (1.20–1.20) | 0.50 (0.50–0.50) | 1.15 (0.75–1.38) | worse: p50; better: p99 |",
	)
}

// With the NIC-like mode in the run the no-harm table gives a second
// verdict, against it: a mode worse than vanilla only by what the hook
// itself costs is within noise there; the hook's own row has none.
func TestHarmTableAgainstHook(t *testing.T) {
	var runs []results.Run
	add := func(mode string, rep int, p50, p99, p999 float64) {
		runs = append(runs, results.Run{Mode: mode, Workload: "prio_latency", Proto: "udp", MsgSize: 64, Flows: 1, Background: 0.3, Awake: true, Repeat: rep,
			LatP50Us: p50, LatP99Us: p99, LatP999Us: p999})
	}
	for rep := range 5 {
		j := 1 + 0.1*float64(rep)
		add("vanilla", rep, 40*j, 100*j, 500*j)
		add(NICLike, rep, 44*j, 120*j, 500*j)
		add("prism-batch", rep, 44*j, 120*j*[]float64{0.9, 1.1, 1, 0.95, 1.05}[rep], 500*j)
	}
	has(t, Markdown(&results.File{Runs: runs}, Options{}),
		"| point | mode | p50 vs vanilla | p99 vs vanilla | p99.9 vs vanilla | verdict | verdict vs xdp-pass |",
		"| 64 B, bg 30%, awake | vanilla:xdp-pass=true | 1.10 (1.10–1.10) | 1.20 (1.20–1.20) | 1.00 (1.00–1.00) | worse: p50, p99 | – |",
		"|  | prism-batch | 1.10 (1.10–1.10) | 1.21 (1.08–1.32) | 1.00 (1.00–1.00) | worse: p50, p99 | within noise |",
	)
}

// The BPF cost table: lanes' programs' runs and time per datagram, their
// share of the CPU per datagram, the programs that took most; a mode
// without programs at zero, not missing; no table without the statistics.
func TestBPFCostReport(t *testing.T) {
	if strings.Contains(Markdown(resultstest.File(), Options{}), "BPF programs per delivered datagram") {
		t.Fatal("a BPF cost table in a run without the statistics")
	}
	f := resultstest.File()
	for i := range f.Runs {
		r := &f.Runs[i]
		if r.Workload != "udp_stress" || r.Extra == nil {
			continue
		}
		r.Extra[results.BPFNsPerMsg], r.Extra[results.BPFRunsPerMsg] = 0, 0
		if r.Mode == "rps" {
			r.Extra[results.BPFNsPerMsg], r.Extra[results.BPFRunsPerMsg] = 600, 3
			r.Extra[results.BPFNsPerMsg+":steer_xdp"] = 100
			r.Extra[results.BPFNsPerMsg+":steer_tc_place"] = 300
			r.Extra[results.BPFNsPerMsg+":steer_tc_seen"] = 150
			r.Extra[results.BPFNsPerMsg+":kfree_skb"] = 50
		}
	}
	md := Markdown(f, Options{})
	has(t, md,
		"Lanes' BPF programs per delivered datagram",
		"| point | mode | program runs | ns | share of CPU per datagram | most of it (ns) |",
		"|  | vanilla | 0.00 | 0 | 0% |  |",
		// rps: CPU per datagram 2400 ns (TestWorkReport).
		"|  | rps | 3.00 | 600 | 25% | steer_tc_place 300, steer_tc_seen 150, steer_xdp 100 |",
	)
}

// TestRatioInterval: from five repeats on, a ratio carries the interval
// of its same-repeat ratios' median (at 5 and 6 repeats their min-max),
// paired by repeat, not by rank: falcon's 10 against vanilla's 8 (1.25)
// is one pair even though 10 is falcon's smallest.
func TestRatioInterval(t *testing.T) {
	f := &results.File{Repeats: 6, Modes: []string{"vanilla", "falcon"}, Duration: 4}
	van := []float64{8, 10, 10, 10, 10, 12}
	fal := []float64{10, 11, 10, 9.5, 10.5, 12}
	for rep := range van {
		for _, r := range []struct {
			mode string
			v    float64
		}{{"vanilla", van[rep]}, {"falcon", fal[rep]}} {
			f.Runs = append(f.Runs, results.Run{Mode: r.mode, Repeat: rep, Workload: "tcp_stream", Proto: "tcp", MsgSize: 4096, Flows: 1, ThroughputGbps: r.v})
		}
	}
	// Ratios by repeat 1.25, 1.10, 1.00, 0.95, 1.05, 1.00: (0.95–1.25);
	// medians 10.25 / 10 = 1.02 (rounded 1.02 or 1.03 by the float).
	has(t, Markdown(f, Options{}), "| 4 KiB | vanilla | 10.00 [8.00–12.00] | 1.00 | – | 6 |",
		"|  | falcon | 10.25 [9.50–12.00] | 1.02 (0.95–1.25) | – | 6 |")
	f.Runs = f.Runs[:8] // four repeats: no interval
	has(t, Markdown(f, Options{}), "|  | falcon | 10.00 [9.50–11.00] | 1.00 | – | 4 |")
}
