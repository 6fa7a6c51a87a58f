// Package report turns a results.File into report.md and into a compact
// fixed-width comparison for the terminal. Both show, per workload and
// point, each mode's median with its min–max over repeats and its ratio to
// the vanilla and native medians at the same point.
package report

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanesnet/lanes/bench/results"
)

// Baselines are the modes every other mode is compared with.
var Baselines = []string{"vanilla", "native"}

// NICLike is vanilla with a pass-through XDP program on the receiving
// underlay (bench/xdppass.go): the testbed's veth then copies frames for
// XDP as it does under every mode with XDP, as a NIC's DMA fills fresh
// buffers for all alike. A run that has it (as spelled here, or any
// vanilla:...xdp-pass=true...) is also compared with it.
const NICLike = "vanilla:xdp-pass=true"

// nicLike is the run's NIC-like reference mode, "" if it has none.
func nicLike(a *results.Agg) string {
	for _, m := range a.Modes() {
		base, params, err := results.ParseModeSpec(m)
		if on, _ := strconv.ParseBool(params["xdp-pass"]); err == nil && base == "vanilla" && on {
			return m
		}
	}
	return ""
}

// baselines are the modes a's runs are compared with.
func baselines(a *results.Agg) []string {
	b := slices.Clone(Baselines)
	if m := nicLike(a); m != "" {
		b = append(b, m)
	}
	return b
}

// baseLabel is a baseline's column name.
func baseLabel(a *results.Agg, base string) string {
	if base != "" && base == nicLike(a) {
		return "vs xdp-pass"
	}
	return "vs " + base
}

// Options tunes the markdown report.
type Options struct {
	// Plots are image files (as returned by plot.All) to show at the end
	// of the report. Write makes them relative to the report's directory.
	Plots []string
}

// Write writes the markdown report to path.
func Write(path string, f *results.File, opt Options) error {
	dir := filepath.Dir(path)
	rel := make([]string, len(opt.Plots))
	for i, p := range opt.Plots {
		rel[i] = p
		if r, err := filepath.Rel(dir, p); err == nil {
			rel[i] = r
		}
	}
	opt.Plots = rel
	return os.WriteFile(path, []byte(Markdown(f, opt)), 0o644)
}

// Primary returns the metrics a workload is judged by: throughput for
// streams, delivered messages/s for udp_stress, p50 and p99 latency for
// request/response workloads. A workload not known here is judged by what
// its runs measured: latency if any, else throughput, else rate.
func Primary(a *results.Agg, workload string) []results.Metric {
	switch workload {
	case "tcp_stream", "udp_stream", "tcp_multi":
		return []results.Metric{results.Throughput}
	case "udp_stress":
		return []results.Metric{results.PPS}
	case "prio_latency", "prio_latency_sockperf":
		return []results.Metric{results.LatP50, results.LatP99, results.BackgroundKpps}
	case "prio_mixed", "prio_sporadic_mixed":
		return []results.Metric{results.LatP50, results.LatP99, results.AlsoRate, results.AlsoP99, results.BackgroundKpps}
	case "prio_memcached", "prio_nginx":
		return []results.Metric{results.RequestRate, results.LatP50, results.LatP99, results.BackgroundKpps}
	case "pingpong", "memcached", "nginx":
		return []results.Metric{results.LatP50, results.LatP99}
	}
	var lat, tput bool
	for _, g := range a.Groups {
		if g.Workload != workload {
			continue
		}
		for i := range g.Runs {
			lat = lat || g.Runs[i].LatP50Us > 0
			tput = tput || g.Runs[i].ThroughputGbps > 0
		}
	}
	switch {
	case lat:
		return []results.Metric{results.LatP50, results.LatP99}
	case tput:
		return []results.Metric{results.Throughput}
	}
	return []results.Metric{results.PPS}
}

// counters are the second table's columns after the CPU split.
var counters = []results.Metric{
	results.Retrans, results.OFO, results.DSACK, results.UDPReorder,
	results.DropsSoftnet, results.DropsSocket, results.DropsNIC,
}

