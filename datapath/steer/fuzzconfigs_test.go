//go:build linux

package steer_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	_ "github.com/lanesnet/lanes/policy/falcon"
	_ "github.com/lanesnet/lanes/policy/fast"
	_ "github.com/lanesnet/lanes/policy/mflow"
	_ "github.com/lanesnet/lanes/policy/prism"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
)

// The configs the fuzzers run (steer.PlannedSetups, fuzz_test.go) are the
// ones the modes' planners build: an external test package, since the
// planners import steer.
func init() { steer.PlannedSetups = plannedSetups }

// fuzzSettings are the settings each mode is planned with besides its
// defaults: every value of those that change what the datapath loads.
// Combinations a planner refuses are left out.
var fuzzSettings = map[string][]string{
	"split":         {"true", "false", "rps"},
	"prio":          {"true"},
	"spread":        {"always"},
	"x-stay":        {"queued"},
	"x-bulk-inline": {"false"},
	"at":            {"bridge"},
	"threshold":     {"0"},
	"reorder":       {"off"},
	"prio-mode":     {"sync"},
	"high":          {"queue", "inline", "auto"},
	"bulk":          {"queue", "inline", "auto"},
	"quiet":         {"20ms"},
	"veth-queues":   {"class"},
	"aside-below":   {"0"},
}

// plannedSetups plans every mode that loads the steer datapath on a
// receiving host like the testbed's (topotest.Receiver: the NIC polled on
// core 1, cores 0 and 1 allowed), with its defaults and with each of
// fuzzSettings and each pair of them, and returns the distinct setups.
func plannedSetups() ([]steer.NamedSetup, error) {
	var out []steer.NamedSetup
	seen := map[string]bool{}
	for _, mode := range plan.Modes() {
		p, err := plan.Lookup(mode)
		if err != nil {
			return nil, err
		}
		pp, ok := p.(plan.ParamPlanner)
		var keys []string
		if ok {
			for _, q := range pp.Params() {
				if _, ok := fuzzSettings[q.Key]; ok {
					keys = append(keys, q.Key)
				}
			}
		}
		for _, params := range settingSets(keys) {
			if plan.CheckParams(p, params) != nil {
				continue
			}
			for _, host := range fuzzHosts() {
				pl, err := p.Plan(host, plan.Config{CPUs: []int{0, 1}, Online: []int{0, 1}, Params: params})
				if err != nil {
					continue // a combination the mode refuses (here)
				}
				s, ok, err := setupOf(pl)
				if err != nil {
					return nil, fmt.Errorf("%s %v: %w", mode, params, err)
				}
				if !ok {
					continue // no steer datapath (vanilla, rps)
				}
				key, err := s.Encode()
				if err != nil {
					return nil, err
				}
				if !seen[key] {
					seen[key] = true
					out = append(out, steer.NamedSetup{Name: setupName(mode, params), Setup: s})
				}
			}
		}
	}
	return out, nil
}

// fuzzHosts are the receiving hosts planned on: the testbed's, and the
// same with two-queue container veths (prism veth-queues=class needs
// them).
func fuzzHosts() []*topology.Topology {
	mq := topotest.Receiver()
	for i := range mq.Veths {
		mq.Veths[i].MaxTxQueues, mq.Veths[i].MaxRxQueues = 2, 2
	}
	for i := range mq.Containers {
		for j := range mq.Containers[i].Interfaces {
			mq.Containers[i].Interfaces[j].MaxRxQueues, mq.Containers[i].Interfaces[j].MaxTxQueues = 2, 2
		}
	}
	return []*topology.Topology{topotest.Receiver(), mq}
}

// settingSets are no setting, each value of each key alone, and each pair
// of values of two keys.
func settingSets(keys []string) []map[string]string {
	sets := []map[string]string{{}}
	var singles []map[string]string
	for _, k := range keys {
		for _, v := range fuzzSettings[k] {
			singles = append(singles, map[string]string{k: v})
		}
	}
	sets = append(sets, singles...)
	for i, a := range singles {
		for _, b := range singles[i+1:] {
			pair := maps.Clone(a)
			for k, v := range b {
				if _, dup := pair[k]; dup {
					continue
				}
				pair[k] = v
			}
			if len(pair) == 2 {
				sets = append(sets, pair)
			}
		}
	}
	return sets
}

func setupName(mode string, params map[string]string) string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(params)) {
		kv = append(kv, k+"="+params[k])
	}
	return strings.Join(append([]string{mode}, kv...), " ")
}

// setupOf is the steer datapath a plan loads, if any.
func setupOf(pl *plan.Plan) (steer.Setup, bool, error) {
	for _, c := range pl.Changes {
		if c.Knob.Kind() == steer.KindDatapath {
			s, err := steer.DecodeSetup(string(c.Value))
			return s, true, err
		}
	}
	return steer.Setup{}, false, nil
}

// The planned setups cover what the modes load: several cores, splitting,
// priority classes with every way of placing them, the aside pass, sync,
// the veth classes and micro-flows at both points.
func TestPlannedSetupsCoverModes(t *testing.T) {
	setups, err := plannedSetups()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range setups {
		t.Logf("%s: %+v cpumap %v hi %v", s.Name, s.Setup.Config, s.Setup.CPUMap, s.Setup.HiCPUMap)
	}
	for what, has := range map[string]func(steer.Config) bool{
		"several cores":  func(c steer.Config) bool { return len(c.CPUs) > 1 },
		"split counting": func(c steer.Config) bool { return c.CountSplit && !c.Prio },
		"priority":       func(c steer.Config) bool { return c.Prio },
		"idle inline":    func(c steer.Config) bool { return c.PrioIdleInline && c.HighAutoPPS == 0 },
		"quiet":          func(c steer.Config) bool { return c.PrioQuiet != 0 },
		"high=auto":      func(c steer.Config) bool { return c.HighAutoPPS != 0 },
		"bulk=auto":      func(c steer.Config) bool { return c.BulkAuto != 0 },
		"aside":          func(c steer.Config) bool { return c.AsideBelow != 0 },
		"sync":           func(c steer.Config) bool { return c.Sync },
		"veth classes":   func(c steer.Config) bool { return c.VethClass },
		"mflow at irq":   func(c steer.Config) bool { return c.MFlow.At == steer.SplitAtIRQ },
		"mflow at bridge": func(c steer.Config) bool {
			return c.MFlow.At == steer.SplitAtBridge
		},
		"stay queued": func(c steer.Config) bool { return c.StayQueued },
	} {
		if !slices.ContainsFunc(setups, func(s steer.NamedSetup) bool { return has(s.Setup.Config) }) {
			t.Errorf("no planned setup has %s", what)
		}
	}
}
