// Package mflow is MFLOW (packet-level parallelism for overlay receive,
// Lei et al.) on stock kernels: it plans where the steering datapath
// (datapath/steer) cuts elephant flows into micro-flows of consecutive
// frames, which cores process those micro-flows in parallel, and, where
// the kernel has the BPF qdisc (Linux 6.16 and newer built with
// CONFIG_NET_SCH_BPF), MFLOW's in-order reassembly before each container
// (datapath/reorder). Without it the mode reorders and stays opt-in.
//
// Planners only: they never touch the kernel and return a plan.Plan the
// engine journals and applies.
package mflow

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/reorder"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
)

// Options are mflow's settings.
type Options struct {
	// IRQCPUs are the underlay NIC's IRQ cores as the user gave them
	// (plan.IRQKey); nil: read from the NIC (plan.IRQCPUs).
	IRQCPUs []int
	// Batch is the number of consecutive frames per micro-flow. MFLOW uses
	// 256: its measurements (16..1024) showed little reordering from 256
	// up, and GRO merges within a batch only.
	Batch uint32
	// SplitCPUs are the cores micro-flows go to, round robin in ascending
	// order; empty = DefaultSplitCPUs.
	SplitCPUs []int
	// Threshold is the rate (packets/s) from which a flow is an elephant
	// and split; 0 splits every flow.
	Threshold uint64
	// At is where elephants are split: SplitAtIRQ (XDP + cpumap, before
	// skb allocation) or SplitAtBridge (RPS on the VXLAN device).
	At steer.SplitAt
	// QueueSize is the cpumap queue length per split core (at=irq).
	QueueSize uint32
	// Reorder puts the reassembler before each container where the
	// kernel has the BPF qdisc; ReorderTimeout is its watchdog.
	Reorder        bool
	ReorderTimeout time.Duration
	// ReorderCheck loads the reassembler with its self-check
	// (reorder.Config.SelfCheck): a diagnostic the guest tests use.
	ReorderCheck bool
}

// Defaults are MFLOW's where it has them. The threshold is lanes' own (the
// paper names elephants but gives no number): 10000 packets/s. At what the
// overlay's receive path costs vanilla per datagram on the 2-core VMs
// (docs/results/bpfcost-intel-2026-11-26/README.md,
// docs/results/fast-own-intel-2026-11-29/README.md), a flow below that rate
// takes a small share of a core and splitting it would only reorder it;
// request/response flows (a ping-pong at 1000 messages/s, a memcached
// connection) stay below it, while bulk streams are far above.
// A flow at the threshold fills a 256-frame micro-flow every 25 ms.
func Defaults() Options {
	return Options{Batch: 256, Threshold: 10000, At: steer.SplitAtIRQ, QueueSize: 2048, Reorder: true, ReorderTimeout: reorder.DefaultTimeout}
}

// Limits of the settings.
const (
	maxThreshold = 1_000_000_000
	// window is the datapath's elephant-test window: short enough that a
	// new elephant is split within milliseconds, long enough to hold
	// minWindowFrames at the default threshold's rate and above.
	window          = 10 * time.Millisecond
	minWindowFrames = 16
	minThreshold    = minWindowFrames // packets/s: a window of at most 1 s
)

var params = []plan.Param{
	plan.IRQParam,
	{Key: "batch", Default: "256", Help: "frames per micro-flow, 1..65536 (MFLOW measured 16..1024; from 256 up little reordering)"},
	{Key: "split-cpus", Default: "two cores of the set, the IRQ core among them", Help: "cores micro-flows go to, round robin, a list like 0-1"},
	{Key: "threshold", Default: "10000", Help: "packets/s from which a flow is an elephant and split; 0 splits every flow"},
	{Key: "at", Default: "irq", Help: "split point: irq (XDP + cpumap, before skb allocation: everything after the NIC poll runs per micro-flow) or bridge (RPS on the VXLAN device: everything after its GRO cell)"},
	{Key: "queue-size", Default: "2048", Help: "cpumap queue length per split core (at=irq)"},
	{Key: "reorder", Default: "on", Help: "on: reassemble split flows in order before each container where the kernel has the BPF qdisc (Linux >= 6.16, CONFIG_NET_SCH_BPF); off: never"},
	{Key: "reorder-timeout", Default: "10ms", Help: "how long the reassembler waits for a micro-flow after a loss before it skips the gap, 1ms..10s"},
	{Key: "x-reorder-check", Default: "false", Help: "the reassembler counts the frames it lets out behind a later micro-flow of their flow (`backward` in lanes status): a diagnostic, one map lookup per split frame"},
}

