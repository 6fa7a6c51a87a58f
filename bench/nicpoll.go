package bench

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/testbed"
)

// A priority point's queue, as the receiving NIC's poller saw it: the
// frames each poll of the receiving underlay on the IRQ core found
// waiting, on average over the repeat (nic_frames_per_poll in
// results.json). A marked frame on vanilla's path waits behind the frames
// its poll finds ahead of it, so this is the queue PRISM can take away at
// that point: about one frame a poll, nothing. PRISM's agent steps aside
// on the same count (policy/prism, aside-depth); whether it stood aside
// at the end of the repeat, inside its measured window while the
// background still ran, is prism_aside_at_end.

// nicMeter counts the polls of one device's NAPI instances.
type nicMeter struct {
	c     *cpuload.NICCounter
	start []cpuload.NICCount
	core  int
}

// startNICPolls begins counting the polls of dev (in netns) on core; nil
// when the kernel cannot (no tracing programs, NAPI instances not listed,
// or the device polls without NAPI): the repeat then records no depth.
// It counts polls alone, so it adds no tracing on task switches to any
// mode's measurement.
func startNICPolls(netns, dev string, core int) *nicMeter {
	ids, err := testbed.NAPIIDs(netns, dev)
	if err != nil || len(ids) == 0 {
		return nil
	}
	c, err := cpuload.NewNICCounter(ids)
	if err != nil {
		return nil
	}
	start, err := c.Read()
	if err != nil {
		c.Close()
		return nil
	}
	return &nicMeter{c: c, start: start, core: core}
}

// stop ends the count: the frames per poll on the core (0 with nothing
// polled), ok false when nothing was counted.
func (m *nicMeter) stop() (float64, bool) {
	if m == nil {
		return 0, false
	}
	defer m.c.Close()
	end, err := m.c.Read()
	if err != nil || m.core >= len(end) {
		return 0, false
	}
	return cpuload.Since(m.start, end, m.core).FramesPerPoll(), true
}

// depthNote says, per point, the median frames per NIC poll of each mode
// and in how many repeats PRISM stood aside at the end: "" if no repeat
// counted the NIC's polls.
func depthNote(runs []results.Run) string {
	type key struct{ point, mode string }
	depth := map[key][]float64{}
	aside, asideOf := map[key]int{}, map[key]int{}
	var points []string
	modes := map[string][]string{}
	for _, r := range runs {
		d, ok := r.Extra["nic_frames_per_poll"]
		if !ok {
			continue
		}
		p := point{workload: r.Workload, proto: r.Proto, msgSize: r.MsgSize, flows: r.Flows, background: r.Background, rate: r.Rate, awake: r.Awake}.String()
		k := key{p, r.Mode}
		if !slices.Contains(points, p) {
			points = append(points, p)
		}
		if !slices.Contains(modes[p], r.Mode) {
			modes[p] = append(modes[p], r.Mode)
		}
		depth[k] = append(depth[k], d)
		if a, ok := r.Extra["prism_aside_at_end"]; ok {
			asideOf[k]++
			if a == 1 {
				aside[k]++
			}
		}
	}
	if len(points) == 0 {
		return ""
	}
	var parts []string
	for _, p := range points {
		var ms []string
		for _, m := range modes[p] {
			k := key{p, m}
			st := results.Summarize(depth[k])
			s := fmt.Sprintf("%s %.2f [%.2f-%.2f]", m, st.Median, st.Min, st.Max)
			if asideOf[k] > 0 {
				s += fmt.Sprintf(" (aside at the end of %d of %d)", aside[k], asideOf[k])
			}
			ms = append(ms, s)
		}
		parts = append(parts, p+": "+strings.Join(ms, ", "))
	}
	return "Frames each poll of the receiving NIC on the IRQ core found waiting, median of the repeats (nic_frames_per_poll; bench/nicpoll.go): about one means a marked frame found no queue for PRISM to take away; PRISM's agent steps aside under its aside-depth. " + strings.Join(parts, "; ") + "."
}
