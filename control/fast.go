package control

import (
	"fmt"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/topology"
)

// FastTable is a target's fast path into the container: its flows, which
// the datapath learns from the kernel's own path and lanes agent's lease
// keeps valid. Flushing it is always safe: each flow's next frame takes
// the kernel's path and, where that delivers it, teaches its entry again.
type FastTable struct {
	d      *steer.Datapath
	netns  string
	target string
}

// OpenFast opens the fast path of netns's applied mode. It fails with a
// one-line fix when no mode with the fast path is applied.
func OpenFast(netns string) (*FastTable, error) {
	dir := plan.PinDir(netns)
	target := plan.Target(netns)
	if !steer.Pinned(dir) {
		return nil, fmt.Errorf("no mode applied to %s: run lanes apply --mode fast first", target)
	}
	d, err := steer.Open(dir)
	if err != nil {
		return nil, err
	}
	cfg, err := d.Config()
	if err == nil && !cfg.Fast {
		err = fmt.Errorf("the mode applied to %s has no fast path: apply --mode fast (or another mode with --set x-fast=true) to use lanes fast", target)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	return &FastTable{d: d, netns: netns, target: target}, nil
}

func (f *FastTable) Close() error { return f.d.Close() }

// Flush deletes every entry and says how many there were.
func (f *FastTable) Flush() (int, error) { return f.d.Fast().Flush() }

// List names each valid entry for people: the flow, its VNI, the
// host-side veth it goes to (or, on the way out, comes from and the
// underlay it leaves by), and how long ago it was last used. Entries a
// change on the path voided (their next frame deletes them) are left out.
func (f *FastTable) List() ([]string, error) {
	t, err := topology.Discover(f.netns)
	if err != nil {
		return nil, err
	}
	return fastEntries(f.d, t, true)
}

// fastEntries names the valid entries of d, in ("flow vni N -> veth")
// then out ("out flow vni N veth -> underlay"), with how long ago each
// was used when used is set.
func fastEntries(d *steer.Datapath, t *topology.Topology, used bool) ([]string, error) {
	es, err := d.Fast().Entries()
	if err != nil {
		return nil, err
	}
	outs, err := d.Fast().OutEntries()
	if err != nil {
		return nil, err
	}
	changes, err := d.Changes()
	if err != nil {
		return nil, err
	}
	now := steer.Now()
	var out []string
	add := func(s string, last time.Duration) {
		if used {
			s += fmt.Sprintf(" (used %v ago)", max(now-last, 0).Round(time.Millisecond))
		}
		out = append(out, s)
	}
	for _, e := range es {
		if e.Changes == changes {
			add(fmt.Sprintf("%s vni %d -> %s", flowString(e.Src, e.SrcPort, e.Dst, e.DstPort, e.Proto), e.VNI, devName(t, int(e.Ifindex))), e.LastUsed)
		}
	}
	for _, e := range outs {
		if e.Changes == changes {
			add(fmt.Sprintf("out %s vni %d %s -> %s", flowString(e.Src, e.SrcPort, e.Dst, e.DstPort, e.Proto), e.VNI, devName(t, int(e.Veth)), devName(t, int(e.Underlay))), e.LastUsed)
		}
	}
	return out, nil
}