// Markdown returns report.md's contents.
func Markdown(f *results.File, opt Options) string {
	a := f.Aggregate()
	var b strings.Builder
	m := f.Machine
	fmt.Fprintf(&b, "# lanes bench report\n\n")
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, "| %s | %s |\n", k, mdEscape(v))
		}
	}
	row("date", dateRange(f.Started, f.Ended))
	row("host", m.Hostname)
	row("kernel", m.Kernel)
	cpu := m.CPUModel
	if m.CPUs > 0 {
		cpu = fmt.Sprintf("%d × %s", m.CPUs, m.CPUModel)
	}
	row("CPU", cpu)
	if m.MemGiB > 0 {
		row("memory", fmt.Sprintf("%d GiB", m.MemGiB))
	}
	if m.Overlay != "" {
		row("topology", m.Topology+", built by "+m.Overlay)
	} else {
		row("topology", m.Topology)
	}
	irq := fmt.Sprintf("cpu%d", m.IRQCPU)
	if m.SenderPollCPU != nil {
		irq += fmt.Sprintf(" (the sending host's NIC polled on cpu%d)", *m.SenderPollCPU)
	}
	row("underlay IRQ core", irq)
	nic := m.NIC
	if nic == "" {
		nic = "threaded"
	}
	row("underlay NIC polled by", nic+" NAPI")
	row("lanes / Go", strings.Trim(m.LanesVer+" / "+m.GoVer, " /"))
	row("modes", strings.Join(f.Modes, ", "))
	runs := fmt.Sprintf("%d repeats of %gs each", f.Repeats, f.Duration)
	if f.Quick {
		runs += " (quick)"
	}
	row("runs", runs)
	if len(f.Args) > 0 {
		row("command", "`"+strings.Join(f.Args, " ")+"`")
	}
	b.WriteString("\nEach cell is the median over repeats with [min–max]. Ratios divide a mode's median by the " +
		"vanilla or native median at the same point: above 1 is better for throughput and rates, worse for latency. " +
		"In (parentheses) after a ratio: where the median of the same-repeat ratios lies, at 95% confidence " +
		"(distribution-free; at 5 repeats their min–max, 94%); a target is decided only where this interval clears it.\n")

	if len(f.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range f.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}

	for _, wl := range a.Workloads() {
		fmt.Fprintf(&b, "\n## %s\n\n", wl)
		primaryTable(a, wl).markdown(&b)
		if hasBackground(a, wl) {
			b.WriteString("\nLatency of the high-priority service and the low-priority background at every load " +
				"(medians over repeats; background load in % of the receive core's capacity; " +
				"offered % of asked below 100 means the generator could not keep the pace and the load was lighter than its label; " +
				"received % of offered below 100 means the background lost packets; " +
				"guard demotions: how often `lanes agent`'s starvation guard gave prism's bulk queue normal scheduling during a run, – where no guard ran):\n\n")
			backgroundTable(a, wl).markdown(&b)
			if t, ok := queueingTable(a, wl); ok {
				b.WriteString("\nVanilla's queueing: its latency at each load over its latency idle with the same baseline " +
					"(awake: the cores held out of idle states; as-is: they may sleep). PRISM can only remove the waiting behind bulk " +
					"that vanilla shows here: where vanilla's loaded latency is not above its idle latency, it has nothing to remove.\n\n")
				t.markdown(&b)
			}
			if t, ok := harmTable(a, wl); ok {
				b.WriteString("\nAgainst vanilla at every load: each mode's latency statistics over vanilla's, with the same-repeat interval; " +
					"worse or better where that interval lies wholly above or below 1, within noise where every interval reaches 1")
				if nicLike(a) != "" {
					b.WriteString("; the last verdict is the same against vanilla with an XDP program that only passes frames (xdp-pass): " +
						"what the mode costs beyond the hook itself, which makes the testbed's veth underlay copy every frame as a NIC does not")
				}
				b.WriteString(":\n\n")
				t.markdown(&b)
			}
		}
		if hasWork(a, wl) {
			fmt.Fprintf(&b, "\nWork per datagram: CPU time of the receive path and the sink per delivered datagram, "+
				"the generator's excluded (scheduler-event accounting, as the balancer's; work on frames dropped on the way and lanes' own agent included), and the IRQ core's part of it; "+
				"the cores' worth of receive work; the rate at which that work would saturate the IRQ core, "+
				"and all %d cores (medians over repeats; a rate under both: the generator, sharing the cores, did not keep up):\n\n", m.CPUs)
			workTable(a, wl, m.CPUs).markdown(&b)
		}
		if hasBPFCost(a, wl) {
			b.WriteString("\nLanes' BPF programs per delivered datagram (the kernel's run-time statistics, --bpf-stats: " +
				"every copy of a program summed; medians over repeats): their runs, their time, its share of the CPU per datagram above, " +
				"and the programs that took most of it:\n\n")
			bpfCostTable(a, wl).markdown(&b)
		}
		b.WriteString("\nCPU split per core (median %: softirq / system / user / NAPI+cpumap kthreads; " +
			"kthread time is part of system; busy σ: standard deviation of the per-core busy %, 0 = evenly spread) and counters (median over the run):\n\n")
		costTable(a, wl).markdown(&b)
	}

	batchSection(&b, a)

	var failed []results.Run
	for _, g := range a.Groups {
		failed = append(failed, g.Failed...)
	}
	if len(failed) > 0 {
		b.WriteString("\n## Failed runs\n\n")
		for _, r := range failed {
			fmt.Fprintf(&b, "- %s %s %s, repeat %d: %s\n", r.Mode, r.Workload,
				orDash(pointLabel(r.Point(), nil)), r.Repeat, mdEscape(r.Error))
		}
	}

	if len(opt.Plots) > 0 {
		b.WriteString("\n## Plots\n\n")
		for _, p := range opt.Plots {
			name := strings.TrimSuffix(filepath.Base(p), filepath.Ext(p))
			fmt.Fprintf(&b, "![%s](%s)\n\n", name, filepath.ToSlash(p))
		}
	}
	return b.String()
}

