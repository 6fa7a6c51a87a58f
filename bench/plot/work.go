package plot

import (
	"image/color"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/lanesnet/lanes/bench/results"
)

// Work draws, per mode at point pt, the CPU one delivered datagram cost
// (udp_stress's work per datagram, the generator's time excluded) as a bar
// in two parts: the IRQ core's and the other cores'. The IRQ core's part
// bounds the rate a mode can reach while that core polls the NIC; the
// whole bar bounds it on all cores. It returns false when no run at pt
// measured its work.
func Work(a *results.Agg, pt results.Point, path string) (bool, error) {
	var modes []string
	var irq, rest plotter.Values
	top := 0.0
	for _, mode := range a.ModesAt(pt) {
		g := a.Group(results.Key{Mode: mode, Point: pt})
		if len(g.Runs) == 0 {
			continue
		}
		w, i := g.StatMeasured(results.WorkPerMsg).Median, g.StatMeasured(results.WorkIRQPerMsg).Median
		if w <= 0 {
			continue
		}
		modes = append(modes, mode)
		irq = append(irq, min(i, w))
		rest = append(rest, w-min(i, w))
		top = max(top, w)
	}
	if len(modes) == 0 {
		return false, nil
	}
	title := pt.Workload + ": CPU per delivered datagram (generator excluded)"
	if l := pointLabel(pt); l != "" {
		title += " (" + l + ")"
	}
	p := newPlot(title, "", "ns per datagram (medians over repeats)")
	p.NominalX(modes...)
	p.Add(hgrid())
	bw := (width - legendW - 0.9*vg.Inch) / vg.Length(len(modes)) * 0.6
	low, err := plotter.NewBarChart(irq, bw)
	if err != nil {
		return false, err
	}
	low.Color = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	low.LineStyle.Width = 0
	high, err := plotter.NewBarChart(rest, bw)
	if err != nil {
		return false, err
	}
	high.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	high.LineStyle.Width = 0
	high.StackOn(low)
	p.Add(low, high)
	p.Y.Min, p.Y.Max = 0, top*1.1
	leg := newLegend()
	leg.Add("other cores", high)
	leg.Add("IRQ core", low)
	return true, save(p, leg, path)
}
