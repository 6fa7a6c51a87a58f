// Package plot draws the benchmark's figures as PNGs with gonum/plot:
// throughput against message size, throughput against flows, the per-CPU
// time split of each mode at a point, and latency CDFs. A figure whose
// data is missing is skipped, never drawn empty.
package plot

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/lanesnet/lanes/bench/results"
)

// Figure size. The legend sits in a column right of the axes, so it never
// hides data.
const (
	width   = 9 * vg.Inch
	height  = 5 * vg.Inch
	legendW = 1.4 * vg.Inch
	dpi     = 120
)

// All writes every figure the data supports into dir (created if needed)
// and returns the files written, in a stable order:
//
//	throughput_<workload>.png  throughput vs message size (tcp_stream, udp_stream)
//	flows_<workload>_<msg>B.png throughput vs flows (tcp_multi, and any
//	                           throughput workload measured at several flow counts)
//	cpu_<workload>_<point>.png per-CPU split per mode at the workload's
//	                           heaviest point (largest message, most flows, idle background)
//	cdf_<workload>_<point>.png latency CDF per mode (workloads with LatCDF)
//	cdf_<workload>_idle_vs_busy.png  PRISM's Fig. 9: idle CDFs of the
//	                           baselines and every mode's CDF under the
//	                           background load nearest 65%
//	latency_vs_background_<workload>.png  PRISM's Fig. 11: min, avg and p99
//	                           latency per mode against background load
//	background_rate_<workload>.png  the low-priority background's received
//	                           rate per mode against its load
//	rate_vs_background_<workload>.png  request rate of prio_memcached and
//	                           prio_nginx against background load
//	order_vs_batch_<point>.png MFLOW's Fig. 7: reordering counters per base
//	                           mode against the micro-flow batch size of
//	                           MODE:batch=N variants
//
// An error drawing one figure does not stop the others; the errors are
// joined.
func All(f *results.File, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	a := f.Aggregate()
	var files []string
	var errs []error
	emit := func(name string, ok bool, err error) {
		if err != nil {
			os.Remove(name) // no half-written figure
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		} else if ok {
			files = append(files, name)
		}
	}
	for _, wl := range []string{"tcp_stream", "udp_stream"} {
		name := filepath.Join(dir, "throughput_"+wl+".png")
		ok, err := guard(func() (bool, error) { return ThroughputVsSize(a, wl, name) })
		emit(name, ok, err)
	}
	{
		name := filepath.Join(dir, "capacity_udp_stress.png")
		ok, err := guard(func() (bool, error) { return DeliveredVsOffered(a, "udp_stress", name) })
		emit(name, ok, err)
	}
	for _, wl := range a.Workloads() {
		for _, msg := range flowSeries(a, wl) {
			name := filepath.Join(dir, fmt.Sprintf("flows_%s_%dB.png", wl, msg))
			ok, err := guard(func() (bool, error) { return ThroughputVsFlows(a, wl, msg, name) })
			emit(name, ok, err)
		}
	}
	for _, p := range a.Points("udp_stress") {
		name := filepath.Join(dir, "work_"+slug(p)+".png")
		ok, err := guard(func() (bool, error) { return Work(a, p, name) })
		emit(name, ok, err)
	}
	for _, wl := range a.Workloads() {
		p, found := HeaviestPoint(a, wl)
		if !found {
			continue
		}
		irq := -1
		if f.Machine.CPUs > 0 { // a zero Machine says nothing about the IRQ core
			irq = f.Machine.IRQCPU
		}
		name := filepath.Join(dir, "cpu_"+slug(p)+".png")
		ok, err := guard(func() (bool, error) { return CPU(a, p, irq, name) })
		emit(name, ok, err)
	}
	for _, wl := range a.Workloads() {
		for _, p := range a.Points(wl) {
			name := filepath.Join(dir, "cdf_"+slug(p)+".png")
			ok, err := guard(func() (bool, error) { return CDF(a, p, name) })
			emit(name, ok, err)
		}
	}
	for _, wl := range a.Workloads() {
		figs := []figure{
			{"cdf_" + wl + "_idle_vs_busy", func(n string) (bool, error) { return CDFIdleBusy(a, wl, n) }},
			{"latency_vs_background_" + wl, func(n string) (bool, error) { return LatencyVsBackground(a, wl, n) }},
			{"background_rate_" + wl, func(n string) (bool, error) {
				return VsBackground(a, wl, results.BackgroundKpps, "low-priority background received (Kpps)", true, n)
			}},
		}
		if slices.Contains(requestWorkloads, wl) {
			figs = append(figs, figure{"rate_vs_background_" + wl, func(n string) (bool, error) {
				return VsBackground(a, wl, results.RequestRate, "high-priority requests/s", false, n)
			}})
		}
		for _, f := range figs {
			name := filepath.Join(dir, f.name+".png")
			ok, err := guard(func() (bool, error) { return f.draw(name) })
			emit(name, ok, err)
		}
		for _, p := range a.Points(wl) {
			name := filepath.Join(dir, "order_vs_batch_"+slug(p)+".png")
			ok, err := guard(func() (bool, error) { return OrderVsBatch(a, p, name) })
			emit(name, ok, err)
		}
	}
	return files, errors.Join(errs...)
}