// Table returns the primary-metric comparison as fixed-width plain text
// for the terminal: one block per workload.
func Table(f *results.File) string {
	a := f.Aggregate()
	var b strings.Builder
	for i, wl := range a.Workloads() {
		if i > 0 {
			b.WriteByte('\n')
		}
		t := primaryTable(a, wl)
		fmt.Fprintf(&b, "%s\n", wl)
		t.text(&b)
	}
	return b.String()
}

// table is rendered both as markdown and as fixed-width text.
type table struct {
	header []string
	right  []bool // right-align the column (numbers)
	rows   [][]cell
}

// cell is a value with an optional range ("[1.2–1.4]") that markdown
// appends to it and the text renderer aligns in a column of its own, so
// medians line up in the terminal.
type cell struct{ v, rng string }

func (c cell) String() string {
	if c.rng == "" {
		return c.v
	}
	return c.v + " " + c.rng
}

func cells(ss ...string) []cell {
	out := make([]cell, len(ss))
	for i, s := range ss {
		out[i] = cell{v: s}
	}
	return out
}

func primaryTable(a *results.Agg, wl string) table {
	ms := Primary(a, wl)
	bases := baselines(a)
	t := table{header: []string{"point", "mode"}, right: []bool{false, false}}
	for _, m := range ms {
		t.header = append(t.header, metricHeader(m))
		t.right = append(t.right, true)
		for _, base := range bases {
			t.header = append(t.header, baseLabel(a, base))
			t.right = append(t.right, true)
		}
	}
	t.header = append(t.header, "n")
	t.right = append(t.right, true)

	eachRow(a, wl, func(label string, g *results.Group) {
		k := g.Key
		row := cells(label, g.Mode)
		for _, m := range ms {
			row = append(row, statCell(g.Stat(m), m))
			for _, base := range bases {
				c, _, _, _ := ratioCell(a, k, m, base)
				row = append(row, c)
			}
		}
		n := cell{v: fmt.Sprint(len(g.Runs))}
		if len(g.Failed) > 0 {
			n.rng = fmt.Sprintf("(%d failed)", len(g.Failed))
		}
		t.rows = append(t.rows, append(row, n))
	})
	return t
}

// eachRow calls row for every mode's group at every point of a workload,
// in report order, with the point's label on the first mode's row only.
func eachRow(a *results.Agg, wl string, row func(label string, g *results.Group)) {
	pts := a.Points(wl)
	for _, p := range pts {
		for i, mode := range a.ModesAt(p) {
			label := ""
			if i == 0 {
				label = orDash(pointLabel(p, pts))
			}
			row(label, a.Group(results.Key{Mode: mode, Point: p}))
		}
	}
}

