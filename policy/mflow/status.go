package mflow

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanesnet/lanes/control/plan"
)

// mflow's own status: the reassemblers' counters, per container veth.
func init() {
	plan.RegisterStatus(plan.StatusSource{Read: readStatus, Collector: newReorderCollector}, "mflow")
}

func readStatus(netns string) (plan.ModeStatus, error) {
	devs, err := ReorderStatus(netns)
	if err != nil {
		return plan.ModeStatus{}, err
	}
	st := plan.ModeStatus{Data: devs}
	if len(devs) == 0 {
		st.Lines = []string{"reassembly: none (off, unavailable on this kernel, or no container veth took it; the apply's notes say which)"}
	}
	for _, d := range devs {
		line := fmt.Sprintf("reassembly on %s: %d held, %d released in order, %d gaps skipped, %d overflows, %d late, held now %d",
			d.Device, d.Held, d.Released, d.Gaps, d.Overflows, d.Late, d.HeldNow)
		if d.Backward != 0 {
			line += fmt.Sprintf(", %d let out behind a later micro-flow (x-reorder-check)", d.Backward)
		}
		st.Lines = append(st.Lines, line)
	}
	return st, nil
}

// reorderCollector reads the reassemblers' counters at each scrape.
type reorderCollector struct {
	netns                                         string
	held, released, late, gaps, overflows, inHeld *prometheus.Desc
}

func newReorderCollector(netns string) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"device"}, nil)
	}
	return &reorderCollector{netns: netns,
		held:      d("lanes_reorder_held_frames_total", "Frames MFLOW's reassembler held behind an earlier micro-flow."),
		released:  d("lanes_reorder_released_frames_total", "Held frames released in order."),
		late:      d("lanes_reorder_late_frames_total", "Frames of a micro-flow already given up, passed as they came."),
		gaps:      d("lanes_reorder_gaps_skipped_total", "Micro-flows given up after the watchdog's timeout (a lost frame)."),
		overflows: d("lanes_reorder_overflows_total", "Micro-flows given up because a memory limit was reached (released in order, not dropped)."),
		inHeld:    d("lanes_reorder_held", "Frames held now."),
	}
}

func (c *reorderCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.held, c.released, c.late, c.gaps, c.overflows, c.inHeld} {
		ch <- d
	}
}

func (c *reorderCollector) Collect(ch chan<- prometheus.Metric) {
	devs, err := ReorderStatus(c.netns)
	if err != nil {
		return
	}
	for _, d := range devs {
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.CounterValue, float64(d.Held), d.Device)
		ch <- prometheus.MustNewConstMetric(c.released, prometheus.CounterValue, float64(d.Released), d.Device)
		ch <- prometheus.MustNewConstMetric(c.late, prometheus.CounterValue, float64(d.Late), d.Device)
		ch <- prometheus.MustNewConstMetric(c.gaps, prometheus.CounterValue, float64(d.Gaps), d.Device)
		ch <- prometheus.MustNewConstMetric(c.overflows, prometheus.CounterValue, float64(d.Overflows), d.Device)
		ch <- prometheus.MustNewConstMetric(c.inHeld, prometheus.GaugeValue, float64(d.HeldNow), d.Device)
	}
}