// figure is a file name (without .png) and what draws it there.
type figure struct {
	name string
	draw func(path string) (bool, error)
}

// requestWorkloads are the priority workloads whose service's request rate
// is a result (prio_latency's ping-pong runs at a fixed rate).
var requestWorkloads = []string{"prio_memcached", "prio_nginx"}

// guard turns a panic inside gonum/plot (it panics on data it cannot
// scale, e.g. a non-positive value on a log axis) into an error: a figure
// must not take down the benchmark run whose results it draws.
func guard(fn func() (bool, error)) (ok bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			ok, err = false, fmt.Errorf("plot panicked: %v", r)
		}
	}()
	return fn()
}

// ThroughputVsSize plots one line per mode of the median throughput
// against message size (log x) with min–max error bars, at the workload's
// base slice: idle background and the fewest flows. It draws nothing and
// returns false when fewer than two message sizes were measured.
func ThroughputVsSize(a *results.Agg, workload, path string) (bool, error) {
	pts := a.Points(workload)
	if len(pts) == 0 {
		return false, nil
	}
	bg, flows := pts[0].Background, pts[0].Flows
	for _, p := range pts {
		bg, flows = min(bg, p.Background), min(flows, p.Flows)
	}
	var sel []results.Point
	for _, p := range pts {
		if p.Background == bg && p.Flows == flows && p.MsgSize > 0 && measured(a, p) {
			sel = append(sel, p)
		}
	}
	xs := func(p results.Point) float64 { return float64(p.MsgSize) }
	if countDistinct(sel, xs) < 2 {
		return false, nil
	}
	p := newPlot(fmt.Sprintf("%s: throughput vs message size", workload),
		"message size (bytes, log scale)", "throughput (Gbit/s)")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = valueTicks(sel, xs, func(v float64) string { return bytesLabel(int(v)) })
	p.Add(hgrid())
	leg, n, err := modeLines(p, a, sel, xs, results.Throughput)
	if err != nil || n == 0 {
		return false, err
	}
	padLog(&p.X, sel, xs)
	p.Y.Min = 0
	return true, save(p, leg, path)
}

// DeliveredVsOffered plots, per mode, the median rate the receiver
// delivered against the rate the generator was paced at (--rates), with
// min–max error bars and the line where nothing is lost. The peak of a
// mode's curve is its receive capacity short of livelock; the unpaced
// point is left out (its offered rate depends on the mode). It returns
// false when fewer than two rates were measured.
func DeliveredVsOffered(a *results.Agg, workload, path string) (bool, error) {
	var sel []results.Point
	for _, p := range a.Points(workload) {
		if p.Rate > 0 && measured(a, p) {
			sel = append(sel, p)
		}
	}
	kpps := func(p results.Point) float64 { return float64(p.Rate) / 1e3 }
	if countDistinct(sel, kpps) < 2 {
		return false, nil
	}
	p := newPlot(fmt.Sprintf("%s: delivered vs offered", workload), "offered (Kpps)", "delivered to the application (Kpps)")
	p.Add(hgrid())
	delivered := results.Metric{Name: "delivered", Unit: "Kpps", Get: func(r *results.Run) float64 { return r.PPS / 1e3 }}
	leg, n, err := modeLines(p, a, sel, kpps, delivered)
	if err != nil || n == 0 {
		return false, err
	}
	hi := 0.0
	for _, s := range sel {
		hi = max(hi, kpps(s))
	}
	ideal, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: hi, Y: hi}})
	if err != nil {
		return false, err
	}
	ideal.LineStyle.Color = color.Gray{Y: 160}
	ideal.LineStyle.Dashes = plotutil.Dashes(2)
	p.Add(ideal)
	leg.Add("offered (nothing lost)", ideal)
	p.X.Min, p.Y.Min = 0, 0
	return true, save(p, leg, path)
}