func costTable(a *results.Agg, wl string) table {
	pts := a.Points(wl)
	var cpus []int
	for _, p := range pts {
		for _, mode := range a.ModesAt(p) {
			for _, c := range a.Group(results.Key{Mode: mode, Point: p}).CPU() {
				if !slices.Contains(cpus, c.CPU) {
					cpus = append(cpus, c.CPU)
				}
			}
		}
	}
	slices.Sort(cpus)
	t := table{header: []string{"point", "mode"}, right: []bool{false, false}}
	for _, c := range cpus {
		t.header = append(t.header, fmt.Sprintf("cpu%d si/sys/usr/kt", c))
		t.right = append(t.right, true)
	}
	t.header = append(t.header, fmt.Sprintf("busy %% of %d", 100*len(cpus)), "busy σ")
	t.right = append(t.right, true, true)
	for _, m := range counters {
		t.header = append(t.header, m.Name)
		t.right = append(t.right, true)
	}
	eachRow(a, wl, func(label string, g *results.Group) {
		row := []string{label, g.Mode}
		byCPU := map[int]results.CPUUse{}
		for _, c := range g.CPU() {
			byCPU[c.CPU] = c
		}
		for _, c := range cpus {
			u, ok := byCPU[c]
			if !ok || len(g.Runs) == 0 {
				row = append(row, "–")
				continue
			}
			row = append(row, fmt.Sprintf("%.0f/%.0f/%.0f/%.0f", u.SoftIRQ, u.System, u.User, u.Kthreads))
		}
		if len(g.Runs) == 0 {
			row = append(row, "–", "–")
		} else {
			row = append(row, fmt.Sprintf("%.0f", g.Stat(results.CPUBusy).Median), fmt.Sprintf("%.1f", g.Stat(results.CPUSpread).Median))
		}
		for _, m := range counters {
			row = append(row, median(g, m, count))
		}
		t.rows = append(t.rows, cells(row...))
	})
	return t
}

// hasWork says whether any run of wl measured its work per datagram.
func hasWork(a *results.Agg, wl string) bool {
	found := false
	eachRow(a, wl, func(_ string, g *results.Group) {
		for _, r := range g.Runs {
			found = found || r.Extra["work_ns_per_msg"] > 0
		}
	})
	return found
}

// hasBPFCost says whether any run of wl was measured with the kernel's
// BPF run-time statistics on.
func hasBPFCost(a *results.Agg, wl string) bool {
	found := false
	eachRow(a, wl, func(_ string, g *results.Group) {
		for i := range g.Runs {
			found = found || results.HasBPFCost(&g.Runs[i])
		}
	})
	return found
}

// bpfCostTable is what lanes' own programs cost per delivered datagram,
// per mode: runs, time (against the mode's whole CPU per datagram), and
// the three programs that took most of it.
func bpfCostTable(a *results.Agg, wl string) table {
	t := table{header: []string{"point", "mode", "program runs", "ns", "share of CPU per datagram", "most of it (ns)"},
		right: []bool{false, false, true, true, true, false}}
	eachRow(a, wl, func(label string, g *results.Group) {
		ns := g.StatBPF(results.BPFNsPerMsg)
		if ns.N == 0 {
			t.rows = append(t.rows, cells(label, g.Mode, "–", "–", "–", "–"))
			return
		}
		share := "–"
		if w := g.StatMeasured(results.WorkPerMsg); w.N > 0 && w.Median > 0 {
			share = fmt.Sprintf("%.0f%%", 100*ns.Median/w.Median)
		}
		type prog struct {
			name string
			ns   float64
		}
		var progs []prog
		seen := map[string]bool{}
		for i := range g.Runs {
			for k := range g.Runs[i].Extra {
				if name, ok := strings.CutPrefix(k, results.BPFNsPerMsg+":"); ok && !seen[name] {
					seen[name] = true
					progs = append(progs, prog{name, g.StatBPF(k).Median})
				}
			}
		}
		slices.SortFunc(progs, func(x, y prog) int { return cmp.Compare(y.ns, x.ns) })
		var top []string
		for _, p := range progs[:min(3, len(progs))] {
			top = append(top, fmt.Sprintf("%s %.0f", p.name, p.ns))
		}
		t.rows = append(t.rows, cells(label, g.Mode, fmt.Sprintf("%.2f", g.StatBPF(results.BPFRunsPerMsg).Median),
			fmt.Sprintf("%.0f", ns.Median), share, strings.Join(top, ", ")))
	})
	return t
}

