package plot

import (
	"fmt"

	"gonum.org/v1/plot"

	"github.com/lanesnet/lanes/bench/results"
)

// OrderVsBatch draws MFLOW's Fig. 7 at one point of a stream workload:
// its reordering counters (results.OrderMetrics; dash) against the batch
// size of each base mode's MODE:batch=N variants (color; log x), medians
// with min–max. False when no base mode has two batch sizes there.
func OrderVsBatch(a *results.Agg, pt results.Point, path string) (bool, error) {
	ms := results.OrderMetrics(pt.Workload)
	bases, byBase := a.BatchSeries()
	if len(ms) == 0 || len(bases) == 0 {
		return false, nil
	}
	title := fmt.Sprintf("%s: out of order vs micro-flow batch size", pt.Workload)
	if l := pointLabel(pt); l != "" {
		title += " (" + l + ")"
	}
	p := newPlot(title, "batch size (packets, log scale)", "out of order per run (count)")
	p.Add(hgrid())
	leg := newLegend()
	n := 0
	// The batch sizes drawn, carried in Points' Flows for the tick helpers.
	var xs []results.Point
	batch := func(q results.Point) float64 { return float64(q.Flows) }
	for i, base := range bases {
		for j, m := range ms {
			var e errXYs
			for _, v := range byBase[base] {
				g := a.Group(results.Key{Mode: v.Mode, Point: pt})
				if g == nil || len(g.Runs) == 0 {
					continue
				}
				s := g.Stat(m)
				e = append(e, errXY{float64(v.Batch), s.Median, s.Median - s.Min, s.Max - s.Median})
				xs = append(xs, results.Point{Flows: v.Batch})
			}
			if len(e) < 2 {
				continue
			}
			label := base
			if len(ms) > 1 {
				label += " " + m.Name
			}
			if err := addLine(p, &leg, label, e, i, j); err != nil {
				return false, err
			}
			n++
		}
	}
	if n == 0 {
		return false, nil
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = valueTicks(xs, batch, func(v float64) string { return fmt.Sprint(int(v)) })
	padLog(&p.X, xs, batch)
	p.Y.Min = 0
	return true, save(p, leg, path)
}
