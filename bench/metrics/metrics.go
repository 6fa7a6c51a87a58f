// Package metrics measures what a benchmark run cost the receiving host:
// the per-CPU time split, NET_RX softirqs, softnet and socket drops, TCP
// reordering and retransmit counters, and the CPU time of NAPI/cpumap
// kthreads.
//
// The runner takes a Snapshot right before a measurement and one right
// after, and Diff turns the pair into the per-run fields of results.Run:
//
//	cfg := metrics.Config{
//		RecvNS: []string{recvContainerNS},      // sockets that receive the data
//		SendNS: []string{sendContainerNS},      // the sender: retransmits, DSACKs
//		NICs:   []metrics.Dev{{NetNS: recvHostNS, Name: "eth0"}},
//	}
//	before, err := metrics.Take(cfg)
//	... run the workload ...
//	after, err := metrics.Take(cfg)
//	d := metrics.Diff(before, after)
//	d.Apply(&run)
//
// Everything is read from /proc: no tools are forked and no netlink sockets
// opened, so a snapshot is cheap enough to be taken inside the measured
// window without disturbing it.
package metrics

import (
	"github.com/lanesnet/lanes/internal/kthread"

	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"time"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/internal/nsx"
)

// Dev names a network device inside a namespace ("" = lanes' own).
type Dev struct {
	NetNS string
	Name  string
}

func (d Dev) String() string {
	if d.NetNS == "" {
		return d.Name
	}
	return d.NetNS + "/" + d.Name
}

// DefaultKthreads are the comm patterns (path.Match syntax) of the kernel
// threads that do receive work outside softirq accounting: threaded NAPI
// pollers ("napi/eth0-8193") and XDP cpumap workers ("cpumap/1/map:12").
var DefaultKthreads = []string{"napi/*", "cpumap/*"}

// Config says where a Snapshot reads its per-namespace counters. The
// per-CPU files (/proc/stat, /proc/softirqs, softnet_stat) are global and
// need no configuration.
type Config struct {
	// RecvNS are the namespaces whose sockets receive the workload's data
	// (the receiving container's; the host's for native). Out-of-order
	// queueing and socket drops are summed over them.
	RecvNS []string
	// SendNS are the sending side's namespaces: a TCP sender is where
	// retransmits and received DSACKs are counted.
	SendNS []string
	// NICs are the devices whose rx drops are summed into DropsNIC,
	// normally the receiving host's underlay device.
	NICs []Dev
	// Kthreads are comm patterns of kthreads to account; nil means
	// DefaultKthreads, an empty non-nil slice turns the scan off.
	Kthreads []string
}

// Snapshot is the state of the counters at one instant.
type Snapshot struct {
	At      time.Time
	CPU     map[int]CPUTimes
	NetRX   map[int]uint64
	Softnet map[int]Softnet
	// Kthreads maps pid to the accounted kthreads' CPU ticks and last CPU.
	Kthreads map[int]procStat
	// SNMP holds /proc/net/snmp and /proc/net/netstat of each namespace
	// named in the Config, keyed by namespace then nstat-style name.
	SNMP map[string]map[string]uint64
	Devs map[Dev]DevStats
	cfg  Config
}