// workTable is the udp_stress cost table: per mode the CPU one datagram
// took (against vanilla's) and the IRQ core's part of it, the cores' worth
// of receive work, and the two capacities that work allows: 1/(IRQ core's
// part), the IRQ core saturated, and cpus/(whole), every core saturated.
// A mode whose rate sits at the first is limited by what it leaves on the
// IRQ core, at the second by the work itself, under both by neither (the
// generator, sharing the cores, did not keep up).
func workTable(a *results.Agg, wl string, cpus int) table {
	t := table{header: []string{"point", "mode", "received Kpps", metricHeader(results.WorkPerMsg), "vs vanilla",
		metricHeader(results.WorkIRQPerMsg), metricHeader(results.WorkCores), "bound: IRQ core saturated Kpps",
		fmt.Sprintf("bound: %d cores saturated Kpps", cpus)}}
	for range t.header {
		t.right = append(t.right, true)
	}
	t.right[0], t.right[1] = false, false
	kpps := func(ns float64, n int) string {
		if ns <= 0 || n <= 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f", float64(n)*1e6/ns)
	}
	eachRow(a, wl, func(label string, g *results.Group) {
		row := []string{label, g.Mode}
		ws := g.StatMeasured(results.WorkPerMsg)
		if len(g.Runs) == 0 || ws.N == 0 {
			for len(row) < len(t.header) {
				row = append(row, "–")
			}
			t.rows = append(t.rows, cells(row...))
			return
		}
		w, irq := ws.Median, g.StatMeasured(results.WorkIRQPerMsg).Median
		row = append(row, fmt.Sprintf("%.0f", g.Stat(results.PPS).Median/1e3), fmt.Sprintf("%.0f", w))
		if v := a.Group(results.Key{Mode: "vanilla", Point: g.Point}); v != nil && v.StatMeasured(results.WorkPerMsg).N > 0 {
			row = append(row, fmt.Sprintf("%.2f", w/v.StatMeasured(results.WorkPerMsg).Median))
		} else {
			row = append(row, "–")
		}
		row = append(row, fmt.Sprintf("%.0f", irq), fmt.Sprintf("%.2f", g.StatMeasured(results.WorkCores).Median),
			kpps(irq, 1), kpps(w, cpus))
		t.rows = append(t.rows, cells(row...))
	})
	return t
}

// median is g's median of m in format, or a dash when no repeat succeeded.
func median(g *results.Group, m results.Metric, format func(float64) string) string {
	if len(g.Runs) == 0 {
		return "–"
	}
	return format(g.Stat(m).Median)
}

// hasBackground says whether a workload ran under background load.
func hasBackground(a *results.Agg, wl string) bool {
	for _, p := range a.Points(wl) {
		if p.Background > 0 {
			return true
		}
	}
	return false
}

// Latency statistics and background columns of backgroundTable, after
// PRISM's Fig. 11 (min, average and tail latency against background load).
var (
	bgLatency = []results.Metric{results.LatMin, results.LatAvg, results.LatP50, results.LatP99, results.LatP999, results.Lost}
	bgTraffic = []results.Metric{results.BackgroundOffered, results.BackgroundAsked, results.BackgroundLate, results.BackgroundKpps, results.BackgroundShare, results.GuardDemotions}
)

// backgroundTable is the medians of every latency statistic and of the
// background's offered and received rates, per load and mode: idle points
// have no background columns.
func backgroundTable(a *results.Agg, wl string) table {
	t := table{header: []string{"point", "mode"}, right: []bool{false, false}}
	for _, m := range append(slices.Clone(bgLatency), bgTraffic...) {
		t.header = append(t.header, metricHeader(m))
		t.right = append(t.right, true)
	}
	eachRow(a, wl, func(label string, g *results.Group) {
		row := []string{label, g.Mode}
		for _, m := range bgLatency {
			row = append(row, median(g, m, func(v float64) string { return num(v, m.Unit) }))
		}
		for _, m := range bgTraffic {
			// Idle points have no background; results from before a
			// run recorded a figure have none of it: "–", not 0.
			st := g.StatRecorded(m)
			if g.Background == 0 || st.N == 0 {
				row = append(row, "–")
				continue
			}
			row = append(row, num(st.Median, m.Unit))
		}
		t.rows = append(t.rows, cells(row...))
	})
	return t
}

