// Package cpuset reads and writes sets of cores in the kernel's two
// notations, a list ("0-3,6", as in /sys/devices/system/cpu/online and
// taskset -c) and a hex bitmap ("00000000,00000003", as in rps_cpus and
// /proc/irq/N/smp_affinity), and checks a set against the cores online.
package cpuset

import (
	"fmt"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"strings"
)

// MaxCPU bounds CPU numbers accepted from users and files; it matches the
// kernel's largest NR_CPUS so a typo such as 1000000 fails early.
const MaxCPU = 8192

// ParseList parses the kernel's CPU list format ("0-3,6,8-9", as in
// /sys/devices/system/cpu/online and taskset -c). Whitespace around the list
// is ignored. The result is sorted and free of duplicates.
func ParseList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("empty CPU list: give cores like 0-3,6")
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parseCPU(lo)
		if err != nil {
			return nil, fmt.Errorf("bad CPU list %q: %q %w", s, part, err)
		}
		b := a
		if isRange {
			if b, err = parseCPU(hi); err != nil {
				return nil, fmt.Errorf("bad CPU list %q: %q %w", s, part, err)
			}
			if b < a {
				return nil, fmt.Errorf("bad CPU list %q: range %q runs backwards: write %d-%d", s, part, b, a)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func parseCPU(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("is not a core number or range (like 2 or 0-3)")
	}
	if n >= MaxCPU {
		return 0, fmt.Errorf("names core %d, beyond any machine (max %d)", n, MaxCPU-1)
	}
	return n, nil
}

// FormatList is the inverse of ParseList, with ranges collapsed.
// cpus must be sorted.
func FormatList(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", cpus[i], cpus[j])
		} else {
			fmt.Fprintf(&b, "%d", cpus[i])
		}
		i = j + 1
	}
	return b.String()
}

// ParseMask parses the kernel's hex CPU bitmap format (rps_cpus,
// /proc/irq/N/smp_affinity): comma-separated 32-bit hex words, most
// significant first, e.g. "00000000,00000003".
func ParseMask(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("empty CPU mask")
	}
	words := strings.Split(s, ",")
	var out []int
	for i, w := range words {
		if w == "" || len(w) > 8 {
			return nil, fmt.Errorf("bad CPU mask %q: each comma-separated word is 1-8 hex digits", s)
		}
		v, err := strconv.ParseUint(w, 16, 32)
		if err != nil {
			return nil, fmt.Errorf("bad CPU mask %q: %q is not hex", s, w)
		}
		base := 32 * (len(words) - 1 - i)
		for v != 0 {
			bit := bits.TrailingZeros64(v)
			out = append(out, base+bit)
			v &^= 1 << bit
		}
	}
	slices.Sort(out)
	return out, nil
}

// FormatMask formats cpus in the kernel's hex bitmap format, without
// leading zero words ("3", "1,00000000"); an empty set is "0", which for
// rps_cpus means RPS off.
func FormatMask(cpus []int) string {
	if len(cpus) == 0 {
		return "0"
	}
	words := make([]uint32, slices.Max(cpus)/32+1)
	for _, c := range cpus {
		words[c/32] |= 1 << (c % 32)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%x", words[len(words)-1])
	for i := len(words) - 2; i >= 0; i-- {
		fmt.Fprintf(&b, ",%08x", words[i])
	}
	return b.String()
}

// Online returns the CPUs the kernel has online.
func Online() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, fmt.Errorf("reading online CPUs: %w", err)
	}
	return ParseList(string(b))
}

// Check returns an error naming the first CPU in cpus that is not online.
func Check(cpus []int) error {
	online, err := Online()
	if err != nil {
		return err
	}
	if len(cpus) == 0 {
		return fmt.Errorf("no CPUs given: give cores like %s", FormatList(online))
	}
	for _, c := range cpus {
		if !slices.Contains(online, c) {
			return fmt.Errorf("core %d is not online: this machine has cores %s", c, FormatList(online))
		}
	}
	return nil
}