// ThroughputVsFlows plots median throughput against the number of flows
// (log x) per mode, at one message size and idle background. It returns
// false when fewer than two flow counts were measured.
func ThroughputVsFlows(a *results.Agg, workload string, msgSize int, path string) (bool, error) {
	var sel []results.Point
	for _, p := range a.Points(workload) {
		if p.MsgSize == msgSize && p.Background == 0 && p.Flows > 0 && measured(a, p) {
			sel = append(sel, p)
		}
	}
	xs := func(p results.Point) float64 { return float64(p.Flows) }
	if countDistinct(sel, xs) < 2 {
		return false, nil
	}
	title := fmt.Sprintf("%s: throughput vs flows", workload)
	if msgSize > 0 {
		title += fmt.Sprintf(" (%s messages)", bytesLabel(msgSize))
	}
	p := newPlot(title, "parallel flows (log scale)", "aggregate throughput (Gbit/s)")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = valueTicks(sel, xs, func(v float64) string { return fmt.Sprint(int(v)) })
	p.Add(hgrid())
	leg, n, err := modeLines(p, a, sel, xs, results.Throughput)
	if err != nil || n == 0 {
		return false, err
	}
	padLog(&p.X, sel, xs)
	p.Y.Min = 0
	return true, save(p, leg, path)
}

// measured reports whether some mode has a successful run at p.
func measured(a *results.Agg, p results.Point) bool {
	for _, m := range a.ModesAt(p) {
		if len(a.Group(results.Key{Mode: m, Point: p}).Runs) > 0 {
			return true
		}
	}
	return false
}

// flowSeries returns the message sizes at which a throughput workload
// was measured with at least two flow counts (idle background).
func flowSeries(a *results.Agg, workload string) []int {
	flows := map[int][]int{}
	for _, p := range a.Points(workload) {
		if p.Background == 0 && !slices.Contains(flows[p.MsgSize], p.Flows) {
			flows[p.MsgSize] = append(flows[p.MsgSize], p.Flows)
		}
	}
	var out []int
	for msg, fs := range flows {
		if len(fs) >= 2 && hasThroughput(a, workload, msg) {
			out = append(out, msg)
		}
	}
	slices.Sort(out)
	return out
}

func hasThroughput(a *results.Agg, workload string, msg int) bool {
	for _, g := range a.Groups {
		if g.Workload == workload && g.MsgSize == msg {
			for i := range g.Runs {
				if g.Runs[i].ThroughputGbps > 0 {
					return true
				}
			}
		}
	}
	return false
}

// modeLines adds one line with points and min–max error bars per mode
// over the selected points, and returns the legend entries and how many
// modes had data.
func modeLines(p *plot.Plot, a *results.Agg, sel []results.Point, x func(results.Point) float64, m results.Metric) (plot.Legend, int, error) {
	leg := newLegend()
	n := 0
	for i, mode := range a.Modes() {
		e := series(a, mode, sel, x, m, false)
		if len(e) == 0 {
			continue
		}
		if err := addLine(p, &leg, mode, e, i, i); err != nil {
			return leg, 0, err
		}
		n++
	}
	return leg, n, nil
}

