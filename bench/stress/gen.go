// Package stress drives the receive side of a VXLAN overlay harder than a
// socket-based sender can: an XDP program run through BPF_PROG_RUN in
// live-frame mode injects pre-encapsulated VXLAN frames into the sending
// host's underlay device, whose veth peer (the receiving host's "NIC")
// takes them through the whole overlay receive path to a UDP sink in a
// container. With a Plain target it injects plain UDP to the receiving
// host instead (the native path). Sequence numbers in every datagram let
// the sink count loss and reordering per flow.
package stress

//go:generate go tool bpf2go -tags linux -target bpfel xdpGen xdp_gen.c -- -I../../datapath/bpf/include -I/usr/include/x86_64-linux-gnu

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/nsx"
)

// Target says where generated frames go: the sending host's underlay device
// they are transmitted on, and the headers that make the receiving host
// decapsulate them and deliver them to the sink.
type Target struct {
	SenderNetNS string // namespace of the sending host ("" = current)
	SenderDev   string // sending underlay device (a veth) in SenderNetNS

	// Outer headers: sending and receiving underlay devices.
	SrcMAC, DstMAC net.HardwareAddr
	SrcIP, DstIP   netip.Addr // IPv4 VTEP addresses
	VNI            uint32
	VXLANPort      uint16 // outer UDP destination port; 0 = 4789

	// Inner headers. InnerDstMAC is the receiving container's MAC on a
	// bridged (Docker) overlay, or the receiving VXLAN device's MAC on a
	// routed (Flannel) one. InnerDstIP is the sink's address; the workload
	// fills it (and InnerSrcIP) from its endpoints when left zero.
	InnerSrcMAC, InnerDstMAC net.HardwareAddr
	InnerSrcIP, InnerDstIP   netip.Addr

	// Plain sends UDP straight to DstIP, no VXLAN: the native path, host
	// to host over the underlay, with the sink on the receiving host.
	// VNI, VXLANPort and the inner headers are then unused, and the
	// generator's SrcPort/DstPort are the frame's UDP ports.
	Plain bool
}

// GenConfig is how the generator sends.
type GenConfig struct {
	// CPU is the core the generator thread is pinned to; negative leaves it
	// unpinned. The generator keeps this core 100% busy at any rate (see
	// Generator), so keep it out of the receive path being measured, or
	// let it Yield.
	CPU int
	// Yield runs the generator thread at SCHED_IDLE: it sends with the
	// cycles nothing else on its core wants, and any receive work placed
	// there (softirq, cpumap and NAPI kthreads, the receiving
	// applications) preempts it at the next batch boundary, as if the
	// traffic came from another machine. What it offered is still counted
	// (GenStats.Sent); with Rate set, a starved pacer shows as Stalls.
	Yield bool
	// Rate is the offered rate in packets/s; 0 sends as fast as possible.
	Rate float64
	// Burst is how many packets the pacer may send back to back to catch
	// up after its thread was held off the core; 0 = DefaultBurst.
	Burst int
	// Train makes a paced generator send its packets in trains of Train
	// back to back, one train every Train packets' worth of time, so the
	// average rate is Rate: the arrival pattern of a NIC that coalesces
	// interrupts, whose poll finds a batch of frames at once. 0 or 1:
	// evenly spaced. At most MaxTrain (the receiving veth's ring).
	Train int
	// Arrivals spaces a paced generator's packets (or trains):
	// ArrivalsEven ("" too) one every interval, ArrivalsPoisson at
	// exponentially distributed gaps of the same mean, as the merged
	// traffic of many independent senders arrives. Unpaced runs ignore it.
	Arrivals string
	// PayloadSize is the inner UDP payload in bytes, including the 8-byte
	// sequence number; 0 = DefaultPayload.
	PayloadSize int
	// Flows is the number of inner flows (inner UDP source ports
	// SrcPort..SrcPort+Flows-1, each with its own sequence); 0 = 1.
	Flows int
	// RunLen is how many consecutive packets go to one flow before the
	// next: 1 (the default) is round robin.
	RunLen int
	// SrcPort and DstPort are the inner UDP ports; 0 = DefaultSrcPort,
	// DefaultDstPort.
	SrcPort, DstPort uint16
	// OuterSrcPort is flow 0's outer UDP source port (flow i uses +i, the
	// entropy a VXLAN device derives from the inner flow); 0 = 49152.
	OuterSrcPort uint16
	// BatchSize is how many frames the kernel prepares per batch of the
	// live run (1..256); 0 = 64, the kernel's default.
	BatchSize int
}