// queueingTable compares vanilla's latency at each background load with
// its latency idle at the same baseline (awake or as-is): the queueing
// behind bulk a priority mode can remove. False when vanilla did not run
// both idle and loaded.
func queueingTable(a *results.Agg, wl string) (table, bool) {
	t := table{header: []string{"point", "p50 loaded / idle", "p99 loaded / idle", "vanilla waits behind bulk"}, right: []bool{false, true, true, false}}
	for _, p := range a.Points(wl) {
		if p.Background == 0 {
			continue
		}
		idle := p
		idle.Background = 0
		g, g0 := a.Group(results.Key{Mode: "vanilla", Point: p}), a.Group(results.Key{Mode: "vanilla", Point: idle})
		if g == nil || g0 == nil {
			continue
		}
		p50, p99 := ratio(g, g0, results.LatP50), ratio(g, g0, results.LatP99)
		if p50 == 0 || p99 == 0 {
			continue
		}
		verdict := "yes"
		if p50 <= 1 && p99 <= 1 {
			verdict = "no: nothing for PRISM to remove"
		}
		t.rows = append(t.rows, cells(pointLabel(p, a.Points(wl)), fmt.Sprintf("%.2f", p50), fmt.Sprintf("%.2f", p99), verdict))
	}
	return t, len(t.rows) > 0
}

// harmMetrics are the latency statistics a priority mode must not raise
// above vanilla's at any load (p99.9 included: a tail the primary table
// does not show).
var harmMetrics = []results.Metric{results.LatP50, results.LatP99, results.LatP999}

// harmTable sets every mode against vanilla at each point on the latency
// statistics of harmMetrics, each ratio with its same-repeat interval,
// and says per row where an interval lies wholly above 1 (worse than
// vanilla) or below it (better); "within noise" where every interval
// reaches 1, "undecided" where fewer than minPairs repeats pair up. A
// run with the NIC-like mode gets a second verdict, against it: what a
// mode costs beyond the XDP hook itself, which on the testbed's veth
// underlay makes every frame a copy that a NIC's DMA does not.
// False when vanilla ran at no point.
func harmTable(a *results.Agg, wl string) (table, bool) {
	t := table{header: []string{"point", "mode"}, right: []bool{false, false}}
	for _, m := range harmMetrics {
		t.header = append(t.header, m.Name+" vs vanilla")
		t.right = append(t.right, true)
	}
	t.header = append(t.header, "verdict")
	t.right = append(t.right, false)
	hook := nicLike(a)
	if hook != "" {
		t.header = append(t.header, "verdict vs xdp-pass")
		t.right = append(t.right, false)
	}
	pts := a.Points(wl)
	for _, p := range pts {
		if g := a.Group(results.Key{Mode: "vanilla", Point: p}); g == nil || len(g.Runs) == 0 {
			continue
		}
		label := pointLabel(p, pts)
		for _, mode := range a.ModesAt(p) {
			k := results.Key{Mode: mode, Point: p}
			if mode == "vanilla" || mode == "native" {
				continue
			}
			ratios, v := harmVerdict(a, k, "vanilla")
			row := append(cells(label, mode), ratios...)
			row = append(row, cell{v: v})
			if hook != "" {
				v = "–"
				if mode != hook {
					_, v = harmVerdict(a, k, hook)
				}
				row = append(row, cell{v: v})
			}
			t.rows = append(t.rows, row)
			label = ""
		}
	}
	return t, len(t.rows) > 0
}

// harmVerdict is k against base on harmMetrics: each ratio's cell, and
// the verdict (worse or better on the statistics whose interval clears
// 1, within noise, or undecided).
func harmVerdict(a *results.Agg, k results.Key, base string) ([]cell, string) {
	var row []cell
	var worse, better []string
	decided := true
	for _, m := range harmMetrics {
		c, lo, hi, ok := ratioCell(a, k, m, base)
		row = append(row, c)
		switch {
		case !ok:
			decided = false
		case lo > 1:
			worse = append(worse, m.Name)
		case hi < 1:
			better = append(better, m.Name)
		}
	}
	var verdict []string
	if len(worse) > 0 {
		verdict = append(verdict, "worse: "+strings.Join(worse, ", "))
	}
	if len(better) > 0 {
		verdict = append(verdict, "better: "+strings.Join(better, ", "))
	}
	switch {
	case len(verdict) > 0:
	case decided:
		verdict = append(verdict, "within noise")
	default:
		verdict = append(verdict, fmt.Sprintf("undecided (fewer than %d repeats)", minPairs))
	}
	return row, strings.Join(verdict, "; ")
}

