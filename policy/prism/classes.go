package prism

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/topology"
)

// PRISM's classes as another policy composes them. A mode that places the
// first stage itself (falcon-prism: a queue per class on every core
// Falcon's table may put a flow's first stage on) takes from PRISM where
// each class runs at that stage's home, the IRQ core: high=auto's switch
// between the high queue and the NIC poll, bulk=auto, bulk-quiet, and the
// high queue's priority. One parser, one planner step and one agent for
// both: prism's own modes run the same code (Parse, autoClasses, the
// switch in guard.go).

// classKeys are the settings Classes takes.
var classKeys = []string{"high", "high-rt", "high-auto-pps", "bulk-quiet", "bulk"}

// ClassKey says whether k is one of the settings Classes takes, which a
// composing mode's parser leaves to ParseClasses.
func ClassKey(k string) bool { return slices.Contains(classKeys, k) }

// HighAgentName is the agent of high=auto's switch alone, which a
// composing mode runs beside its own (plan.Agents).
const HighAgentName = "prism-high"

func init() {
	plan.RegisterAgent(HighAgentName, func(env plan.AgentEnv) (plan.Agent, error) {
		g := &guard{env: env, rule: guardRule, core: -1, high: newHighSwitch(plan.PinDir(env.NetNS))}
		g.status.High = g.high.status()
		return guardAgent{g}, nil
	})
}

// ClassParams are the settings a composing mode takes from PRISM, as PRISM
// documents them: the composing mode has a queue per class everywhere, so
// neither class runs inline there for good.
func ClassParams() []plan.Param {
	var out []plan.Param
	for _, q := range params {
		if ClassKey(q.Key) {
			if rest, ok := strings.CutPrefix(q.Help, "with "); ok {
				q.Help = "with prio and " + rest
			} else {
				q.Help = "with prio: " + q.Help
			}
			switch q.Key {
			case "high":
				q.Default = "auto (queue where the NIC is not polled on the IRQ core alone, or its GRO merges inner UDP)"
				q.Help = "with prio: where high-priority frames whose first stage is at home (the IRQ core) run it: queue (their real-time cpumap kthread) or auto (lanes agent runs a rule's flows in the NIC poll while they carry at least high-auto-pps frames/s, in their queue otherwise)"
			case "high-rt":
				q.Default = "53"
				q.OldKeys = []string{"prio-rt"}
				q.Help = "with prio: SCHED_FIFO priority of the high-priority queues' kthreads (1-99, above rt)"
			case "bulk":
				q.Help = "with prio: where bulk frames whose first stage is at home run it while flows are marked: queue, or auto (with high=auto: the NIC poll while every high-priority frame of the last " + BulkAutoWindow.String() + " ran there as a busy rule's)"
			}
			out = append(out, q)
		}
	}
	return out
}

// Classes are PRISM's class settings in a composing mode: parsed by
// Parse with PRISM's defaults, and the keys as given, which the composing
// mode's saved settings hold (a default and the same value given differ:
// high-auto-pps given implies high=auto, given).
type Classes struct {
	o     Options
	given map[string]string
}

// ParseClasses reads Classes' keys of m (the others are the caller's).
// Every error is one line.
func ParseClasses(m map[string]string) (Classes, error) {
	given := map[string]string{}
	for _, k := range classKeys {
		if v, ok := m[k]; ok {
			given[k] = v
		}
	}
	for _, k := range []string{"high", "bulk"} {
		if given[k] == HighInline {
			return Classes{}, fmt.Errorf("prism %s=inline has no queue for the class, and a composed mode queues both classes wherever their first stage runs: use %s=queue or auto", k, k)
		}
	}
	if v, ok := given["high-rt"]; ok && v == "0" {
		return Classes{}, fmt.Errorf("bad prism setting high-rt=0: want a real-time priority from 1 to 99 (the bulk queues run at rt)")
	}
	sub := maps.Clone(given)
	// The bulk queues are the composing mode's (their priority its own):
	// nothing of PRISM's bulk-sched applies.
	sub["bulk-sched"] = SchedNormal
	o, err := Parse(Defaults(), sub)
	if err != nil {
		return Classes{}, err
	}
	o.composed = true
	// Stepping aside is PRISM's own modes': in a composed mode bulk's
	// placement is the composing mode's, not bulk=auto's alone.
	o.AsideBelow, o.AsideDepth = 0, 0
	if len(given) == 0 {
		given = nil
	}
	return Classes{o: o, given: given}, nil
}

// DefaultClasses are Classes with nothing given.
func DefaultClasses() Classes {
	c, err := ParseClasses(nil)
	if err != nil {
		panic("prism: default classes: " + err.Error())
	}
	return c
}

