package bench

import (
	"bufio"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/internal/kver"
	"github.com/lanesnet/lanes/testbed"
)

// Version is set by the CLI (from the build info).
var Version = "dev"

func machine(tb *testbed.Testbed) results.Machine {
	m := results.Machine{
		CPUs:     runtime.NumCPU(),
		Topology: string(tb.Config.Topology),
		Overlay:  tb.Config.Overlay,
		IRQCPU:   tb.Config.IRQCPU,
		NIC:      tb.Config.NIC,
		GoVer:    runtime.Version(),
		LanesVer: Version,
	}
	poll := tb.Config.PollCPU(0)
	m.SenderPollCPU = &poll
	m.Hostname, _ = os.Hostname()
	m.Kernel, _ = kver.Release()
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemGiB = int((uint64(si.Totalram)*uint64(si.Unit) + 1<<29) >> 30)
	}
	return m
}