// series is mode's median of m with its min–max at each selected point
// that has a successful repeat; positive keeps only medians above 0 (for
// a log axis).
func series(a *results.Agg, mode string, sel []results.Point, x func(results.Point) float64, m results.Metric, positive bool) errXYs {
	var e errXYs
	for _, pt := range sel {
		g := a.Group(results.Key{Mode: mode, Point: pt})
		if g == nil || len(g.Runs) == 0 {
			continue
		}
		s := g.Stat(m)
		if positive && s.Median <= 0 {
			continue
		}
		e = append(e, errXY{x(pt), s.Median, s.Median - s.Min, s.Max - s.Median})
	}
	return e
}

// addLine draws e (sorted by x here) as a line with markers and min–max
// error bars, colored and marked as the color-th mode, dashed as the
// dash-th style, and adds it to leg as label.
func addLine(p *plot.Plot, leg *plot.Legend, label string, e errXYs, color, dash int) error {
	slices.SortFunc(e, func(a, b errXY) int { return cmpFloat(a.x, b.x) })
	l, pts, err := plotter.NewLinePoints(e)
	if err != nil {
		return err
	}
	style(l, pts, color)
	l.Dashes = plotutil.Dashes(dash)
	eb, err := plotter.NewYErrorBars(e)
	if err != nil {
		return err
	}
	eb.LineStyle.Color = modeColor(color)
	p.Add(l, pts, eb)
	leg.Add(label, l, pts)
	return nil
}

// HeaviestPoint picks the point the CPU figure shows for a workload: idle
// background, then the largest message, then the most flows — where the
// receive path is loaded hardest and modes differ most.
func HeaviestPoint(a *results.Agg, workload string) (results.Point, bool) {
	var best results.Point
	found := false
	for _, p := range a.Points(workload) {
		if !measured(a, p) {
			continue
		}
		if !found ||
			p.Background < best.Background ||
			(p.Background == best.Background && (p.MsgSize > best.MsgSize ||
				(p.MsgSize == best.MsgSize && p.Flows > best.Flows))) {
			best, found = p, true
		}
	}
	return best, found
}