// ratioCell is k's median of m over base's at k's point ("–" without
// one), with the same-repeat interval where at least minPairs repeats
// pair up; ok says the interval is there, lo and hi its ends.
func ratioCell(a *results.Agg, k results.Key, m results.Metric, base string) (c cell, lo, hi float64, ok bool) {
	r, has := a.Ratio(k, m, base)
	if !has {
		return cell{v: "–"}, 0, 0, false
	}
	c = cell{v: fmt.Sprintf("%.2f", r)}
	if k.Mode == base {
		return c, 0, 0, false
	}
	lo, hi, _, n, ok := a.PairedRatio(k, m, base, intervalConf)
	if !ok || n < minPairs {
		return c, 0, 0, false
	}
	c.rng = fmt.Sprintf("(%.2f–%.2f)", lo, hi)
	return c, lo, hi, true
}

// intervalConf is the confidence of the ratios' intervals; minPairs the
// fewest same-repeat pairs that get one (fewer say nothing useful).
const (
	intervalConf = 0.95
	minPairs     = 5
)

// ratio is g's median of m over g0's (0 when either has none).
func ratio(g, g0 *results.Group, m results.Metric) float64 {
	a, b := g.Stat(m), g0.Stat(m)
	if a.N == 0 || b.N == 0 || b.Median == 0 {
		return 0
	}
	return a.Median / b.Median
}

// batchSection is MFLOW's Fig. 7 as a table: for runs that compare a mode
// at several micro-flow batch sizes (MODE:batch=N), the reordering counters
// of each stream workload per batch size, with the stream's own rate, and
// the other modes of the run as references. Nothing without such modes.
func batchSection(b *strings.Builder, a *results.Agg) {
	bases, series := a.BatchSeries()
	if len(bases) == 0 {
		return
	}
	b.WriteString("\n## Out of order vs batch size\n\n" +
		"Modes run at several micro-flow batch sizes (`MODE:batch=N`; MFLOW's Fig. 7): datagrams received out of order " +
		"(udp_reorder: the sink's or iperf3's count), TCP segments queued out of order (ofo) and DSACKs, median [min–max] per run.\n")
	inSeries := map[string]bool{}
	for _, vs := range series {
		for _, v := range vs {
			inSeries[v.Mode] = true
		}
	}
	for _, wl := range a.Workloads() {
		ms := append(slices.Clone(results.OrderMetrics(wl)), Primary(a, wl)...)
		if len(ms) == len(Primary(a, wl)) {
			continue // not a stream
		}
		t := table{header: []string{"point", "mode", "batch"}, right: []bool{false, false, true}}
		for _, m := range ms {
			t.header = append(t.header, metricHeader(m))
			t.right = append(t.right, true)
		}
		pts := a.Points(wl)
		for _, p := range pts {
			var rows []batchRow
			for _, base := range bases {
				for _, v := range series[base] {
					rows = append(rows, batchRow{base, fmt.Sprint(v.Batch), a.Group(results.Key{Mode: v.Mode, Point: p})})
				}
			}
			for _, mode := range a.ModesAt(p) {
				if !inSeries[mode] {
					rows = append(rows, batchRow{mode, "–", a.Group(results.Key{Mode: mode, Point: p})})
				}
			}
			first := true
			for _, r := range rows {
				if r.g == nil {
					continue
				}
				row := cells("", r.base, r.batch)
				if first {
					row[0].v, first = orDash(pointLabel(p, pts)), false
				}
				for _, m := range ms {
					row = append(row, statCell(r.g.Stat(m), m))
				}
				t.rows = append(t.rows, row)
			}
		}
		if len(t.rows) > 0 {
			fmt.Fprintf(b, "\n### %s\n\n", wl)
			t.markdown(b)
		}
	}
}

// batchRow is one row of the batch table: a base mode at one batch size
// ("–" for a reference mode).
type batchRow struct {
	base, batch string
	g           *results.Group
}

func (t table) markdown(b *strings.Builder) {
	b.WriteString("| " + strings.Join(t.header, " | ") + " |\n|")
	for _, r := range t.right {
		if r {
			b.WriteString("---:|")
		} else {
			b.WriteString("---|")
		}
	}
	b.WriteByte('\n')
	for _, row := range t.rows {
		ss := make([]string, len(row))
		for i, c := range row {
			ss[i] = mdEscape(c.String())
		}
		b.WriteString("| " + strings.Join(ss, " | ") + " |\n")
	}
}

