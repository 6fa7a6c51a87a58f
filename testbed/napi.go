package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lanesnet/lanes/datapath/napi"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/nsx"
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

// killInside kills every process whose network namespace is ns, so a
// workload left over from a crashed run cannot keep the namespace alive.
func killInside(ns string) {
	var target syscall.Stat_t
	if err := syscall.Stat(nsx.Path(ns), &target); err != nil {
		return
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			continue
		}
		if st.Ino == target.Ino && st.Dev == target.Dev {
			var pid int
			if _, err := fmt.Sscan(filepath.Base(filepath.Dir(filepath.Dir(p))), &pid); err == nil && pid != os.Getpid() {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// waitExited waits (bounded) for the given kthreads to exit. Namespace
// teardown runs asynchronously in the kernel; until it ends the deleted
// devices' NAPI pollers still exist, and "down leaves nothing behind" and an
// immediate "up" both need them gone.
func waitExited(pids []int) {
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