// Take reads all counters. On error it still returns the snapshot with
// what it could read, so a run whose namespace vanished keeps its CPU
// numbers; missing parts diff to zero.
func Take(cfg Config) (*Snapshot, error) {
	s := &Snapshot{
		At:       time.Now(),
		Kthreads: map[int]procStat{},
		SNMP:     map[string]map[string]uint64{},
		Devs:     map[Dev]DevStats{},
		cfg:      cfg,
	}
	var errs []error
	if b, err := os.ReadFile("/proc/stat"); err != nil {
		errs = append(errs, err)
	} else if s.CPU, err = parseStat(b); err != nil {
		errs = append(errs, err)
	}
	if b, err := os.ReadFile("/proc/softirqs"); err != nil {
		errs = append(errs, err)
	} else if s.NetRX, err = parseSoftirqs(b, "NET_RX"); err != nil {
		errs = append(errs, err)
	}
	// softnet_stat is per CPU, not per namespace: any namespace shows it.
	if sn, err := ReadSoftnet(); err != nil {
		errs = append(errs, err)
	} else {
		s.Softnet = sn
	}
	pats := cfg.Kthreads
	if pats == nil {
		pats = DefaultKthreads
	}
	if len(pats) > 0 {
		if err := scanKthreads(pats, s.Kthreads); err != nil {
			errs = append(errs, err)
		}
	}

	// One trip into each namespace reads its SNMP files and its devices.
	devs := map[string][]string{}
	var order []string
	seen := map[string]bool{}
	add := func(ns string) {
		if !seen[ns] {
			seen[ns] = true
			order = append(order, ns)
		}
	}
	for _, ns := range cfg.RecvNS {
		add(ns)
	}
	for _, ns := range cfg.SendNS {
		add(ns)
	}
	for _, d := range cfg.NICs {
		add(d.NetNS)
		devs[d.NetNS] = append(devs[d.NetNS], d.Name)
	}
	for _, ns := range order {
		snmp := map[string]uint64{}
		var dev map[string]DevStats
		err := nsx.Do(ns, func() error {
			// /proc/thread-self/net is this thread's namespace by
			// definition; /proc/net (= /proc/self/net) has followed the
			// thread group leader's on some kernels.
			for _, f := range []string{"snmp", "netstat"} {
				b, err := os.ReadFile("/proc/thread-self/net/" + f)
				if err != nil {
					return err
				}
				if err := parseSNMP(b, snmp); err != nil {
					return err
				}
			}
			if len(devs[ns]) == 0 {
				return nil
			}
			b, err := os.ReadFile("/proc/thread-self/net/dev")
			if err != nil {
				return err
			}
			dev, err = parseNetDev(b)
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("netns %q: %w", ns, err))
			continue
		}
		s.SNMP[ns] = snmp
		for _, name := range devs[ns] {
			st, ok := dev[name]
			if !ok {
				errs = append(errs, fmt.Errorf("netns %q: no device %s", ns, name))
				continue
			}
			s.Devs[Dev{ns, name}] = st
		}
	}
	return s, errors.Join(errs...)
}

// scanKthreads reads /proc/<pid>/stat of every kernel thread whose comm
// matches one of pats. Kernel threads are children of kthreadd (pid 2) and
// have no threads of their own, so only top-level pids are looked at.
func scanKthreads(pats []string, out map[int]procStat) error {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited since ReadDir
		}
		ps, err := kthread.ParseProcStat(string(b))
		if err != nil || !ps.Kthread {
			continue
		}
		for _, p := range pats {
			if ok, _ := path.Match(p, ps.Comm); ok {
				out[pid] = ps
				break
			}
		}
	}
	return nil
}

// Delta is what changed between two snapshots.
type Delta struct {
	Elapsed time.Duration
	// CPU is the per-CPU split in percent of the CPU's ticks over the
	// window, with NET_RX counts and kthread time, sorted by CPU. Kthread
	// time is not a fifth share: the kernel accounts it (mostly) as system
	// time, so Kthreads overlaps System.
	CPU []results.CPUUse
	// Softnet is the per-CPU softnet_stat change.
	Softnet map[int]Softnet
	// Recv and Send are the SNMP counter changes summed over the receiving
	// and the sending namespaces.
	Recv, Send map[string]uint64
	// Devs is each configured device's change.
	Devs map[Dev]DevStats

	// The results.Run counters (see Apply).
	Retrans, OFO, DSACK, DropsSoftnet, DropsSocket, DropsNIC uint64
	TimeSqueeze, ReceivedRPS                                 uint64
}

// Counters whose sum is DropsSocket. UdpInErrors already includes
// UdpRcvbufErrors and UdpInCsumErrors (the kernel bumps InErrors with
// each), so adding them too would count a drop twice.
var socketDropCounters = []string{
	"UdpInErrors",
	"TcpExtTCPBacklogDrop",    // socket owned by user and backlog full
	"TcpExtTCPRcvQDrop",       // receive queue over rcvbuf
	"TcpExtTCPOFODrop",        // out-of-order queue over rcvbuf
	"TcpExtTCPZeroWindowDrop", // arrived while the window was zero
	"TcpExtPFMemallocDrop",
}

