package prism

import (
	"fmt"
	"slices"
	"time"

	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/internal/napi"
	"github.com/lanesnet/lanes/topology"
)

// nicWatchEvery is how often the NIC's NAPI instances are listed again: a
// driver that switches NAPI on or off (a veth, when XDP comes or goes)
// makes new ones.
const nicWatchEvery = 5 * time.Second

// nicWatch keeps the guard's sampler counting the polls of the underlay
// NIC's NAPI instances, for aside-depth. The underlays are found once (the
// guard's own discovery where it made one: a topology discovery reads
// every namespace on the path, too costly to repeat); their NAPI ids are
// listed again every nicWatchEvery (one netlink dump a device). Where either fails the
// sampler counts nothing and stepping aside reads the receive work; it
// says so once.
type nicWatch struct {
	netns string
	logf  func(string, ...any)

	found bool
	devs  []topology.Device
	at    time.Time
	ids   []uint32
	said  string
}

// keep lists the NAPI instances when due and has src watch them, where
// it can (the scheduler-event sampler; /proc has no such count).
func (w *nicWatch) keep(src cpuload.Source, now time.Time) {
	s, ok := src.(*cpuload.SchedSampler)
	if !ok {
		w.say("high=auto: the load sampler reads /proc, which cannot count the NIC's polls: stepping aside reads the receive work")
		return
	}
	if !w.at.IsZero() && now.Sub(w.at) < nicWatchEvery {
		return
	}
	w.at = now
	ids, err := w.list()
	if err == nil {
		err = s.WatchNAPIs(ids)
	}
	switch {
	case err != nil:
		w.say(fmt.Sprintf("high=auto: cannot count the NIC's polls (%v): stepping aside reads the receive work", err))
	case len(ids) == 0:
		w.say("high=auto: the underlay NIC has no NAPI instance the kernel lists: stepping aside reads the receive work")
	default:
		if !slices.Equal(ids, w.ids) && w.logf != nil {
			w.logf("high=auto: counting the polls of the underlay NIC's NAPI instances %v", ids)
		}
		w.said = ""
	}
	w.ids = ids
}

func (w *nicWatch) say(msg string) {
	if msg != w.said && w.logf != nil {
		w.logf("%s", msg)
	}
	w.said = msg
}

// list returns the NAPI ids of every underlay device, sorted.
func (w *nicWatch) list() ([]uint32, error) {
	if !w.found {
		t, err := topology.Discover(w.netns)
		if err != nil {
			return nil, fmt.Errorf("finding the underlay: %w", err)
		}
		w.devs, w.found = t.Underlays, true
	}
	var ids []uint32
	for _, d := range w.devs {
		got, err := napi.IDs(d.NetNS, d.Index)
		if err != nil {
			return nil, fmt.Errorf("listing %s's NAPI instances: %w", d.Name, err)
		}
		ids = append(ids, got...)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}
