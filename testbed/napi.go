package testbed

import (
	"fmt"

	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/napi"
)

// NAPIThreads returns the NAPI poller kthreads of dev in netns, as the
// kernel maps them (device -> NAPI id -> pid).
func NAPIThreads(netns, dev string) ([]kthread.Thread, error) {
	nh, closeH, err := handle(netns)
	if err != nil {
		return nil, err
	}
	defer closeH()
	l, err := nh.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("%s in %s: %w", dev, netns, err)
	}
	inst, err := napi.List(netns, l.Attrs().Index)
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
