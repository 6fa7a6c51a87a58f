package cpuload

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// The parsers take the files' contents rather than paths so that tests can
// feed them captured /proc text.

// CPUTimes is one "cpuN" line of /proc/stat, in USER_HZ ticks. It is the
// one /proc/stat reading of lanes: the benchmark's metrics and `lanes
// status` use it too.
type CPUTimes struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

// Total is every tick the CPU spent. It leaves out guest and guest_nice:
// the kernel already counts them in user and nice, so adding them would
// count them twice.
func (t CPUTimes) Total() uint64 {
	return t.User + t.Nice + t.System + t.Idle + t.IOWait + t.IRQ + t.SoftIRQ + t.Steal
}

// ReadStat reads the per-CPU lines of /proc/stat.
func ReadStat() (map[int]CPUTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseStat(f)
}

// ParseStat returns the per-CPU lines of /proc/stat keyed by CPU number.
// Offline CPUs have no line, so the numbers need not be contiguous.
func ParseStat(r io.Reader) (map[int]CPUTimes, error) {
	out := make(map[int]CPUTimes)
	sc := bufio.NewScanner(r)
	// The "intr" line has one column per interrupt and outgrows the default
	// 64 KiB limit on big machines; the buffer still starts small and
	// grows only as far as a line needs.
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "cpu") || strings.HasPrefix(line, "cpu ") {
			continue
		}
		f := strings.Fields(line)
		cpu, err := strconv.Atoi(strings.TrimPrefix(f[0], "cpu"))
		if err != nil || cpu < 0 {
			continue
		}
		if len(f) < 5 { // user nice system idle are always there
			return nil, fmt.Errorf("/proc/stat: short line %q", line)
		}
		var v [8]uint64
		for i := range v {
			if i+1 >= len(f) {
				break // iowait, irq, softirq and steal came later; absent means 0
			}
			if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
				return nil, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
		}
		out[cpu] = CPUTimes{User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4], IRQ: v[5], SoftIRQ: v[6], Steal: v[7]}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/proc/stat: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("/proc/stat: no per-CPU lines")
	}
	return out, nil
}

// parsePIDList parses a whitespace-separated pid list such as
// /proc/2/task/2/children.
func parsePIDList(s string) ([]int, error) {
	var out []int
	for _, w := range strings.Fields(s) {
		pid, err := strconv.Atoi(w)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("pid list: bad pid %q", w)
		}
		out = append(out, pid)
	}
	return out, nil
}