// Defaults for GenConfig's zero fields.
const (
	DefaultPayload = 64  // a 156-byte frame, the small-packet stress case
	DefaultBurst   = 256 // the receiving veth's ring: a catch-up burst alone cannot overflow it
	MaxTrain       = 256 // the receiving veth's ring: a longer train would overflow it by itself
	DefaultSrcPort = 20000
	DefaultDstPort = 9999
	// MaxFlows is the size of the program's per-flow sequence array.
	MaxFlows = 4096

	// Arrival processes of a paced generator (GenConfig.Arrivals).
	ArrivalsEven    = "even"
	ArrivalsPoisson = "poisson"

	defaultOuterSport = 49152
	defaultBatch      = 64
	maxBatch          = 256 // the kernel's TEST_XDP_MAX_BATCH
)

func (c GenConfig) withDefaults() GenConfig {
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.Train == 0 {
		c.Train = 1
	}
	if c.Arrivals == "" {
		c.Arrivals = ArrivalsEven
	}
	if c.PayloadSize == 0 {
		c.PayloadSize = DefaultPayload
	}
	if c.Flows == 0 {
		c.Flows = 1
	}
	if c.RunLen == 0 {
		c.RunLen = 1
	}
	if c.SrcPort == 0 {
		c.SrcPort = DefaultSrcPort
	}
	if c.DstPort == 0 {
		c.DstPort = DefaultDstPort
	}
	if c.OuterSrcPort == 0 {
		c.OuterSrcPort = defaultOuterSport
	}
	if c.BatchSize == 0 {
		c.BatchSize = defaultBatch
	}
	return c
}

// CheckArrivals says whether s names an arrival process
// (GenConfig.Arrivals; "" is not one: withDefaults makes it even).
func CheckArrivals(s string) error {
	if s != ArrivalsEven && s != ArrivalsPoisson {
		return fmt.Errorf("arrivals %q: must be %s or %s", s, ArrivalsEven, ArrivalsPoisson)
	}
	return nil
}

func (c GenConfig) validate() error {
	if err := CheckArrivals(c.Arrivals); err != nil {
		return err
	}
	switch {
	case c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0):
		return fmt.Errorf("rate %v: must be >= 0 packets/s (0 = as fast as possible)", c.Rate)
	case c.Rate > 0 && c.Rate < 1:
		return fmt.Errorf("rate %v: must be at least 1 packet/s", c.Rate)
	case c.Burst < 1:
		return fmt.Errorf("burst %d: must be >= 1", c.Burst)
	case c.Train < 1 || c.Train > MaxTrain:
		return fmt.Errorf("train %d: must be 1..%d packets (the receiving veth's ring)", c.Train, MaxTrain)
	case c.Train > c.Burst:
		return fmt.Errorf("train %d is longer than burst %d, the most the pacer sends back to back: raise burst or shorten the train", c.Train, c.Burst)
	case c.Flows < 1 || c.Flows > MaxFlows:
		return fmt.Errorf("flows %d: must be 1..%d", c.Flows, MaxFlows)
	case c.RunLen < 1:
		return fmt.Errorf("run length %d: must be >= 1", c.RunLen)
	case int(c.SrcPort)+c.Flows-1 > math.MaxUint16:
		return fmt.Errorf("source ports %d+%d flows overflow 65535", c.SrcPort, c.Flows)
	case int(c.OuterSrcPort)+c.Flows-1 > math.MaxUint16:
		return fmt.Errorf("outer source ports %d+%d flows overflow 65535", c.OuterSrcPort, c.Flows)
	case c.BatchSize < 1 || c.BatchSize > maxBatch:
		return fmt.Errorf("batch size %d: must be 1..%d", c.BatchSize, maxBatch)
	}
	return nil
}

// UnsupportedError is a kernel feature the generator needs and the running
// kernel lacks. It matches ebpf.ErrNotSupported with errors.Is.
type UnsupportedError struct {
	Feature   string
	MinKernel string
	Err       error // what the kernel said
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s not supported (needs Linux >= %s)", e.Feature, e.MinKernel)
}

func (e *UnsupportedError) Unwrap() error { return e.Err }

func (e *UnsupportedError) Is(target error) bool { return target == ebpf.ErrNotSupported }

