package prism_test

import (
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/topology/topotest"
)

// hop=backlog goes into the datapath's config where its fast moves can
// run (the NIC polled on the receive core alone), with a note; elsewhere
// it is refused in one line, nothing planned. Off by default.
func TestPlanHopBacklog(t *testing.T) {
	p, err := plan.Lookup("prism-batch")
	if err != nil {
		t.Fatal(err)
	}
	setupOf := func(params map[string]string) (steer.Setup, []string, error) {
		t.Helper()
		pl, err := p.Plan(topotest.Receiver(), plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}, Params: params})
		if err != nil {
			return steer.Setup{}, nil, err
		}
		for _, c := range pl.Changes {
			if _, ok := c.Knob.(*steer.DatapathKnob); ok {
				s, err := steer.DecodeSetup(string(c.Value))
				return s, pl.Notes, err
			}
		}
		t.Fatal("no datapath in the plan")
		return steer.Setup{}, nil, nil
	}
	if s, _, err := setupOf(nil); err != nil || s.Config.HopBacklog {
		t.Errorf("defaults: hop backlog %v (%v), want off", s.Config.HopBacklog, err)
	}
	s, notes, err := setupOf(map[string]string{"x-hop": "backlog"})
	if err != nil || !s.Config.HopBacklog || !s.Config.PrioIdleInline {
		t.Errorf("hop=backlog: config %+v (%v)", s.Config, err)
	}
	if !strings.Contains(strings.Join(notes, "\n"), "x-hop=backlog") {
		t.Errorf("notes %q do not say what hop=backlog does", notes)
	}
	// Receive core 0, NIC polled on 1: no fast moves.
	if _, _, err := setupOf(map[string]string{"x-hop": "backlog", "cpu": "0"}); err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "drop x-hop=backlog") {
		t.Errorf("hop=backlog off the NIC's core: %v, want one line refusing it", err)
	}
}
