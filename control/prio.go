package control

import (
	"fmt"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
)

// PrioSet is a target's high-priority set (PRISM's IP/port database). It
// lives in the pinned datapath's map, so it takes effect on the next
// packet, outlives the lanes process that changed it, and goes with
// `lanes reset`, which removes the datapath.
type PrioSet struct {
	d      *steer.Datapath
	target string
}

// OpenPrio opens the high-priority set of netns's applied mode. It fails
// with a one-line fix when no mode with priority classes is applied.
func OpenPrio(netns string) (*PrioSet, error) {
	dir := plan.PinDir(netns)
	target := plan.Target(netns)
	if !steer.Pinned(dir) {
		return nil, fmt.Errorf("no prism mode applied to %s: run lanes apply --mode prism (or falcon-prism) first", target)
	}
	d, err := steer.Open(dir)
	if err != nil {
		return nil, err
	}
	cfg, err := d.Config()
	if err != nil {
		d.Close()
		return nil, err
	}
	if !cfg.Prio {
		d.Close()
		return nil, fmt.Errorf("the mode applied to %s has no priority classes: apply --mode prism, prism-batch, prism-sync or falcon-prism to use lanes prio", target)
	}
	return &PrioSet{d: d, target: target}, nil
}

func (p *PrioSet) Add(r steer.Rule) error      { return p.d.Prio().AddRule(r) }
func (p *PrioSet) Del(r steer.Rule) error      { return p.d.Prio().DelRule(r) }
func (p *PrioSet) List() ([]steer.Rule, error) { return p.d.Prio().Rules() }
func (p *PrioSet) Close() error                { return p.d.Close() }