// Generator injects VXLAN frames (plain UDP for a Plain target) into
// Target.SenderDev from one pinned thread. It is not safe for concurrent Runs.
//
// Pacing (TestMeasure measures what follows on the machine it runs on):
//   - a BPF_PROG_RUN call that leaves frames in flight costs far more wall
//     time than its frames take, however few it sends (a call of one frame
//     is quick): time passes between entering the call and the first frame,
//     and the page-pool teardown at its end waits for the frames still in
//     flight. So a rate cannot be held by short calls with sleeps between
//     them, and long calls become line-rate bursts of thousands of frames
//     that overflow the receiving veth's 256-frame ring.
//   - so a Run is one open-ended call (repeat = 2^32-1) that Run ends by
//     signalling the thread: the kernel checks for signals between batches
//     and returns EINTR. The fixed cost is paid once, and the rate is
//     measured from the program's first frame (bpf_ktime_get_ns), not
//     from the syscall. As fast as possible, one core injects far more
//     than one core's receive path can take.
//   - with Rate set, the program paces itself: a token bucket on
//     bpf_ktime_get_ns (ns<<8 fixed point) that drops, rather than
//     redirects, each copy that is not due yet (a dropped live frame goes
//     straight back to the page pool, far cheaper than a sent one), and
//     after a stall lets at most Burst packets through back to back.
//     Packets leave on an absolute schedule, so the rate does not drift
//     while the thread keeps its core (Stalls = 0). When something else
//     takes the core for longer than Burst packets' worth, the backlog
//     beyond Burst is forgiven, not sent in one burst: the run falls short
//     and GenStats.Stalls says so. Whatever happens, GenStats.Sent is the
//     count actually offered.
//
// The cost of that precision is that the generator's core is busy all the
// time (PREEMPT_NONE: other tasks there run only when the loop's
// cond_resched lets them), so keep the generator off the cores whose
// receive path is being measured, or run it with GenConfig.Yield: at
// SCHED_IDLE every other task on its core preempts it at the next batch,
// so a receive stage that shares the generator's core (Falcon's split
// stage's cpumap kthread) is hardly held back by it.
type Generator struct {
	t     Target
	cfg   GenConfig
	frame []byte
	objs  xdpGenObjects
}

// GenStats is what one Run sent.
type GenStats struct {
	Sent    uint64        // frames redirected into the sending device: the offered load
	Held    uint64        // program runs the pacer dropped because no packet was due
	Errors  uint64        // program runs dropped for other reasons (should be 0)
	Stalls  uint64        // times the pacer fell more than Burst packets behind and dropped the backlog
	Late    uint64        // paced packets (trains: first packets) sent more than one interval behind schedule, in catch-up bursts
	Elapsed time.Duration // from the first frame sent to the stop request
	Calls   int           // BPF_PROG_RUN calls made
}

// PPS is the offered rate.
func (s GenStats) PPS() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Sent) / s.Elapsed.Seconds()
}

// NewGenerator builds the frame, loads the program with cfg's settings and
// probes that the kernel runs XDP programs on live frames.
func NewGenerator(t Target, cfg GenConfig) (*Generator, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if t.SenderDev == "" {
		return nil, errors.New("target has no sending device")
	}
	frame, err := buildFrame(t, frameSpec{
		payload:    cfg.PayloadSize,
		srcPort:    cfg.SrcPort,
		dstPort:    cfg.DstPort,
		outerSport: cfg.OuterSrcPort,
	})
	if err != nil {
		return nil, err
	}
	g := &Generator{t: t, cfg: cfg, frame: frame}
	if err := g.load(); err != nil {
		return nil, err
	}
	if err := g.probe(); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

func (g *Generator) load() error {
	spec, err := loadXdpGen()
	if err != nil {
		return err
	}
	var intervalFP, burstFP uint64
	if g.cfg.Rate > 0 {
		perPacket := 1e9 * 256 / g.cfg.Rate
		// One train per interval: Train packets' worth of time.
		intervalFP = uint64(math.Round(perPacket * float64(g.cfg.Train)))
		// After a stall the pacer sends the catch-up and then the train
		// that is due, back to back: at most Burst packets in all (a
		// train as long as Burst leaves one packet's worth of catch-up,
		// so a slightly late train is not counted a stall).
		burstFP = uint64(math.Round(perPacket * float64(max(g.cfg.Burst-g.cfg.Train, 1))))
	}
	// The headers the program writes back on every run (xdp_gen.c: hdr).
	var hdr [(headersLen + seqLen + 7) / 8 * 8]byte
	copy(hdr[:], g.frame)
	for name, v := range map[string]any{
		"hdr":         hdr,
		"nr_flows":    uint32(g.cfg.Flows),
		"run_len":     uint32(g.cfg.RunLen),
		"inner_sport": g.cfg.SrcPort,
		"outer_sport": g.cfg.OuterSrcPort,
		"interval_fp": intervalFP,
		"burst_fp":    burstFP,
		"train":       uint32(g.cfg.Train),
		"plain":       boolU8(g.t.Plain),
		"poisson":     boolU8(g.cfg.Arrivals == ArrivalsPoisson),
		"exp_q":       expQuantiles(),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("setting %s: %w", name, err)
		}
	}
	if err := spec.LoadAndAssign(&g.objs, nil); err != nil {
		return fmt.Errorf("loading xdp generator: %w", err)
	}
	return nil
}