// Parse reads params over base. Every error is one line saying what to
// fix.
func Parse(base Options, m map[string]string) (Options, error) {
	o := base
	for k, v := range m {
		var err error
		switch k {
		case plan.IRQKey:
			o.IRQCPUs, err = cpuset.ParseList(v)
		case "batch":
			var n uint64
			n, err = strconv.ParseUint(v, 10, 32)
			if err != nil || n < 1 || n > steer.MaxBatch {
				err = fmt.Errorf("want 1..%d frames (MFLOW measured 16..1024)", steer.MaxBatch)
			}
			o.Batch = uint32(n)
		case "split-cpus":
			o.SplitCPUs, err = cpuset.ParseList(v)
		case "threshold":
			o.Threshold, err = strconv.ParseUint(v, 10, 64)
			if err != nil || (o.Threshold != 0 && (o.Threshold < minThreshold || o.Threshold > maxThreshold)) {
				err = fmt.Errorf("want packets/s, 0 (every flow) or %d..%d", minThreshold, maxThreshold)
			}
		case "at":
			o.At, err = parseAt(v)
		case "queue-size":
			o.QueueSize, err = plan.ParseQueueSize(v)
		case "reorder":
			switch v {
			case "on":
				o.Reorder = true
			case "off":
				o.Reorder = false
			default:
				err = fmt.Errorf("want on or off")
			}
		case "reorder-timeout":
			o.ReorderTimeout, err = time.ParseDuration(v)
			if err != nil || o.ReorderTimeout < time.Millisecond || o.ReorderTimeout > 10*time.Second {
				err = fmt.Errorf("want a duration from 1ms to 10s")
			}
		case "x-reorder-check":
			o.ReorderCheck, err = strconv.ParseBool(v)
		default:
			return o, fmt.Errorf("unknown mflow setting %q", k)
		}
		if err != nil {
			return o, fmt.Errorf("bad mflow setting %s=%q: %v", k, v, err)
		}
	}
	return o, nil
}

func parseAt(v string) (steer.SplitAt, error) {
	for _, at := range []steer.SplitAt{steer.SplitAtIRQ, steer.SplitAtBridge} {
		if v == at.String() {
			return at, nil
		}
	}
	return steer.SplitOff, fmt.Errorf("want irq or bridge")
}

// Params returns o as the params map Parse reads.
func (o Options) Params() map[string]string {
	m := map[string]string{
		"batch":      strconv.FormatUint(uint64(o.Batch), 10),
		"threshold":  strconv.FormatUint(o.Threshold, 10),
		"at":         o.At.String(),
		"queue-size": strconv.FormatUint(uint64(o.QueueSize), 10),
		"reorder":    map[bool]string{true: "on", false: "off"}[o.Reorder],
	}
	if o.ReorderTimeout > 0 {
		m["reorder-timeout"] = o.ReorderTimeout.String()
	}
	if o.ReorderCheck {
		m["x-reorder-check"] = "true"
	}
	if len(o.SplitCPUs) > 0 {
		m["split-cpus"] = cpuset.FormatList(o.SplitCPUs)
	}
	return m
}

// Window is the datapath's elephant test for o.Threshold: a flow is an
// elephant while it carries frames frames per window. The window is 10 ms,
// longer for thresholds too low to put minWindowFrames in it, so a single
// burst of a mouse does not pass for a rate.
func (o Options) Window() (w time.Duration, frames uint32) {
	if o.Threshold == 0 {
		return window, 0
	}
	perWindow := math.Ceil(float64(o.Threshold) * window.Seconds())
	if perWindow >= minWindowFrames {
		return window, uint32(perWindow)
	}
	return time.Duration(float64(time.Second) * minWindowFrames / float64(o.Threshold)), minWindowFrames
}
