package plot

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"

	"github.com/lanesnet/lanes/bench/results"
)

// PRISM's figures: latency of a high-priority service against the load of
// low-priority background traffic, and the background's own rate.

// idleColors draw the idle reference CDFs (vanilla, native).
var idleColors = []color.Color{color.Black, color.Gray{Y: 140}}

// paperLoad is the background load of PRISM's Fig. 9 and 10 (60-70% of the
// receive core).
const paperLoad = 0.65

// loadPoints returns a workload's measured points that differ only in
// background load, sorted by it: the slice at the fewest flows and the
// smallest message, where priority workloads have one point per load.
func loadPoints(a *results.Agg, wl string) []results.Point {
	var sel []results.Point
	for _, p := range a.Points(wl) {
		if measured(a, p) {
			sel = append(sel, p)
		}
	}
	if len(sel) == 0 {
		return nil
	}
	base := sel[0]
	for _, p := range sel {
		base.Flows, base.MsgSize = min(base.Flows, p.Flows), min(base.MsgSize, p.MsgSize)
	}
	// With both baselines measured, the awake one (what the targets use).
	awake := slices.ContainsFunc(sel, func(p results.Point) bool { return p.Awake })
	sel = slices.DeleteFunc(sel, func(p results.Point) bool {
		return p.Flows != base.Flows || p.MsgSize != base.MsgSize || p.Proto != base.Proto || p.Awake != awake
	})
	slices.SortFunc(sel, func(x, y results.Point) int { return cmpFloat(x.Background, y.Background) })
	return sel
}

func loadPct(p results.Point) float64 { return 100 * p.Background }

// loadAxis labels the x axis with the measured loads.
func loadAxis(p *plot.Plot, sel []results.Point) {
	p.X.Tick.Marker = valueTicks(sel, loadPct, func(v float64) string { return fmt.Sprintf("%.0f%%", v) })
	p.X.Min, p.X.Max = loadPct(sel[0])-3, loadPct(sel[len(sel)-1])+3
}

// LatencyVsBackground draws PRISM's Fig. 11 for a workload: per mode
// (color) its minimum, average and p99 latency (dash) against the
// background load, medians with min–max over repeats; y is logarithmic
// when the values span more than a factor of five. False when fewer than
// two loads have latencies.
func LatencyVsBackground(a *results.Agg, wl, path string) (bool, error) {
	sel := loadPoints(a, wl)
	if countDistinct(sel, loadPct) < 2 {
		return false, nil
	}
	stats := []results.Metric{results.LatAvg, results.LatP99, results.LatMin}
	p := newPlot(fmt.Sprintf("%s: high-priority latency vs background load", wl),
		"low-priority background (% of the receive core's capacity)", "latency (µs)")
	p.Add(hgrid())
	leg := newLegend()
	lo, hi := math.Inf(1), math.Inf(-1)
	n := 0
	for i, mode := range a.Modes() {
		for j, m := range stats {
			e := series(a, mode, sel, loadPct, m, true)
			if len(e) < 2 {
				continue
			}
			for _, v := range e {
				lo, hi = min(lo, v.y-v.lo), max(hi, v.y+v.hi)
			}
			if err := addLine(p, &leg, mode+" "+m.Name, e, i, j); err != nil {
				return false, err
			}
			n++
		}
	}
	if n == 0 {
		return false, nil
	}
	loadAxis(p, sel)
	if lo > 0 && hi > 5*lo {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Label.Text = "latency (µs, log scale)"
		p.Y.Min, p.Y.Max = lo/1.1, hi*1.1
	} else {
		p.Y.Min = 0
	}
	return true, save(p, leg, path)
}

// VsBackground draws m per mode against the background load (medians with
// min–max), at every load or (busyOnly) those with a background. False
// when fewer than two loads have data.
func VsBackground(a *results.Agg, wl string, m results.Metric, ylabel string, busyOnly bool, path string) (bool, error) {
	sel := loadPoints(a, wl)
	if busyOnly {
		sel = slices.DeleteFunc(sel, func(p results.Point) bool { return p.Background == 0 })
	}
	var has []results.Point
	for _, pt := range sel {
		for _, mode := range a.ModesAt(pt) {
			if g := a.Group(results.Key{Mode: mode, Point: pt}); len(g.Runs) > 0 && g.Stat(m).Median > 0 {
				has = append(has, pt)
				break
			}
		}
	}
	if countDistinct(has, loadPct) < 2 {
		return false, nil
	}
	p := newPlot(fmt.Sprintf("%s: %s vs background load", wl, m.Name),
		"low-priority background (% of the receive core's capacity)", ylabel)
	p.Add(hgrid())
	leg, n, err := modeLines(p, a, has, loadPct, m)
	if err != nil || n == 0 {
		return false, err
	}
	loadAxis(p, has)
	p.Y.Min = 0
	return true, save(p, leg, path)
}

// CDFIdleBusy draws PRISM's Fig. 9 (and, for mode native, Fig. 10) for a
// workload: the idle latency CDFs of the baselines (vanilla, native;
// dashed black and grey) and every mode's CDF under the background load
// nearest the paper's 65%. False without a busy load with CDFs.
func CDFIdleBusy(a *results.Agg, wl, path string) (bool, error) {
	sel := loadPoints(a, wl)
	var idle, busy *results.Point
	for i, p := range sel {
		if p.Background == 0 {
			idle = &sel[i]
		} else if busy == nil || math.Abs(p.Background-paperLoad) < math.Abs(busy.Background-paperLoad) {
			busy = &sel[i]
		}
	}
	if busy == nil {
		return false, nil
	}
	c := newCDFPlot()
	if idle != nil {
		for i, base := range []string{"vanilla", "native"} {
			err := c.add(a.Group(results.Key{Mode: base, Point: *idle}), base+", idle", idleColors[i], 1)
			if err != nil {
				return false, err
			}
		}
	}
	idleLines := c.n
	for i, mode := range a.Modes() {
		label := fmt.Sprintf("%s, bg %.0f%%", mode, loadPct(*busy))
		if err := c.add(a.Group(results.Key{Mode: mode, Point: *busy}), label, modeColor(i), 0); err != nil {
			return false, err
		}
	}
	if c.n == idleLines {
		return false, nil
	}
	return c.save(fmt.Sprintf("%s: latency CDF, idle and under %.0f%% background", wl, loadPct(*busy)), path)
}
