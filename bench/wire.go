package bench

import (
	"fmt"
	"os"
	"strings"

	"github.com/lanesnet/lanes/internal/nsx"
)

// wireDrops reads tx_dropped of the sending underlay veth. A veth that
// cannot queue a frame on its peer's ring (the receiver's NAPI fell
// behind) counts the drop on the sender's tx side; a real NIC would count
// the same event as a receive ring overflow, so the runner adds it to the
// receiving NIC's drops.
func wireDrops(netns, dev string) (uint64, error) {
	var b []byte
	err := nsx.Do(netns, func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/dev")
		return
	})
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != dev {
			continue
		}
		f := strings.Fields(rest)
		// rx: bytes packets errs drop fifo frame compressed multicast,
		// tx: bytes packets errs drop ...
		if len(f) < 12 {
			break
		}
		var v uint64
		_, err := fmt.Sscan(f[11], &v)
		return v, err
	}
	return 0, fmt.Errorf("%s not found in netns %s", dev, netns)
}
