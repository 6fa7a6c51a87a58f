package prism_test

import (
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/kthread"
	_ "github.com/lanesnet/lanes/policy/prism"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
)

// threadedCells is a docker host whose VXLAN device runs threaded NAPI
// (a GRO cell thread per core) and whose underlay is polled on core 1.
func threadedCells() *topology.Topology {
	t := topotest.Receiver()
	v := &t.VXLANs[0]
	v.Threaded, v.NAPIByName = "1", true
	v.NAPIThreads = []kthread.Info{{PID: 20, Comm: "napi/vxlan0-0"}, {PID: 21, Comm: "napi/vxlan0-0", Index: 1}}
	return t
}

// A GRO cell's thread must run on the core that fills its cell: prism pins
// the cells' threads to its receive core only when the NIC poll, which
// decapsulates bulk frames inline, runs there too; and every mode warns
// that threaded NAPI on a VXLAN device is unsafe.
func TestGROCellThreadsPinnedOnlyWhereFilled(t *testing.T) {
	p, err := plan.Lookup("prism-batch")
	if err != nil {
		t.Fatal(err)
	}
	// cellKnobs counts the plan's affinity and scheduling changes to the
	// cells' threads.
	cellKnobs := func(params map[string]string) (pins, scheds int, notes []string) {
		t.Helper()
		pl, err := p.Plan(threadedCells(), plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}, Params: params})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range pl.Changes {
			switch k := c.Knob.(type) {
			case *knobs.KthreadAffinity:
				if k.Comm == "napi/vxlan0-0" {
					pins++
				}
			case *knobs.KthreadSched:
				if k.Comm == "napi/vxlan0-0" {
					scheds++
				}
			}
		}
		return pins, scheds, pl.Notes
	}
	if pins, scheds, _ := cellKnobs(map[string]string{"streamline": "true"}); pins != 2 || scheds != 2 {
		t.Errorf("receive core = NIC poll's core: %d GRO cell threads pinned, %d on the ladder, want 2 and 2", pins, scheds)
	}
	pins, scheds, notes := cellKnobs(map[string]string{"cpu": "0", "streamline": "true"})
	if pins != 0 || scheds != 0 {
		t.Errorf("receive core 0, NIC poll on 1: %d GRO cell threads pinned, %d real-time, want none", pins, scheds)
	}
	if !strings.Contains(strings.Join(notes, "\n"), "GRO cell threads left alone") {
		t.Errorf("no note on the cells left alone: %q", notes)
	}
	if w := plan.GROCellNotes(threadedCells()); len(w) != 1 || !strings.Contains(w[0], "threaded NAPI is on") {
		t.Errorf("warnings %q, want one for vxlan0", w)
	}
	plain := threadedCells()
	plain.VXLANs[0].Threaded = "0"
	if w := plan.GROCellNotes(plain); len(w) != 0 {
		t.Errorf("warnings %q for a VXLAN device without threaded NAPI", w)
	}
}