// expQSize and expQShift are xdp_gen.c's EXP_Q and EXP_SHIFT.
const (
	expQSize  = 1024
	expQShift = 12
)

// expQuantiles is the program's table of exponential gaps (xdp_gen.c:
// exp_q): the quantiles of Exp(1) at the midpoints of expQSize equal
// slices, in units of 1/(1<<expQShift), scaled so that they sum to exactly
// expQSize << expQShift. A gap drawn uniformly from it then has mean 1
// interval, and a Poisson generator offers the rate it was asked for
// (the midpoints alone fall short by the tail they cut, 0.1%).
func expQuantiles() [expQSize]uint16 {
	var v [expQSize]float64
	sum := 0.0
	for i := range v {
		v[i] = -math.Log(1 - (float64(i)+0.5)/expQSize)
		sum += v[i]
	}
	var q [expQSize]uint16
	unit := float64(int(1) << expQShift)
	total := 0
	for i := range v {
		q[i] = uint16(math.Round(v[i] / (sum / expQSize) * unit))
		total += int(q[i])
	}
	// Rounding leaves the sum a few units off: the longest gap takes the
	// difference.
	q[expQSize-1] = uint16(int(q[expQSize-1]) + expQSize<<expQShift - total)
	return q
}

func boolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// probe runs the program once on a live frame. The devmap is still empty,
// so the frame is dropped and nothing is sent or consumed.
func (g *Generator) probe() error {
	err := probeError(liveRun(g.objs.XdpGen.FD(), g.frame, 1, 1))
	if err == nil {
		// Undo the probe's pass through the pacer and its count.
		if err := g.objs.State.Put(uint32(0), xdpGenGenState{}); err != nil {
			return fmt.Errorf("resetting generator state: %w", err)
		}
		ncpu, err := ebpf.PossibleCPU()
		if err != nil {
			return err
		}
		if err := g.objs.Stats.Put(uint32(0), make([]xdpGenGenStats, ncpu)); err != nil {
			return fmt.Errorf("resetting generator stats: %w", err)
		}
	}
	return err
}

// probeError names what the live-frame probe's errno means. Kernels
// before 5.18 reject the BPF_F_TEST_XDP_LIVE_FRAMES flag with EINVAL (the
// frame is well within the size limit, so nothing else is invalid), and
// ENOTSUPP (524, kernel-internal) means no test runner at all.
func probeError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.Errno(524)):
		return &UnsupportedError{Feature: "live frames", MinKernel: "5.18", Err: err}
	default:
		return fmt.Errorf("probing live-frame BPF_PROG_RUN: %w", err)
	}
}

// Close releases the program and its maps.
func (g *Generator) Close() error { return g.objs.Close() }

// Frame returns a copy of the frame the generator replays (sequence 0,
// flow 0).
func (g *Generator) Frame() []byte { return append([]byte(nil), g.frame...) }

func (g *Generator) readStats() (xdpGenGenStats, error) {
	var per []xdpGenGenStats
	if err := g.objs.Stats.Lookup(uint32(0), &per); err != nil {
		return xdpGenGenStats{}, fmt.Errorf("reading generator stats: %w", err)
	}
	var sum xdpGenGenStats
	for _, s := range per {
		sum.Sent += s.Sent
		sum.Held += s.Held
		sum.Error += s.Error
		sum.Stall += s.Stall
		sum.Late += s.Late
	}
	return sum, nil
}