func (t table) text(b *strings.Builder) {
	n := func(s string) int { return len([]rune(s)) }
	wv := make([]int, len(t.header)) // value part
	wr := make([]int, len(t.header)) // range part, with its leading space
	for _, row := range t.rows {
		for i, c := range row {
			wv[i] = max(wv[i], n(c.v))
			if c.rng != "" {
				wr[i] = max(wr[i], 1+n(c.rng))
			}
		}
	}
	for i, h := range t.header {
		if d := n(h) - wv[i] - wr[i]; d > 0 {
			wv[i] += d // a wide header widens the value part
		}
	}
	pad := func(s string, w int, right bool) string {
		p := strings.Repeat(" ", max(0, w-n(s)))
		if right {
			return p + s
		}
		return s + p
	}
	line := func(parts []string) {
		b.WriteString(strings.TrimRight(strings.Join(parts, "  "), " ") + "\n")
	}
	hdr := make([]string, len(t.header))
	for i, h := range t.header {
		hdr[i] = pad(h, wv[i]+wr[i], t.right[i])
	}
	line(hdr)
	for _, row := range t.rows {
		parts := make([]string, len(row))
		for i, c := range row {
			r := ""
			if c.rng != "" {
				r = " " + c.rng
			}
			parts[i] = pad(c.v, wv[i], t.right[i]) + pad(r, wr[i], false)
		}
		line(parts)
	}
}

func metricHeader(m results.Metric) string {
	if m.Unit == "" {
		return m.Name
	}
	return m.Name + " " + m.Unit
}

// statCell is "median [min–max]", or the median alone for one repeat.
func statCell(s results.Stat, m results.Metric) cell {
	if s.N == 0 {
		return cell{v: "failed"}
	}
	c := cell{v: num(s.Median, m.Unit)}
	if s.N > 1 && s.Min != s.Max {
		c.rng = fmt.Sprintf("[%s–%s]", num(s.Min, m.Unit), num(s.Max, m.Unit))
	}
	return c
}

// num formats a value with a precision that suits its unit and size.
func num(v float64, unit string) string {
	switch {
	case unit == "Gbit/s":
		return fmt.Sprintf("%.2f", v)
	case unit == "µs" && v < 1000:
		return fmt.Sprintf("%.1f", v)
	}
	return count(v)
}

// count formats a number with about three significant digits, using k and
// M past ten thousand so wide counters do not blow up the table.
func count(v float64) string {
	a := v
	if a < 0 {
		a = -a
	}
	switch {
	case a >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case a >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case a >= 100 || v == float64(int64(v)):
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// pointLabel names a point by the dimensions that tell it apart from the
// other points of its workload (all of pts); with pts nil, by every
// dimension that is set.
func pointLabel(p results.Point, pts []results.Point) string {
	varies := func(f func(results.Point) any) bool {
		for _, q := range pts {
			if f(q) != f(p) {
				return true
			}
		}
		return false
	}
	all := pts == nil
	var parts []string
	if p.Proto != "" && (all || varies(func(q results.Point) any { return q.Proto })) {
		parts = append(parts, p.Proto)
	}
	if p.MsgSize > 0 {
		parts = append(parts, Bytes(p.MsgSize))
	}
	if p.Flows > 1 || (!all && varies(func(q results.Point) any { return q.Flows })) {
		if p.Flows == 1 {
			parts = append(parts, "1 flow")
		} else {
			parts = append(parts, fmt.Sprintf("%d flows", p.Flows))
		}
	}
	if p.Background > 0 || (!all && varies(func(q results.Point) any { return q.Background })) {
		parts = append(parts, fmt.Sprintf("bg %.0f%%", 100*p.Background))
	}
	if p.Rate > 0 || (!all && varies(func(q results.Point) any { return q.Rate })) {
		parts = append(parts, results.OfferedLabel(p.Rate))
	}
	if p.Awake {
		parts = append(parts, "awake")
	} else if !all && varies(func(q results.Point) any { return q.Awake }) {
		parts = append(parts, "as-is")
	}
	return strings.Join(parts, ", ")
}

// Bytes formats a message size: "64 B", "1400 B", "64 KiB".
func Bytes(n int) string { return results.Bytes(n) }

func dateRange(a, b time.Time) string {
	if a.IsZero() {
		return ""
	}
	s := a.Format("2006-01-02 15:04 MST")
	if !b.IsZero() && b.After(a) {
		s += fmt.Sprintf(" (%s)", b.Sub(a).Round(time.Second))
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// mdEscape keeps a cell's text from breaking the table.
func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
