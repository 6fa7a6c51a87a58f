package control

import (
	"errors"
	"fmt"
	"slices"

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
		return nil, noPrio(fmt.Sprintf("no prism mode applied to %s: run lanes apply --mode prism (or falcon-prism) first", target))
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
		return nil, noPrio(fmt.Sprintf("the mode applied to %s has no priority classes: apply --mode prism, prism-batch, prism-sync or falcon-prism to use lanes prio", target))
	}
	return &PrioSet{d: d, target: target}, nil
}

func (p *PrioSet) Add(r steer.Rule) error      { return p.d.Prio().AddRule(r) }
func (p *PrioSet) Del(r steer.Rule) error      { return p.d.Prio().DelRule(r) }
func (p *PrioSet) List() ([]steer.Rule, error) { return p.d.Prio().Rules() }
func (p *PrioSet) Close() error                { return p.d.Close() }

// errNoPrio matches OpenPrio's error when the applied mode has no
// priority classes (or no mode is applied).
var errNoPrio = errors.New("no priority classes applied")

type noPrio string

func (e noPrio) Error() string        { return string(e) }
func (e noPrio) Is(target error) bool { return target == errNoPrio }

// SetPrio makes rules the whole of netns's high-priority set, as a
// configuration file's prio list is: it adds the rules missing, then
// removes those not in rules (added by hand, or by an earlier version of
// the file), and says which it added and removed. With no rules, a mode
// without priority classes has nothing to change.
func SetPrio(netns string, rules []steer.Rule) (added, removed []steer.Rule, err error) {
	p, err := OpenPrio(netns)
	if err != nil {
		if len(rules) == 0 && errors.Is(err, errNoPrio) {
			err = nil
		}
		return nil, nil, err
	}
	defer p.Close()
	have, err := p.List()
	if err != nil {
		return nil, nil, err
	}
	for _, r := range rules {
		if slices.Contains(have, r) || slices.Contains(added, r) {
			continue
		}
		if err := p.Add(r); err != nil {
			return added, removed, err
		}
		added = append(added, r)
	}
	for _, r := range have {
		if slices.Contains(rules, r) {
			continue
		}
		if err := p.Del(r); err != nil {
			return added, removed, err
		}
		removed = append(removed, r)
	}
	return added, removed, nil
}