// Run sends for d (0 = until ctx ends) and returns what it offered.
// Sequence numbers continue across Runs of one Generator.
func (g *Generator) Run(ctx context.Context, d time.Duration) (GenStats, error) {
	before, err := g.readStats()
	if err != nil {
		return GenStats{}, err
	}
	// A new Run starts a new pacing schedule and a new clock; flows keep
	// their sequence numbers and the round robin its position.
	var st xdpGenGenState
	if err := g.objs.State.Lookup(uint32(0), &st); err != nil {
		return GenStats{}, fmt.Errorf("reading generator state: %w", err)
	}
	st.NextFp, st.StartNs, st.Left = 0, 0, 0
	if err := g.objs.State.Put(uint32(0), st); err != nil {
		return GenStats{}, fmt.Errorf("resetting generator state: %w", err)
	}
	var (
		stop    atomic.Bool
		tid     int
		running = make(chan struct{}) // closed once the send loop starts
		done    = make(chan struct{}) // closed when the generator thread is finished
		runErr  error
		res     GenStats
		stopNs  int64 // CLOCK_MONOTONIC, bpf_ktime_get_ns's clock
	)
	go func() {
		defer close(done)
		// The thread's affinity, policy and signal mask are never undone:
		// locked and never unlocked, it exits with this goroutine, also
		// when nsx.Do runs fn right here (SenderNetNS "").
		runtime.LockOSThread()
		runErr = nsx.Do(g.t.SenderNetNS, func() error {
			if g.cfg.CPU >= 0 {
				if err := pinThread(g.cfg.CPU); err != nil {
					return err
				}
			}
			if g.cfg.Yield {
				if err := yieldThread(); err != nil {
					return err
				}
			}
			// The devmap entry names the device by ifindex, which only
			// means something in the sender's namespace: resolve it here.
			ifc, err := net.InterfaceByName(g.t.SenderDev)
			if err != nil {
				return fmt.Errorf("sending device %s in netns %q: %w", g.t.SenderDev, g.t.SenderNetNS, err)
			}
			if err := g.objs.TxPort.Put(uint32(0), uint32(ifc.Index)); err != nil {
				return fmt.Errorf("pointing devmap at %s: %w", g.t.SenderDev, err)
			}
			// Every signal ends a call, and a new call pays its set-up
			// again: keep the profiler's SIGPROF off this thread (it
			// dies after the Run, so the mask needs no undoing).
			var prof unix.Sigset_t
			const wordBits = int(unsafe.Sizeof(prof.Val[0]) * 8)
			prof.Val[(int(unix.SIGPROF)-1)/wordBits] |= 1 << ((int(unix.SIGPROF) - 1) % wordBits)
			if err := unix.PthreadSigmask(unix.SIG_BLOCK, &prof, nil); err != nil {
				return fmt.Errorf("blocking SIGPROF: %w", err)
			}
			tid = unix.Gettid()
			close(running)
			for !stop.Load() {
				err := liveRun(g.objs.XdpGen.FD(), g.frame, math.MaxUint32, uint32(g.cfg.BatchSize))
				res.Calls++
				if err != nil && !errors.Is(err, unix.EINTR) {
					return fmt.Errorf("live BPF_PROG_RUN: %w", err)
				}
				// EINTR: our stop signal, or a stray signal: the loop
				// condition tells which.
			}
			return nil
		})
	}()

	select {
	case <-done:
		return res, runErr // failed before sending
	case <-running:
	}
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ctx.Done():
	case <-timeout:
	case <-done:
	}
	stop.Store(true)
	// Sending ends within a batch of the signal, but the call then tears
	// down its page pool, which waits for frames still in flight:
	// the run lasts until the stop, not until the syscall returns.
	stopNs = monotonicNs()
	// A signal that lands just before the thread enters the syscall is
	// consumed in user space, so keep signalling until the thread is out.
	// SIGURG is the Go runtime's preemption signal: harmless to it.
	for waiting := true; waiting; {
		_ = unix.Tgkill(os.Getpid(), tid, unix.SIGURG)
		select {
		case <-done:
			waiting = false
		case <-time.After(2 * time.Millisecond):
		}
	}
	after, err := g.readStats()
	if err != nil && runErr == nil {
		runErr = err
	}
	res.Sent = after.Sent - before.Sent
	res.Held = after.Held - before.Held
	res.Errors = after.Error - before.Error
	res.Stalls = after.Stall - before.Stall
	res.Late = after.Late - before.Late
	if err := g.objs.State.Lookup(uint32(0), &st); err != nil && runErr == nil {
		runErr = fmt.Errorf("reading generator state: %w", err)
	}
	if st.StartNs != 0 && stopNs > int64(st.StartNs) {
		res.Elapsed = time.Duration(stopNs - int64(st.StartNs))
	}
	return res, runErr
}
