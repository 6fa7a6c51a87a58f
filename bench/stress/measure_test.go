package stress

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/internal/nsx"
)

// TestMeasure measures what the Generator comment says and the report
// quotes: injection rate from one core, BPF_PROG_RUN per-call cost, pacing
// accuracy, and what one receive core delivers through the VXLAN path.
// Slow, and its numbers belong to the machine: run on demand with
//
//	LANES_STRESS_MEASURE=1 go test -run Measure -v ./bench/stress/
//
// Layout (2 cores): generator on core 0; the receiving veth's NAPI threaded
// and pinned to core 1, with the sink, so core 1 runs the whole receive path.
func TestMeasure(t *testing.T) {
	if os.Getenv("LANES_STRESS_MEASURE") == "" {
		t.Skip("set LANES_STRESS_MEASURE=1 to measure")
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 cores")
	}
	p := newPair(t)
	const genCPU, rxCPU = 0, 1
	pinNAPI(t, p.rcv, "u1", rxCPU)

	// Per-call cost: calls of repeat=N, timed from the pinned thread.
	g, err := NewGenerator(p.target, GenConfig{CPU: genCPU})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	err = nsx.Do(p.snd, func() error {
		if err := pinThread(genCPU); err != nil {
			return err
		}
		ifc, err := net.InterfaceByName("u0")
		if err != nil {
			return err
		}
		if err := g.objs.TxPort.Put(uint32(0), uint32(ifc.Index)); err != nil {
			return err
		}
		for _, n := range []uint32{1, 64, 1024, 16384, 262144, 4194304} {
			calls := 20
			if n >= 262144 {
				calls = 3
			}
			var best, total time.Duration
			best = time.Hour
			for i := 0; i < calls; i++ {
				start := time.Now()
				if err := liveRun(g.objs.XdpGen.FD(), g.frame, n, 64); err != nil {
					return err
				}
				d := time.Since(start)
				total += d
				best = min(best, d)
			}
			avg := total / time.Duration(calls)
			t.Logf("per-call: repeat=%-8d avg %-12v min %-12v  => %.2f Mpps", n, avg, best, float64(n)/avg.Seconds()/1e6)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Injection rate: one open-ended call, stopped by a signal.
	for _, batch := range []int{64, 256} {
		g, err := NewGenerator(p.target, GenConfig{CPU: genCPU, BatchSize: batch})
		if err != nil {
			t.Fatal(err)
		}
		st, err := g.Run(context.Background(), 3*time.Second)
		g.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("max injection, batch %d: %.2f Mpps (%d sent in %v, %d calls)", batch, st.PPS()/1e6, st.Sent, st.Elapsed, st.Calls)
	}

	// Pacing accuracy and receive capacity: the full workload per rate.
	w := func(rate int, flows int) workload.Result {
		c0 := counters(t, p)
		defer func() {
			c1 := counters(t, p)
			t.Logf("   drops: sending veth tx %d, receiving veth rx %d, udp rcvbuf %d",
				c1.txDrop-c0.txDrop, c1.rxDrop-c0.rxDrop, c1.rcvbuf-c0.rcvbuf)
		}()
		res, err := NewUDPStress(p.target, GenConfig{CPU: genCPU}).Run(context.Background(),
			workload.Endpoint{NetNS: p.rcv, Addr: vxPrefix.Addr(), CPUs: []int{rxCPU}},
			workload.Endpoint{Addr: innerSrc},
			workload.Point{MsgSize: 64, Flows: flows, Rate: rate, Duration: 3 * time.Second, Port: 9000})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, rate := range []int{10000, 100000, 200000, 300000, 400000, 500000, 700000, 1000000, 2000000, 4000000, 0} {
		res := w(rate, 1)
		acc := "-"
		if rate > 0 {
			acc = fmt.Sprintf("%+.2f%%", (res.SentPPS/float64(rate)-1)*100)
		}
		t.Logf("target %8d pps: sent %9.0f (%s)  received %8.0f pps %.3f Gbit/s  lost %.0f  reorder %d",
			rate, res.SentPPS, acc, res.PPS, res.ThroughputGbps, res.Extra["udp_lost"], res.UDPReorder)
	}
	res := w(300000, 16)
	t.Logf("16 flows @300K: sent %.0f received %.0f reorder %d lost %.0f", res.SentPPS, res.PPS, res.UDPReorder, res.Extra["udp_lost"])
}

// pinNAPI switches dev's NAPI to threaded mode and pins its kthreads to cpu.
// The kthreads go away with the device, so nothing needs undoing.
func pinNAPI(t *testing.T, ns, dev string, cpu int) {
	t.Helper()
	before := napiThreads(dev)
	err := nsx.DoSysfs(ns, func() error {
		return os.WriteFile(filepath.Join("/sys/class/net", dev, "threaded"), []byte("1"), 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for deadline := time.Now().Add(2 * time.Second); len(pids) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for pid := range napiThreads(dev) {
			if !before[pid] {
				pids = append(pids, pid)
			}
		}
	}
	if len(pids) == 0 {
		t.Fatalf("no napi/%s-* kthread appeared", dev)
	}
	var set unix.CPUSet
	set.Set(cpu)
	for _, pid := range pids {
		if err := unix.SchedSetaffinity(pid, &set); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("napi kthreads %v of %s pinned to cpu %d", pids, dev, cpu)
}

func napiThreads(dev string) map[int]bool {
	out := map[int]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if strings.HasPrefix(strings.TrimSpace(string(comm)), "napi/"+dev+"-") {
			out[pid] = true
		}
	}
	return out
}

type dropCounters struct{ txDrop, rxDrop, rcvbuf uint64 }

// counters reads drop counters: the sending veth's tx drops (frames its
// peer's ring had no room for), the receiving veth's rx drops and the
// receiving namespace's UDP RcvbufErrors (socket queue full).
func counters(t *testing.T, p *pair) dropCounters {
	var c dropCounters
	read := func(ns, file string) string {
		var b []byte
		err := nsx.Do(ns, func() error {
			var err error
			// thread-self: /proc/self/net would show the main thread's
			// namespace, not this thread's.
			b, err = os.ReadFile("/proc/thread-self/net/" + file)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	devField := func(text, dev string, field int) uint64 {
		for _, line := range strings.Split(text, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && name == dev {
				var v uint64
				fmt.Sscan(strings.Fields(rest)[field], &v)
				return v
			}
		}
		return 0
	}
	c.txDrop = devField(read(p.snd, "dev"), "u0", 11)
	c.rxDrop = devField(read(p.rcv, "dev"), "u1", 3)
	lines := strings.Split(read(p.rcv, "snmp"), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.HasPrefix(lines[i], "Udp:") && strings.HasPrefix(lines[i+1], "Udp:") {
			names, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			for j := range names {
				if names[j] == "RcvbufErrors" {
					fmt.Sscan(vals[j], &c.rcvbuf)
				}
			}
			break
		}
	}
	return c
}