// Params are the settings as given.
func (c Classes) Params() map[string]string { return maps.Clone(c.given) }

// HighRT is the high-priority queues' SCHED_FIFO priority.
func (c Classes) HighRT() int { return c.o.Ladder().High }

// Compose writes the classes' run-time placement into setup, a datapath
// with both classes' queues on home (the IRQ core) among others:
// high=auto and bulk=auto where a flow moves between home's NIC poll and
// its queues at once (setup.Config.PrioIdleInline, InlineCPU home),
// otherwise the queues with a note (or an error for a setting given). It
// returns the agent the plan needs beside the composing mode's own
// (HighAgentName, or "").
func (c Classes) Compose(setup *steer.Setup, t *topology.Topology, irqCPUs []int, home int, pl *plan.Plan) (string, error) {
	o := c.o
	on, err := o.autoClasses(setup, t, irqCPUs, home, pl)
	if err != nil || !on {
		return "", err
	}
	return HighAgentName, nil
}

// autoClasses resolves high=auto and bulk=auto against what setup allows:
// they move a flow between the NIC poll and the queues of core, the one
// core the NIC is polled on, which only setup.Config.PrioIdleInline makes
// order-safe. A default that cannot run falls back to the queues with a
// note; a setting given is an error. It writes the settings into setup's
// config and says whether high=auto's switch must run (lanes agent).
func (o *Options) autoClasses(setup *steer.Setup, t *topology.Topology, irqCPUs []int, core int, pl *plan.Plan) (bool, error) {
	if o.High == HighAuto && !setup.Config.PrioIdleInline {
		why := plan.FastMoveBlocked(t, irqCPUs, core)
		if why == "" {
			why = "bulk flows do not run in the NIC poll while no flow is marked (x-bulk-inline=false)"
		}
		if !o.highDefault {
			other := "use high=queue or high=inline"
			if o.composed {
				other = "use high=queue"
			}
			return false, fmt.Errorf("prism high=auto%s moves high-priority flows between their queue and the NIC poll, which is order-safe only where the NIC is polled on %s alone and merges no inner UDP, and %s: %s, or fix that", o.highBy, receiveCore(core), why, other)
		}
		// Not given: the queue, as before auto existed.
		o.High = HighQueue
		also := ""
		if o.bulkDefault && o.Bulk == BulkAuto {
			also = ", and bulk its queue (bulk=queue)"
		}
		pl.Notes = append(pl.Notes, fmt.Sprintf("high=auto (the default) needs the NIC polled on %s alone and no inner UDP merged, and %s: the high-priority class keeps its queue (high=queue)%s", receiveCore(core), why, also))
	}
	if o.Bulk == BulkAuto && o.High != HighAuto {
		if !o.bulkDefault {
			return false, fmt.Errorf("prism bulk=auto follows high=auto's busy rules, and high=auto cannot run here (%s): use bulk=queue", plan.FastMoveBlocked(t, irqCPUs, core))
		}
		o.Bulk = BulkQueue // the default follows high back to queue
	}
	if o.Bulk == BulkAuto {
		setup.Config.BulkAuto = BulkAutoWindow
		pl.Notes = append(pl.Notes, fmt.Sprintf("bulk=auto: bulk flows run in the NIC poll while every high-priority frame of the last %v ran there as a busy rule's (no marked frame queued: the bulk queue's hop preempts nothing then); the first marked frame that takes its queue sends them back to the bulk queue, in order, and it and those right behind it find bulk still in the NIC poll", BulkAutoWindow))
	}
	if o.High != HighAuto {
		return false, nil
	}
	// The threshold goes into the datapath's config, which the agent
	// follows: a re-apply with other settings takes effect there.
	setup.Config.HighAutoPPS = uint32(o.HighAutoPPS)
	setup.Config.BulkQuiet = o.BulkQuiet
	if o.Bulk == BulkAuto && !o.composed {
		setup.Config.AsideBelow = uint32(o.AsideBelow)
		setup.Config.AsideDepth = uint32(math.Round(o.AsideDepth * 100))
	}
	pl.Notes = append(pl.Notes, fmt.Sprintf("high=auto: run `lanes agent`, which runs the flows of each priority rule in the NIC poll while they carry at least %d frames/s and in their queue otherwise; until it runs, they take their queue%s%s", o.HighAutoPPS, bulkQuietNote(*o), asideNote(*o)))
	return true, nil
}

// receiveCore names the core high=auto moves flows on, for messages (-1:
// a composing mode that does not know the IRQ core).
func receiveCore(core int) string {
	if core < 0 {
		return "one known core (the IRQ core is unknown)"
	}
	return fmt.Sprintf("the receive core (%d)", core)
}