// CPU draws, for each mode at point p, one stacked bar per CPU: softirq,
// system, NAPI/cpumap kthreads and user time, in percent of the CPU; what
// is left to 100 is idle. Kthread time is carved out of system time (the
// kernel accounts threaded NAPI as system), so nothing is counted twice.
// The core that polls the underlay NIC, irqCPU (-1 if unknown), is marked
// in its tick label. It returns false when no mode has CPU data at p.
func CPU(a *results.Agg, pt results.Point, irqCPU int, path string) (bool, error) {
	type bar struct{ si, sys, kt, usr float64 }
	modes := []string{}
	var cpus []int
	data := map[string]map[int]bar{}
	for _, mode := range a.ModesAt(pt) {
		g := a.Group(results.Key{Mode: mode, Point: pt})
		us := g.CPU()
		if len(us) == 0 {
			continue
		}
		modes = append(modes, mode)
		data[mode] = map[int]bar{}
		for _, u := range us {
			if !slices.Contains(cpus, u.CPU) {
				cpus = append(cpus, u.CPU)
			}
			kt := min(u.Kthreads, u.System)
			data[mode][u.CPU] = bar{u.SoftIRQ, u.System - kt, kt, u.User}
		}
	}
	if len(modes) == 0 {
		return false, nil
	}
	slices.Sort(cpus)

	// Slots along x: the CPUs of a mode side by side, one empty slot
	// between modes.
	nc := len(cpus)
	slots := len(modes)*(nc+1) - 1
	vals := [4]plotter.Values{}
	for i := range vals {
		vals[i] = make(plotter.Values, slots)
	}
	names := make([]string, slots)
	compact := slots > 12
	var modeLabels plotter.XYLabels
	for mi, mode := range modes {
		for ci, c := range cpus {
			s := mi*(nc+1) + ci
			b := data[mode][c]
			vals[0][s], vals[1][s], vals[2][s], vals[3][s] = b.si, b.sys, b.kt, b.usr
			// With many bars the labels shrink to the number, so they
			// do not run into each other.
			if compact {
				names[s] = fmt.Sprint(c)
				if c == irqCPU {
					names[s] += "*"
				}
			} else {
				names[s] = fmt.Sprintf("cpu%d", c)
				if c == irqCPU {
					names[s] += " (irq)"
				}
			}
		}
		modeLabels.XYs = append(modeLabels.XYs, plotter.XY{X: float64(mi*(nc+1)) + float64(nc-1)/2, Y: 104})
		modeLabels.Labels = append(modeLabels.Labels, mode)
	}

	title := fmt.Sprintf("%s: CPU time per core by mode", pt.Workload)
	if l := pointLabel(pt); l != "" {
		title += " (" + l + ")"
	}
	xl := ""
	if compact {
		xl = "core"
		if irqCPU >= 0 {
			xl += " (* polls the underlay NIC)"
		}
	}
	p := newPlot(title, xl, "CPU time (% of core; rest is idle)")
	p.NominalX(names...)
	p.X.Tick.Label.Font.Size = vg.Points(9)
	plotW := width - legendW - 0.9*vg.Inch // about the data area's width
	bw := plotW / vg.Length(slots) * 0.8
	leg := newLegend()
	components := []struct {
		name string
		c    color.Color
	}{
		{"softirq", color.RGBA{R: 214, G: 39, B: 40, A: 255}},
		{"system", color.RGBA{R: 31, G: 119, B: 180, A: 255}},
		{"kthreads", color.RGBA{R: 255, G: 127, B: 14, A: 255}},
		{"user", color.RGBA{R: 44, G: 160, B: 44, A: 255}},
	}
	p.Add(hgrid())
	var prev *plotter.BarChart
	bars := make([]*plotter.BarChart, len(components))
	for i, comp := range components {
		bc, err := plotter.NewBarChart(vals[i], bw)
		if err != nil {
			return false, err
		}
		bc.Color = comp.c
		bc.LineStyle.Width = 0 // no outline: empty gap slots stay invisible
		if prev != nil {
			bc.StackOn(prev)
		}
		prev = bc
		bars[i] = bc
		p.Add(bc)
	}
	// The legend lists the top of the stack first, as the bars read.
	for i := len(components) - 1; i >= 0; i-- {
		leg.Add(components[i].name, bars[i])
	}
	lb, err := plotter.NewLabels(modeLabels)
	if err != nil {
		return false, err
	}
	for i := range lb.TextStyle {
		lb.TextStyle[i].XAlign = draw.XCenter
		lb.TextStyle[i].Font.Size = vg.Points(11)
	}
	p.Add(lb)
	p.Y.Min, p.Y.Max = 0, 110
	p.Y.Tick.Marker = plot.ConstantTicks(pctTicks())
	return true, save(p, leg, path)
}

// CDF plots the latency CDF per mode at point p, each from the repeat
// whose p50 is the median of the mode's repeats (merging repeats would
// blend distributions and could hide a bimodal run). The x axis is
// logarithmic when the latencies span more than a factor of five. It
// returns false when no repeat at p has a CDF.
func CDF(a *results.Agg, pt results.Point, path string) (bool, error) {
	c := newCDFPlot()
	for i, mode := range a.Modes() {
		if err := c.add(a.Group(results.Key{Mode: mode, Point: pt}), mode, modeColor(i), i); err != nil {
			return false, err
		}
	}
	title := fmt.Sprintf("%s: latency CDF", pt.Workload)
	if l := pointLabel(pt); l != "" {
		title += " (" + l + ")"
	}
	return c.save(title, path)
}

// cdfPlot collects latency CDF lines and the range they span.
type cdfPlot struct {
	p      *plot.Plot
	leg    plot.Legend
	lo, hi float64
	n      int
}

func newCDFPlot() *cdfPlot {
	p := newPlot("", "latency (µs)", "fraction of requests ≤ latency")
	p.Add(plotter.NewGrid())
	return &cdfPlot{p: p, leg: newLegend(), lo: math.Inf(1), hi: math.Inf(-1)}
}

