package metrics

import (
	"github.com/lanesnet/lanes/internal/kthread"
	"os"

	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/lanesnet/lanes/datapath/cpuload"
)

// This file holds the parsers of the /proc files a Snapshot reads. They take
// the file's bytes, not a path, so tests can feed them captured contents.

// CPUTimes is one "cpuN" line of /proc/stat, in USER_HZ ticks (the
// datapath's load sampler owns the parser).
type CPUTimes = cpuload.CPUTimes

// parseStat returns the per-CPU lines of /proc/stat keyed by CPU number.
func parseStat(b []byte) (map[int]CPUTimes, error) {
	return cpuload.ParseStat(bytes.NewReader(b))
}

// parseSoftirqs returns one row of /proc/softirqs (e.g. "NET_RX") keyed by
// CPU number. The header names the columns ("CPU0 CPU1 ..."), and the
// columns cover every possible CPU, online or not.
func parseSoftirqs(b []byte, row string) (map[int]uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20) // one column per CPU: lines grow with big machines
	var cpus []int
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if cpus == nil {
			for _, h := range f {
				n, err := strconv.Atoi(strings.TrimPrefix(h, "CPU"))
				if err != nil {
					return nil, fmt.Errorf("/proc/softirqs: bad header column %q", h)
				}
				cpus = append(cpus, n)
			}
			continue
		}
		if f[0] != row+":" {
			continue
		}
		out := make(map[int]uint64, len(cpus))
		for i, cpu := range cpus {
			if i+1 >= len(f) {
				break
			}
			v, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/softirqs %s: %w", row, err)
			}
			out[cpu] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("/proc/softirqs: no %s row", row)
}

// Softnet is one CPU's line of /proc/net/softnet_stat.
type Softnet struct {
	Processed   uint64 // packets taken off this CPU's backlog/NAPI
	Dropped     uint64 // packets dropped because the backlog queue was full
	TimeSqueeze uint64 // net_rx_action ran out of budget or time with work left
	ReceivedRPS uint64 // times this CPU was kicked (IPI) to process an RPS backlog
	FlowLimit   uint64 // packets dropped by the flow limit
}

// ReadSoftnet reads /proc/net/softnet_stat (per CPU, the same in every
// namespace).
func ReadSoftnet() (map[int]Softnet, error) {
	b, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		return nil, err
	}
	return parseSoftnet(b)
}

// parseSoftnet parses /proc/net/softnet_stat: one line per online CPU, all
// columns hex. Column layout (1-based) on current kernels:
//
//	1 processed  2 dropped  3 time_squeeze  4-8 zero (was fastroute)
//	9 zero (was cpu_collision)  10 received_rps  11 flow_limit_count
//	12 backlog length  13 CPU index  14 input_qlen  15 process_qlen
//
// Kernels before 5.10 stop at column 11 or 12 and have no CPU index; there
// the line number is the CPU, which is right only while all CPUs are online.
func parseSoftnet(b []byte) (map[int]Softnet, error) {
	out := make(map[int]Softnet)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 0; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 3 {
			return nil, fmt.Errorf("/proc/net/softnet_stat: short line %q", sc.Text())
		}
		col := func(i int) (uint64, error) { // 1-based, absent = 0
			if i > len(f) {
				return 0, nil
			}
			return strconv.ParseUint(f[i-1], 16, 64)
		}
		var s Softnet
		var err error
		for _, c := range []struct {
			i int
			p *uint64
		}{{1, &s.Processed}, {2, &s.Dropped}, {3, &s.TimeSqueeze}, {10, &s.ReceivedRPS}, {11, &s.FlowLimit}} {
			if *c.p, err = col(c.i); err != nil {
				return nil, fmt.Errorf("/proc/net/softnet_stat column %d: %w", c.i, err)
			}
		}
		cpu := line
		if len(f) >= 13 {
			idx, err := col(13)
			if err != nil {
				return nil, fmt.Errorf("/proc/net/softnet_stat CPU index: %w", err)
			}
			cpu = int(idx)
		}
		out[cpu] = s
	}
	return out, nil
}

// parseSNMP parses /proc/net/snmp and /proc/net/netstat, which share a
// layout: pairs of lines, "Prefix: Name1 Name2 ..." then "Prefix: v1 v2 ...".
// Keys are prefix+name as nstat spells them: "TcpRetransSegs",
// "TcpExtTCPOFOQueue", "UdpRcvbufErrors". Values are added into m.
// Negative values (Tcp MaxConn is -1) are skipped: they are not counters.
func parseSNMP(b []byte, m map[string]uint64) error {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	var hdr []string
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if hdr == nil || hdr[0] != f[0] {
			hdr = f
			continue
		}
		if len(f) != len(hdr) {
			return fmt.Errorf("snmp: %s has %d names and %d values", f[0], len(hdr), len(f))
		}
		prefix := strings.TrimSuffix(f[0], ":")
		for i := 1; i < len(f); i++ {
			v, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				continue
			}
			m[prefix+hdr[i]] = v
		}
		hdr = nil
	}
	return nil
}

// DevStats is a device's receive side of /proc/net/dev.
type DevStats struct {
	RxBytes, RxPackets, RxErrors, RxDropped uint64
}

// parseNetDev parses /proc/net/dev. Its rx "drop" column is the kernel's
// rx_dropped + rx_missed_errors: what `ip -s link` calls dropped + missed.
func parseNetDev(b []byte) (map[string]DevStats, error) {
	out := make(map[string]DevStats)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.Contains(name, "|") { // the two header lines
			continue
		}
		// Interface names cannot contain ':', so the first one ends the
		// name even when a large counter leaves no space after it.
		f := strings.Fields(rest)
		if len(f) < 4 {
			return nil, fmt.Errorf("/proc/net/dev: short line %q", sc.Text())
		}
		var v [4]uint64
		for i := range v {
			var err error
			if v[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
				return nil, fmt.Errorf("/proc/net/dev %s: %w", name, err)
			}
		}
		out[strings.TrimSpace(name)] = DevStats{RxBytes: v[0], RxPackets: v[1], RxErrors: v[2], RxDropped: v[3]}
	}
	return out, nil
}

// procStat is what a Snapshot keeps of /proc/<pid>/stat.
type procStat = kthread.ProcStat