// Diff returns after minus before. Counters that went backwards (a
// namespace or device recreated in between) count as zero.
func Diff(before, after *Snapshot) Delta {
	d := Delta{
		Elapsed: after.At.Sub(before.At),
		Softnet: map[int]Softnet{},
		Recv:    map[string]uint64{},
		Send:    map[string]uint64{},
		Devs:    map[Dev]DevStats{},
	}

	// Kthread ticks by the CPU each thread last ran on. A thread that
	// moved CPUs in the window is charged wholly to its last one: an
	// approximation, but NAPI threads stay put unless the scheduler is
	// pushed hard.
	kt := map[int]uint64{}
	for pid, a := range after.Kthreads {
		b, ok := before.Kthreads[pid]
		if !ok || b.Comm != a.Comm {
			b = procStat{} // born in the window: all its time is ours
		}
		kt[a.CPU] += sub(a.Ticks, b.Ticks)
	}

	cpus := make([]int, 0, len(after.CPU))
	for c := range after.CPU {
		cpus = append(cpus, c)
	}
	sort.Ints(cpus)
	for _, c := range cpus {
		a, b := after.CPU[c], before.CPU[c]
		tot := float64(sub(a.Total(), b.Total()))
		u := results.CPUUse{CPU: c, NetRX: sub(after.NetRX[c], before.NetRX[c])}
		if tot == 0 {
			// An idle window too short for one tick: report the CPU idle
			// rather than dividing by zero.
			u.Idle = 100
		} else {
			pct := func(x, y uint64) float64 { return 100 * float64(sub(x, y)) / tot }
			u.SoftIRQ = pct(a.SoftIRQ, b.SoftIRQ)
			u.System = pct(a.System+a.IRQ, b.System+b.IRQ)
			u.User = pct(a.User+a.Nice, b.User+b.Nice)
			u.Idle = pct(a.Idle+a.IOWait, b.Idle+b.IOWait)
			u.Kthreads = min(100, 100*float64(kt[c])/tot)
		}
		d.CPU = append(d.CPU, u)
	}

	for c, a := range after.Softnet {
		b := before.Softnet[c]
		// softnet_stat prints 32-bit counters: difference them modulo 2^32
		// so a wrap in the window is not a huge jump.
		w := func(x, y uint64) uint64 { return uint64(uint32(x - y)) }
		s := Softnet{
			Processed:   w(a.Processed, b.Processed),
			Dropped:     w(a.Dropped, b.Dropped),
			TimeSqueeze: w(a.TimeSqueeze, b.TimeSqueeze),
			ReceivedRPS: w(a.ReceivedRPS, b.ReceivedRPS),
			FlowLimit:   w(a.FlowLimit, b.FlowLimit),
		}
		d.Softnet[c] = s
		d.DropsSoftnet += s.Dropped
		d.TimeSqueeze += s.TimeSqueeze
		d.ReceivedRPS += s.ReceivedRPS
	}

	sumNS := func(nss []string, into map[string]uint64) {
		seen := map[string]bool{}
		for _, ns := range nss {
			if seen[ns] {
				continue
			}
			seen[ns] = true
			a, b := after.SNMP[ns], before.SNMP[ns]
			if a == nil || b == nil {
				continue
			}
			for k, v := range a {
				into[k] += sub(v, b[k])
			}
		}
	}
	sumNS(after.cfg.RecvNS, d.Recv)
	sumNS(after.cfg.SendNS, d.Send)

	for dev, a := range after.Devs {
		b, ok := before.Devs[dev]
		if !ok {
			continue
		}
		s := DevStats{
			RxBytes:   sub(a.RxBytes, b.RxBytes),
			RxPackets: sub(a.RxPackets, b.RxPackets),
			RxErrors:  sub(a.RxErrors, b.RxErrors),
			RxDropped: sub(a.RxDropped, b.RxDropped),
		}
		d.Devs[dev] = s
		d.DropsNIC += s.RxDropped
	}

	d.Retrans = d.Send["TcpRetransSegs"]
	d.DSACK = d.Send["TcpExtTCPDSACKRecv"] + d.Send["TcpExtTCPDSACKOfoRecv"]
	d.OFO = d.Recv["TcpExtTCPOFOQueue"]
	for _, k := range socketDropCounters {
		d.DropsSocket += d.Recv[k]
	}
	return d
}

// Apply copies the delta into the per-run fields of r: CPU, Retrans, OFO,
// DSACK, DropsSoftnet, DropsSocket, DropsNIC. It also records, in
// r.Extra, softnet time squeezes and RPS IPIs, which tell whether a mode's
// receive core ran out of budget and how much it leaned on RPS.
func (d Delta) Apply(r *results.Run) {
	r.CPU = d.CPU
	r.Retrans = d.Retrans
	r.OFO = d.OFO
	r.DSACK = d.DSACK
	r.DropsSoftnet = d.DropsSoftnet
	r.DropsSocket = d.DropsSocket
	r.DropsNIC = d.DropsNIC
	if r.Extra == nil {
		r.Extra = map[string]float64{}
	}
	r.Extra["time_squeeze"] = float64(d.TimeSqueeze)
	r.Extra["rps_ipis"] = float64(d.ReceivedRPS)
}

// sub is a-b for counters, zero when the counter went backwards.
func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}