// add draws the CDF of g's repeat whose p50 is the median of its repeats
// that have one, as label; nothing when g has none.
func (c *cdfPlot) add(g *results.Group, label string, col color.Color, dash int) error {
	if g == nil {
		return nil
	}
	var withCDF results.Group
	for _, r := range g.Runs {
		if len(r.LatCDF) > 0 {
			withCDF.Runs = append(withCDF.Runs, r)
		}
	}
	r := withCDF.MedianRun(results.LatP50)
	if r == nil {
		return nil
	}
	var xy plotter.XYs
	for _, p := range r.LatCDF {
		if p.Us > 0 && !math.IsNaN(p.Fraction) {
			xy = append(xy, plotter.XY{X: p.Us, Y: p.Fraction})
			c.lo, c.hi = min(c.lo, p.Us), max(c.hi, p.Us)
		}
	}
	if len(xy) == 0 {
		return nil
	}
	slices.SortFunc(xy, func(a, b plotter.XY) int { return cmpFloat(a.X, b.X) })
	l, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	// Straight segments, not steps: the CDF is thinned, and steps
	// between its few points would show the thinning, not the data.
	l.Color = col
	l.Width = vg.Points(2)
	l.Dashes = plotutil.Dashes(dash)
	c.p.Add(l)
	c.leg.Add(label, l)
	c.n++
	return nil
}

// save writes the figure, with a logarithmic x axis when the latencies
// span more than a factor of five; false when no line was added.
func (c *cdfPlot) save(title, path string) (bool, error) {
	if c.n == 0 {
		return false, nil
	}
	p := c.p
	p.Title.Text = title
	if c.hi > 5*c.lo {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.X.Label.Text = "latency (µs, log scale)"
		p.X.Min, p.X.Max = c.lo/1.1, c.hi*1.1
	}
	p.Y.Min, p.Y.Max = 0, 1
	p.Y.Tick.Marker = plot.TickerFunc(niceTicks)
	if p.X.Scale == (plot.LinearScale{}) {
		p.X.Tick.Marker = plot.TickerFunc(niceTicks)
	}
	return true, save(p, c.leg, path)
}

// errXY is a point with asymmetric y errors (median, median-min, max-median).
type errXY struct{ x, y, lo, hi float64 }

type errXYs []errXY

func (e errXYs) Len() int                        { return len(e) }
func (e errXYs) XY(i int) (float64, float64)     { return e[i].x, e[i].y }
func (e errXYs) YError(i int) (float64, float64) { return e[i].lo, e[i].hi }

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(8)
	p.Y.Tick.Marker = plot.TickerFunc(niceTicks)
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.X.Label.TextStyle.Font.Size = vg.Points(12)
	p.Y.Label.TextStyle.Font.Size = vg.Points(12)
	return p
}

func newLegend() plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.TextStyle.Font.Size = vg.Points(11)
	l.ThumbnailWidth = vg.Points(28)
	return l
}

