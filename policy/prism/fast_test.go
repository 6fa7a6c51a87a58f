package prism_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/prism"
	"github.com/lanesnet/lanes/topology/topotest"
)

// x-fast=true runs the fast path beside PRISM's classes: the datapath is
// loaded with it, its program comes first on the underlay's tc ingress
// (before the classes' count of their queues), and its agent runs beside
// PRISM's. Beside sync's shortcut it is refused.
func TestPlanFast(t *testing.T) {
	p, err := plan.Lookup("prism-batch")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := p.Plan(topotest.Receiver(), plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}, Params: map[string]string{"x-fast": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pl.Agent, "fast") {
		t.Errorf("agent %q, want the fast path's among them", pl.Agent)
	}
	var in []string
	for _, c := range pl.Changes {
		switch k := c.Knob.(type) {
		case *steer.DatapathKnob:
			s, err := steer.DecodeSetup(string(c.Value))
			if err != nil || !s.Config.Fast || !s.Config.FastBeside {
				t.Errorf("datapath %+v, %v: want the fast path on, beside PRISM", s.Config, err)
			}
		case *attach.TCX:
			if k.Device == "ul2" && k.Direction == "ingress" {
				in = append(in, k.Prog[strings.LastIndex(k.Prog, "/")+1:])
			}
		}
	}
	if want := []string{steer.PinTCFast, steer.PinTCSplitSeen}; !slices.Equal(in, want) {
		t.Errorf("underlay tc ingress: %v, want %v", in, want)
	}
	if _, err := prism.Parse(prism.Defaults(), map[string]string{"x-fast": "true", "prio-mode": "sync"}); err == nil || !strings.Contains(err.Error(), "drop one of them") {
		t.Errorf("x-fast=true with prio-mode=sync: %v, want a refusal", err)
	}
}
