package testbed

import (
	"fmt"

	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/napi"
)

// NAPIThreads returns the NAPI poller kthreads of dev in netns, as the
// kernel maps them (device -> NAPI id -> pid).
func NAPIThreads(netns, dev string) ([]kthread.Thread, error) {
	idx, err := ifindex(netns, dev)
	if err != nil {
		return nil, err
	}
	inst, err := napi.List(netns, idx)
	if err != nil {
		return nil, err
	}
	var out []kthread.Thread
	for _, in := range inst {
		if in.PID == 0 {
			continue
		}
		out = append(out, kthread.Thread{PID: in.PID, Comm: fmt.Sprintf("napi/%s-%d", dev, in.ID)})
	}
	return out, nil
}

// NAPIIDs returns the ids of dev's NAPI instances in netns, sorted.
func NAPIIDs(netns, dev string) ([]uint32, error) {
	idx, err := ifindex(netns, dev)
	if err != nil {
		return nil, err
	}
	return napi.IDs(netns, idx)
}

func ifindex(netns, dev string) (int, error) {
	nh, closeH, err := handle(netns)
	if err != nil {
		return 0, err
	}
	defer closeH()
	l, err := nh.LinkByName(dev)
	if err != nil {
		return 0, fmt.Errorf("%s in %s: %w", dev, netns, err)
	}
	return l.Attrs().Index, nil
}