// save renders p with leg in a column to its right and writes a PNG.
func save(p *plot.Plot, leg plot.Legend, path string) error {
	m := vg.Points(8) // margin, so the title and tick labels do not touch the edge
	// Long mode names (variants like prism-batch:streamline=false) widen
	// the legend column, and the image with it, rather than being cut.
	lw := legendW
	probe := draw.New(vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(dpi)))
	if r := leg.Rectangle(probe); r.Size().X+2*m > lw {
		lw = r.Size().X + 2*m
	}
	w := width - legendW + lw
	img := vgimg.NewWith(vgimg.UseWH(w, height), vgimg.UseDPI(dpi), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	p.Draw(draw.Crop(dc, m, -lw, m, -m))
	lc := draw.Crop(dc, w-lw+m, 0, 0, -vg.Points(40))
	leg.Draw(lc)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Okabe–Ito: a palette that stays distinguishable for color-blind readers.
var palette = []color.Color{
	color.RGBA{0, 114, 178, 255},   // blue
	color.RGBA{213, 94, 0, 255},    // vermillion
	color.RGBA{0, 158, 115, 255},   // green
	color.RGBA{204, 121, 167, 255}, // purple
	color.RGBA{230, 159, 0, 255},   // orange
	color.RGBA{86, 180, 233, 255},  // sky
	color.RGBA{0, 0, 0, 255},       // black
	color.RGBA{150, 130, 0, 255},   // olive (Okabe–Ito yellow is too pale on white)
}

// modeColor is the color of the i-th mode in report order, the same in
// every figure.
func modeColor(i int) color.Color { return palette[i%len(palette)] }

func style(l *plotter.Line, s *plotter.Scatter, i int) {
	l.Color = modeColor(i)
	l.Width = vg.Points(2)
	l.Dashes = plotutil.Dashes(i)
	s.Color = modeColor(i)
	s.Shape = plotutil.Shape(i)
	s.Radius = vg.Points(3.5)
}

// valueTicks puts a labelled tick at each measured x value: a log axis
// over 64..65536 with ticks only at powers of ten says little.
func valueTicks(pts []results.Point, x func(results.Point) float64, label func(float64) string) plot.ConstantTicks {
	var vs []float64
	for _, p := range pts {
		if v := x(p); !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	slices.Sort(vs)
	t := make(plot.ConstantTicks, len(vs))
	for i, v := range vs {
		t[i] = plot.Tick{Value: v, Label: label(v)}
	}
	return t
}

// padLog widens a log axis a little past the outermost points so markers
// are not cut in half at the edges.
func padLog(ax *plot.Axis, pts []results.Point, x func(results.Point) float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		lo, hi = min(lo, x(p)), max(hi, x(p))
	}
	f := math.Pow(hi/lo, 0.05)
	ax.Min, ax.Max = lo/f, hi*f
}

// hgrid is a grid of horizontal lines only, added before the data so it
// lies underneath.
func hgrid() *plotter.Grid {
	g := plotter.NewGrid()
	g.Vertical.Color = nil
	return g
}

// niceTicks labels about six round values (steps of 1, 2, 2.5 or 5 times
// a power of ten): gonum's default labels only two or three on a figure
// this size.
func niceTicks(lo, hi float64) []plot.Tick {
	span := hi - lo
	if !(span > 0) || math.IsInf(span, 0) {
		return plot.DefaultTicks{}.Ticks(lo, hi)
	}
	raw := span / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ts []plot.Tick
	for i := math.Ceil(lo / step); i*step <= hi+step*1e-9; i++ {
		v := i * step
		if math.Abs(v) < step*1e-9 {
			v = 0 // no "-0" or 1e-17 label
		}
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', 6, 64)})
		if mv := v + step/2; mv < hi {
			ts = append(ts, plot.Tick{Value: mv}) // unlabelled minor tick
		}
	}
	return ts
}

func pctTicks() []plot.Tick {
	var t []plot.Tick
	for v := 0; v <= 100; v += 20 {
		t = append(t, plot.Tick{Value: float64(v), Label: fmt.Sprint(v)})
	}
	return t
}

func countDistinct(pts []results.Point, x func(results.Point) float64) int {
	var vs []float64
	for _, p := range pts {
		if !slices.Contains(vs, x(p)) {
			vs = append(vs, x(p))
		}
	}
	return len(vs)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func bytesLabel(n int) string { return results.Bytes(n) }

func pointLabel(p results.Point) string {
	var parts []string
	if p.MsgSize > 0 {
		parts = append(parts, bytesLabel(p.MsgSize))
	}
	if p.Flows > 1 {
		parts = append(parts, fmt.Sprintf("%d flows", p.Flows))
	}
	if p.Background > 0 {
		parts = append(parts, fmt.Sprintf("background %.0f%%", 100*p.Background))
	}
	if p.Rate > 0 {
		parts = append(parts, results.OfferedLabel(p.Rate))
	}
	if p.Awake {
		parts = append(parts, "cores awake")
	}
	return strings.Join(parts, ", ")
}

// slug names a point in a file name: workload_proto_64B_4flows_bg50.
func slug(p results.Point) string {
	parts := []string{p.Workload}
	if p.Proto != "" {
		parts = append(parts, p.Proto)
	}
	if p.MsgSize > 0 {
		parts = append(parts, fmt.Sprintf("%dB", p.MsgSize))
	}
	if p.Flows > 1 {
		parts = append(parts, fmt.Sprintf("%dflows", p.Flows))
	}
	if p.Background > 0 {
		parts = append(parts, fmt.Sprintf("bg%.0f", 100*p.Background))
	}
	if p.Rate > 0 {
		parts = append(parts, fmt.Sprintf("at%dk", p.Rate/1000))
	}
	if p.Awake {
		parts = append(parts, "awake")
	}
	s := strings.Join(parts, "_")
	return strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r == os.PathSeparator {
			return '-'
		}
		return r
	}, s)
}
