// Package prism plans PRISM (receive-side flow priority) on stock kernels:
// flows matching the priority rules (`lanes prio`) get their own queue and
// kthread on the receive core, at a higher real-time priority than bulk
// traffic, and every later stage of the receive path runs above the
// earlier ones, so a batch finishes its path before the next is polled.
package prism

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/policy/fast"
)

// Options are a prism mode's settings. What was measured for the
// defaults is in docs/decisions/README.md (PRISM).
type Options struct {
	// IRQCPUs are the underlay NIC's IRQ cores as the user gave them
	// (plan.IRQKey); nil: read from the NIC (plan.IRQCPUs).
	IRQCPUs []int
	// PrioMode is PRISM's mode: "batch" (own queue and kthread per class,
	// batch-level preemption) or "sync" (batch, plus run to completion:
	// high-priority frames for a container the bridge forwards to plainly
	// are decapsulated in XDP and handed straight to its veth; see Sync).
	PrioMode string
	// SyncInterval is how often sync mode's agent rediscovers the host
	// (besides on every link or forwarding-table change) to keep the
	// shortcut's destinations true.
	SyncInterval time.Duration
	// CPU is the receive core: the cpumap queues and every later stage
	// run there (-1: the underlay's IRQ core).
	CPU int
	// RT is the real-time priority (SCHED_FIFO) of the NIC poll, the
	// lowest real-time rung; see Ladder.
	RT int
	// BulkRT is the bulk queue's kthread priority; 0 keeps it at normal
	// scheduling.
	BulkRT int
	// HighRT is the high-priority queue's kthread priority: -1 (the
	// default) puts it at the top of the ladder (RT+3); 0 runs it at
	// normal scheduling, which with bulk-sched=idle still takes the core
	// from bulk work at once (a normal task preempts a SCHED_IDLE one on
	// wake-up), but no longer from the applications on the core. Why: a
	// busy marked service's worker waits for the core after the real-time
	// high-priority kthread as often as after bulk work. At normal
	// scheduling memcached gains request rate, but the ping-pong loses some
	// of its tail and nginx some of its rate, so it is an option.
	HighRT int
	// QueueSize is the length of each cpumap queue (frames).
	QueueSize uint32
	// Streamline puts the later stages' NAPI threads (GRO cells,
	// container veths) and the NIC poll on the real-time ladder too;
	// without it (the default) only the high-priority queue is real-time.
	// The real-time NIC poll takes the receive core from the services' own
	// threads: with the ladder the marked TCP services lose much of their
	// request rate under background, and the ping-pong's tail gains
	// nothing.
	Streamline bool
	// Pin pins the later stages' NAPI threads (VXLAN GRO cells, container
	// veths) to the receive core: priorities only order work that shares
	// a core.
	Pin bool
	// Fast runs the fast path (policy/fast) beside the classes: a flow the
	// kernel's path delivered goes from its class's queue (or the NIC
	// poll) straight into its container, its later stages skipped, so a
	// marked flow runs to completion in its own queue's kthread.
	Fast bool
	// High is where high-priority frames run their first stage (skb
	// allocation, GRO, decap): "queue", their own cpumap queue and kthread
	// at the top of the ladder, or "inline", the NIC poll that classified
	// them, which then hands only bulk frames to a queue. Both are PRISM's
	// high queue first; inline saves the kthread hop (a wake-up per frame,
	// in the median latency) and makes a high-priority frame wait only for
	// the XDP verdicts of the bulk frames polled with it. Or "auto": for
	// each rule, the queue while the flows it marks are light, the NIC poll
	// while they are busy (HighAutoPPS), switched at runtime by lanes
	// agent.
	// Why: the inline first stage gives busy request/response TCP services
	// under background much of the rate they lose in the queue back, while
	// a light ping-pong keeps its p99 better in the real-time queue (see
	// highswitch.go). The decision is each rule's, not the class's: a light
	// marked flow keeps its queue beside a busy one marked by another rule.
	High string
	// highDefault: High was not given and resolved to auto, which the
	// planner takes back to queue (with a note) where auto cannot run.
	highDefault bool
	// bulkDefault: Bulk was not given: auto with high=auto (bulkDefault),
	// which the planner takes back to queue with High.
	bulkDefault bool
	// highBy names the setting that implied high=auto when high was not
	// given (high-auto-pps, bulk-quiet), for error messages.
	highBy string
	// composed: the settings are a composing mode's (ParseClasses), for
	// error messages.
	composed bool
	// HighAutoPPS is high=auto's threshold: a rule's flows run inline
	// once steer_xdp classified at least this many frames per second under
	// the rule for 0.3 s, and go back to their queue after 1 s below half
	// of it. The default lies between a light and a busy marked flow: a
	// ping-pong at PRISM's 1000 messages/s is 1000 frames/s, and the
	// benchmark's marked memcached and nginx carry more than the default.
	HighAutoPPS int
	// BulkQuiet (with high=auto; 0: off) also runs every high-priority flow
	// in the NIC poll while no bulk frame came for this long: with no bulk
	// work to preempt, a light flow alone in its real-time queue only pays
	// the kthread's wake-up on every frame, in its median latency. The
	// first bulk frame ends it, in steer_xdp, before the next high-priority
	// frame is classified.
	BulkQuiet time.Duration
	// AsideBelow (with high=auto and bulk=auto; 0: off) is where PRISM
	// steps aside: while the receive core's receive work (softirq and the
	// receive kthreads, lanes agent's samples) stays under this percent of
	// the core, the agent has steer_xdp run both classes in the NIC poll,
	// vanilla's path (highswitch.go says when and why). The default is
	// where the testbed's light background stayed under it and its
	// heavier ones did not (docs/decisions: receive work counts each
	// frame's whole cost, so it is not the background's share of the
	// core's capacity).
	AsideBelow int
	// AsideDepth (with AsideBelow; 0: receive work alone) is how many
	// frames the underlay NIC's polls on the receive core find waiting,
	// on average, under which PRISM steps aside where lanes agent can
	// count them (tracing on napi_poll): a marked frame on vanilla's path
	// waits behind the frames its poll finds ahead of it, so a NIC whose
	// polls find one frame each has no queue for PRISM to take away,
	// whatever the core's load. Receive work decides only where the
	// polls cannot be counted. The default lies between the testbed's
	// light and heavy backgrounds (docs/decisions).
	AsideDepth float64
	// Bulk is where bulk frames run their first stage: "queue", the bulk
	// cpumap queue and its kthread (the NIC poll only classifies and
	// hands on, so a high-priority frame behind bulk frames in the NIC's
	// ring waits for their XDP verdicts only), or "inline", the NIC poll
	// itself, as vanilla runs them: no cpumap hop and no second skb build
	// per bulk frame, and the high-priority kthread preempts the NIC poll
	// at its batch boundary instead of the bulk kthread's. The hop is
	// what the queue costs: the receive kthreads take more of the receive
	// core than vanilla's receive path does, and a service on that core
	// gets less of it. Or "auto" (with high=auto): the queue, and the
	// NIC poll while every high-priority frame of the last BulkAutoWindow
	// ran there as a busy rule's (steer_xdp decides frame by frame, see
	// steer.Config.BulkAuto): with no marked frame queued, bulk's hop
	// preempts nothing. Why: beside a busy marked service (memcached) under
	// background, bulk queued cost the service much of its request rate and
	// its tail; bulk in the NIC poll gave most of them back, and the
	// background its rate.
	Bulk string
	// BulkSched is the fair scheduling policy of the bulk queue's
	// kthread, which does all of a bulk frame's receive work after XDP
	// (skb, GRO, decap, bridge, veth, socket): "normal" (as the kernel
	// makes it), "batch" (when woken it never preempts an application) or
	// "idle" (SCHED_IDLE: any normal task, the high-priority service's
	// among them, takes the core from bulk receive work at once, and bulk
	// gets what the applications leave of the core). Why: under background
	// the ping-pong's p99 is not spent in a receive stage but in the server
	// waiting for the core after its wake-up, behind a bulk receive kthread
	// that keeps the core for up to its fair-scheduling slice (traced). The
	// NIC poll keeps its policy: it classifies both classes, and with it
	// idle a busy high-priority service starves its own frames in the NIC's
	// ring. Needs bulk=queue.
	BulkSched string
	// GuardNice is the nice value bulk-sched=idle's guard gives the bulk
	// queue's kthread when it finds it starved (normal scheduling): 0
	// shares the core evenly with a busy service; up to 19 gives bulk a
	// smaller share (nice 19 weighs 15 against nice 0's 1024), enough to
	// keep its queue moving while the service keeps most of the core.
	GuardNice int
	// GuardTasks is the share of the receive core (percent) that its
	// other tasks - applications, the marked service's server among them
	// - must take before bulk-sched=idle's guard gives a waiting bulk
	// kthread normal scheduling (DefaultBulkGuardRule says why).
	GuardTasks float64
	// Quiet (0: off, the default) keeps bulk flows in the NIC poll also
	// while rules exist, once no high-priority frame arrived for this
	// long: the bulk queue's hop costs a bulk TCP stream a large part of
	// its rate, and buys nothing while there is nothing to preempt
	// for. The first high-priority frame ends the quiet; bulk flows then
	// take their queue as after a rule's arrival, but that frame, and
	// those right behind it, find bulk still in the NIC poll, as vanilla
	// serves them. So it trades the latency of a marked flow's first
	// frames after a pause for bulk throughput while marked flows pause.
	Quiet time.Duration
	// VethQueues is how the container stage queues the classes: "shared"
	// (the default), one queue per container veth as a stock host runs
	// it (the per-CPU backlog, in softirq), or "class", PRISM's queue per
	// class: each container veth gets a second receive queue, both polled
	// by their own threaded NAPI on the receive core, the high one at the
	// high-priority queue's real-time priority and the bulk one at normal
	// scheduling, and steer_tc_veth_class sends each class to
	// its queue. A veth hands a forwarded frame to its peer's NAPI only
	// while it has TSO off, so "class" turns TSO off on the host-side
	// veths, and the kernel then segments merged TCP before the veth in
	// software, which costs a single TCP stream into the container much
	// of its rate. Batch mode only.
	VethQueues string
	// NetdevBudget (0: left as it is) sets net.core.netdev_budget, the
	// frames one NET_RX softirq round may poll before it yields. Why it
	// matters here: a high-priority frame's real-time kthread is woken
	// when the NIC poll hands the frame over, but it only gets the core
	// once the softirq round ends, after up to netdev_budget (300 by
	// default) frames of the NIC poll, where the NIC is polled in softirq,
	// and of the later stages that share the poll list (the GRO cell, the
	// backlog). A smaller budget ends the round sooner: batch-level
	// preemption at the NIC poll's batch (64 frames) instead of the
	// round's. A NIC polled by its own NAPI thread is not in the round;
	// then only the later stages are cut. The sysctl is host-wide (every
	// NIC's softirq rounds; only the host's initial network namespace
	// has it), so an option, one target at a time (control refuses a
	// second), and reset puts back the value it had before apply. Off by
	// default: a round of one NIC poll (64) mostly lowers the marked
	// ping-pong's p99 but defers the rest of the receive work to ksoftirqd
	// sooner, which costs busy marked TCP services.
	NetdevBudget int
}

// High and Bulk values.
const (
	HighQueue  = "queue"
	HighInline = "inline"
	HighAuto   = "auto"
	BulkQueue  = "queue"
	BulkInline = "inline"
	BulkAuto   = "auto"

	SchedNormal = "normal"
	SchedBatch  = "batch"
	SchedIdle   = "idle"

	VethShared = "shared"
	VethClass  = "class"
)

// BulkAutoWindow is bulk=auto's window: bulk runs in the NIC poll while
// every high-priority frame of the last BulkAutoWindow ran there as a busy
// rule's. A light marked flow sending at least every 20 ms (PRISM's
// ping-pong sends every 1 ms) keeps bulk queued all the time.
const BulkAutoWindow = 20 * time.Millisecond

// DefaultAsideBelow is aside-below's default (Options.AsideBelow).
const DefaultAsideBelow = 50

// DefaultAsideDepth is aside-depth's default (Options.AsideDepth).
const DefaultAsideDepth = 2.0

// Defaults follow the paper: batch mode, everything on one core. BulkSched,
// High and Bulk are left empty: Parse resolves them (bulkSchedDefault,
// highDefault, bulkDefault).
func Defaults() Options {
	return Options{PrioMode: "batch", CPU: -1, RT: 50, HighRT: -1, QueueSize: 2048, Pin: true, Streamline: false, SyncInterval: time.Second, HighAutoPPS: 5000, BulkQuiet: 20 * time.Millisecond, AsideBelow: DefaultAsideBelow, AsideDepth: DefaultAsideDepth, VethQueues: VethShared, GuardTasks: DefaultGuardTasks}
}

// Ladder is the SCHED_FIFO priority of each rung, from the base RT:
//
//	RT+3    high-priority cpumap kthread: skb alloc, GRO, decap of high-priority flows
//	        (HighRT when set: 0 is normal scheduling, with bulk-sched=idle)
//	RT+2    container veth NAPI threads: inner IP, TCP/UDP (both classes)
//	RT+1    VXLAN GRO cell threads: bridge, veth transmit (both classes)
//	RT      underlay NAPI threads: the NIC poll, where XDP classifies
//	BulkRT  normal cpumap kthread: skb alloc, GRO, decap of bulk flows
//	        (0: normal scheduling, the default)
//
// High-priority frames preempt bulk work at the bulk kthread's batch
// boundary (PRISM-batch). Later stages above earlier ones is PRISM's
// streamlined polling: what a stage hands on runs before the stage takes
// its next batch. The NIC poll (cheap: XDP only) sits above bulk
// processing so a high-priority frame is classified without waiting for
// the bulk queue. The bulk queue's kthread stays at normal scheduling by
// default: at a real-time priority, bulk traffic starved the applications
// on the receive core, the background's own receiver among them; at
// normal priority it shares the core with them, and the real-time rungs
// above it only carry what it handed on.
type Ladder struct{ Low, NIC, GRO, Container, High int }

// Ladder returns o's priorities.
func (o Options) Ladder() Ladder {
	l := Ladder{Low: o.BulkRT, NIC: o.RT, GRO: o.RT + 1, Container: o.RT + 2, High: o.RT + 3}
	if o.HighRT >= 0 {
		l.High = o.HighRT
	}
	return l
}

// bulkSchedDefault is bulk-sched when not given: idle, the policy that
// came closest to PRISM's p99 target on the testbed (against normal: a
// lower ping-pong p99 under background, the background kept when evenly
// spaced, the TCP services' request rate slightly lower), unless
// the other settings leave it nothing to set (bulk=inline:
// no bulk queue; bulk-rt > 0: a real-time one) or would put bulk work
// below a real-time NIC poll as well (streamline=true). Then normal, as
// the kernel makes the kthread. idle needs lanes agent's starvation guard,
// which the plan names.
// highDefault is high when not given: auto, which takes for each kind of
// marked traffic the better of queue and inline (see Options.High: a
// busy service's rate near inline's, a light flow's tail as in its
// queue), unless bulk=inline leaves it no move to make: queue then.
// The planner also takes it back to queue, saying so, where the NIC is
// not polled on the receive core alone.
func highDefault(o Options) string {
	if o.Bulk == BulkInline {
		return HighQueue
	}
	return HighAuto
}

// bulkDefault is bulk when not given: auto with high=auto (bulk runs in
// the NIC poll only beside busy marked flows, while no marked frame takes
// its queue), queue otherwise. Beside a busy marked service under
// background auto leaves the service more of its request rate than queue
// does, and the background at least as much (see Options.Bulk); a light
// marked flow sending every millisecond keeps bulk queued, as under queue
// (traced while it ran). The price: the first frame of a light marked flow
// after a pause of more than BulkAutoWindow, beside a busy marked one,
// finds bulk in the NIC poll. The planner takes it back to queue with High
// where high=auto cannot run; streamline=true keeps it at queue.
func bulkDefault(o Options) string {
	// Not under streamline=true: its NIC poll is real-time, and bulk
	// work there would starve the busy services (as bulk=inline would).
	if o.High == HighAuto && !o.Streamline {
		return BulkAuto
	}
	return BulkQueue
}

func bulkSchedDefault(o Options) string {
	if o.Bulk == BulkInline || o.Streamline || o.BulkRT > 0 {
		return SchedNormal
	}
	return SchedIdle
}

var params = []plan.Param{
	plan.IRQParam,
	{Key: "prio-mode", Default: "batch", Help: "PRISM mode: batch (own queue and kthread per class) or sync (batch, and high-priority frames for plainly bridged containers go from XDP straight to their veth)"},
	{Key: "cpu", Default: "the underlay's IRQ core", Help: "receive core for both classes' queues and the later stages"},
	{Key: "rt", Default: "50", Help: "SCHED_FIFO priority of the NIC poll; GRO cells, container veths and the high-priority queue get rt+1..rt+3 (the last unless high-rt says otherwise)"},
	{Key: "bulk-rt", Default: "0", Help: "SCHED_FIFO priority of the bulk queue's kthread, below rt (0 = normal scheduling, sharing the core with applications)"},
	{Key: "high-rt", Default: "rt+3", Help: "SCHED_FIFO priority of the high-priority queue's kthread, above every other rung; 0 = normal scheduling (needs bulk-sched=idle, under which it still preempts bulk work but no longer the applications)"},
	{Key: "queue-size", Default: "2048", Help: "cpumap queue length per class"},
	{Key: "streamline", Default: "false", Help: "true: run the NIC poll, GRO cells and container veths at rising real-time priorities (PRISM's streamlined order; measured to cost TCP services on 2 cores); false: only the high-priority queue is real-time"},
	{Key: "high", Default: "auto (queue with bulk=inline, where the NIC is not polled on the receive core alone, or where its GRO merges inner UDP)", Help: "where high-priority frames run their first stage: queue (their own cpumap kthread, real-time), inline (in the NIC poll that classified them; only bulk is queued) or auto (lanes agent switches between the two rule by rule: a rule's flows inline while they are busy, high-auto-pps, in their queue while they are light)"},
	{Key: "high-auto-pps", Default: "5000", Help: "with high=auto: frames per second of a rule's flows from which they run inline (back to their queue below half of it)"},
	{Key: "bulk-quiet", Default: "20ms (with high=auto)", Help: "with high=auto: also run every high-priority flow in the NIC poll while no bulk frame came for this long (1ms..1h; 0: off): with no bulk work to preempt, a light flow's queue only costs it a kthread wake-up per frame; the first bulk frame sends the flows back to their queue, in order"},
	{Key: "aside-below", Default: fmt.Sprint(DefaultAsideBelow), Help: "with high=auto and bulk=auto: lanes agent steps PRISM aside (every flow in the NIC poll, as vanilla runs it) while the receive core's receive work stays under this percent of the core for " + asideFor + ", and puts the queues back after " + asideBack + " at or above it (0-100; 0: off): where the core is rarely busy with bulk work, a marked frame rarely waits for it, and the queues' hop costs more than it saves. Where the NIC's polls can be counted, aside-depth decides instead"},
	{Key: "aside-depth", Default: fmt.Sprint(DefaultAsideDepth), Help: "with aside-below: where lanes agent can count the underlay NIC's polls on the receive core (BPF tracing), it steps PRISM aside while they find fewer than this many frames each, on average, and puts the queues back once they find this many (1-64; 0: receive work alone): a marked frame on vanilla's path waits only behind the frames its poll finds ahead of it"},
	{Key: "bulk", Default: "auto with high=auto, else queue", Help: "where bulk frames run their first stage: queue (the bulk cpumap kthread; the NIC poll only classifies), inline (in the NIC poll, as vanilla: no cpumap hop per bulk frame; high-priority frames preempt the poll at its batch boundary) or auto (with high=auto: the queue, and the NIC poll while every high-priority frame of the last " + BulkAutoWindow.String() + " ran there as a busy rule's)"},
	{Key: "guard-tasks", Default: fmt.Sprint(DefaultGuardTasks), Help: "with bulk-sched=idle: the guard gives a waiting bulk queue normal scheduling only while the receive core's applications (and kernel threads that are not receive work) take at least this percent of it (0-100; 0: whenever bulk waits); below it bulk waits for softirq and the high-priority queue, which normal scheduling would not take the core from; a bulk queue that waited 90% of the time is starved by receive work that never runs out (the NIC poll under overload) and gets normal scheduling whatever the applications take"},
	{Key: "guard-nice", Default: "0", Help: "with bulk-sched=idle: the nice value (0-19) the guard gives a starved bulk queue; higher leaves more of the core to a busy service"},
	{Key: "bulk-sched", Default: "idle (normal with bulk=inline, streamline=true or bulk-rt>0)", Help: "fair policy of the bulk queue's kthread: normal, batch (never preempts an application when woken) or idle (every normal task, the high-priority service's among them, takes the core from bulk receive work at once; bulk gets what applications leave)"},
	{Key: "quiet", Default: "0 (off)", Help: "also keep bulk in the NIC poll (no queue hop) once no high-priority frame came for this long (1ms..1h, e.g. 1s); the first marked frame after such a pause is served as vanilla would, behind the NIC poll's bulk"},
	{Key: "veth-queues", Default: "shared", Help: "container stage: shared (one queue per container veth, as the kernel runs it) or class (a second receive queue per container veth for high-priority frames, each polled by its own NAPI thread; turns TSO off on host-side veths, which costs bulk TCP)"},
	{Key: "netdev-budget", Default: "0 (left as it is)", Help: "set the host's net.core.netdev_budget (frames per NET_RX softirq round, 1..100000): the high-priority queue's kthread gets the core only when the round ends, so a smaller budget (e.g. 64: one poll of a NIC polled in softirq) lets it preempt bulk sooner; host-wide (lanes must run in the host's network namespace; one target at a time), lanes reset puts back the value it had; costs busy TCP services"},
	{Key: "pin", Default: "true", Help: "pin the GRO cell and container veth NAPI threads to the receive core"},
	{Key: "sync-interval", Default: "1s", Help: "sync: how often lanes agent rediscovers the host besides on link and forwarding-table changes (10ms..1m)"},
	fast.Param,
}

// retiredParams are settings prism no longer takes, each with the one
// line that refuses it (plan.Retired): any value, since what replaced the
// setting is no choice.
var retiredParams = map[string]string{
	"sync-netfilter": "sync-netfilter is gone: PRISM-sync takes its shortcut only where no netfilter table (iptables, nftables, legacy ebtables) can see the overlay's frames, and never past one; remove the setting",
}

// Parse reads params over base; every error is one line saying what to fix.
func Parse(base Options, m map[string]string) (Options, error) {
	o := base
	autoPPS := false   // high-auto-pps given
	bulkQuiet := false // bulk-quiet given
	guardTasks := false
	asideGiven, depthGiven := false, false
	for k, v := range m {
		var err error
		switch k {
		case plan.IRQKey:
			o.IRQCPUs, err = cpuset.ParseList(v)
		case "prio-mode":
			if v != "batch" && v != "sync" {
				err = fmt.Errorf("want batch or sync")
			}
			o.PrioMode = v
		case "sync-interval":
			o.SyncInterval, err = time.ParseDuration(v)
			if err == nil && (o.SyncInterval < 10*time.Millisecond || o.SyncInterval > time.Minute) {
				err = fmt.Errorf("want 10ms..1m")
			}
		case "cpu":
			o.CPU, err = strconv.Atoi(v)
			if err == nil && o.CPU < 0 {
				err = fmt.Errorf("want a core number")
			}
		case "rt":
			o.RT, err = strconv.Atoi(v)
			if err == nil && (o.RT < 2 || o.RT > 96) {
				err = fmt.Errorf("want 2..96 (the ladder goes up to rt+3)")
			}
		case "bulk-rt":
			o.BulkRT, err = strconv.Atoi(v)
			if err == nil && o.BulkRT < 0 {
				err = fmt.Errorf("want 0 (normal scheduling) or a priority below rt")
			}
		case "high-rt":
			o.HighRT, err = strconv.Atoi(v)
			if err == nil && (o.HighRT < 0 || o.HighRT > 99) {
				err = fmt.Errorf("want 0 (normal scheduling) or a priority up to 99")
			}
		case "queue-size":
			o.QueueSize, err = plan.ParseQueueSize(v)
		case "pin":
			o.Pin, err = strconv.ParseBool(v)
		case fast.Param.Key:
			o.Fast, err = strconv.ParseBool(v)
		case "streamline":
			o.Streamline, err = strconv.ParseBool(v)
		case "high":
			if v != HighQueue && v != HighInline && v != HighAuto {
				err = fmt.Errorf("want %s, %s or %s", HighQueue, HighInline, HighAuto)
			}
			o.High = v
		case "high-auto-pps":
			o.HighAutoPPS, err = strconv.Atoi(v)
			if err == nil && (o.HighAutoPPS < 10 || o.HighAutoPPS > 100_000_000) {
				err = fmt.Errorf("want frames per second from 10 to 100000000")
			}
			autoPPS = true
		case "bulk":
			if v != BulkQueue && v != BulkInline && v != BulkAuto {
				err = fmt.Errorf("want %s, %s or %s", BulkQueue, BulkInline, BulkAuto)
			}
			o.Bulk = v
		case "bulk-sched":
			if v != SchedNormal && v != SchedBatch && v != SchedIdle {
				err = fmt.Errorf("want %s, %s or %s", SchedNormal, SchedBatch, SchedIdle)
			}
			o.BulkSched = v
		case "bulk-quiet":
			o.BulkQuiet, err = time.ParseDuration(v)
			if err == nil && o.BulkQuiet != 0 && (o.BulkQuiet < time.Millisecond || o.BulkQuiet > time.Hour || o.BulkQuiet%time.Millisecond != 0) {
				err = fmt.Errorf("want 0 (off) or whole milliseconds from 1ms to 1h")
			}
			bulkQuiet = true
		case "aside-below":
			o.AsideBelow, err = strconv.Atoi(v)
			if err == nil && (o.AsideBelow < 0 || o.AsideBelow > 100) {
				err = fmt.Errorf("want a whole percent from 0 (off) to 100")
			}
			asideGiven = true
		case "aside-depth":
			o.AsideDepth, err = strconv.ParseFloat(v, 64)
			if err == nil && o.AsideDepth != 0 && (o.AsideDepth < 1 || o.AsideDepth > steer.MaxAsideDepth/100 || math.IsNaN(o.AsideDepth)) {
				err = fmt.Errorf("want 0 (receive work alone) or frames per poll from 1 to %d", steer.MaxAsideDepth/100)
			}
			depthGiven = true
		case "quiet":
			o.Quiet, err = time.ParseDuration(v)
			if err == nil && o.Quiet != 0 && (o.Quiet < time.Millisecond || o.Quiet > time.Hour || o.Quiet%time.Millisecond != 0) {
				err = fmt.Errorf("want 0 (off) or whole milliseconds from 1ms to 1h")
			}
		case "veth-queues":
			if v != VethShared && v != VethClass {
				err = fmt.Errorf("want %s or %s", VethShared, VethClass)
			}
			o.VethQueues = v
		case "guard-tasks":
			o.GuardTasks, err = strconv.ParseFloat(v, 64)
			if err == nil && !(o.GuardTasks >= 0 && o.GuardTasks <= 100) {
				err = fmt.Errorf("want a percent from 0 to 100")
			}
			guardTasks = true
		case "netdev-budget":
			o.NetdevBudget, err = strconv.Atoi(v)
			if err == nil && (o.NetdevBudget < 0 || o.NetdevBudget > 100000) {
				err = fmt.Errorf("want 0 (leave it as it is) or frames from 1 to 100000")
			}
		case "guard-nice":
			o.GuardNice, err = strconv.Atoi(v)
			if err == nil && (o.GuardNice < 0 || o.GuardNice > 19) {
				err = fmt.Errorf("want a nice value from 0 to 19")
			}
		default:
			if why, gone := retiredParams[k]; gone {
				return o, errors.New(why)
			}
			return o, fmt.Errorf("unknown prism setting %q", k)
		}
		if err != nil {
			return o, fmt.Errorf("bad prism setting %s=%q: %v", k, v, err)
		}
	}
	if o.BulkSched == "" {
		o.BulkSched = bulkSchedDefault(o)
	}
	if o.High == "" && (autoPPS || (bulkQuiet && o.BulkQuiet != 0)) {
		o.High = HighAuto // a setting of auto's given: auto as if given
		o.highBy = " (implied by high-auto-pps)"
		if !autoPPS {
			o.highBy = " (implied by bulk-quiet)"
		}
	}
	if o.High == "" {
		o.High, o.highDefault = highDefault(o), true
	}
	if o.Bulk == "" {
		o.Bulk, o.bulkDefault = bulkDefault(o), true
	}
	if autoPPS && o.High != HighAuto {
		return o, fmt.Errorf("prism high-auto-pps is high=auto's threshold, but high is %s: drop high-auto-pps or set high=auto", o.High)
	}
	if bulkQuiet && o.BulkQuiet != 0 && o.High != HighAuto {
		return o, fmt.Errorf("prism bulk-quiet is part of high=auto, but high is %s: drop bulk-quiet or set high=auto", o.High)
	}
	if asideGiven && o.AsideBelow != 0 && (o.High != HighAuto || o.Bulk != BulkAuto) {
		return o, fmt.Errorf("prism aside-below=%d steps aside through high=auto's switch, with bulk following by bulk=auto, but high is %s and bulk %s: drop aside-below or use high=auto and bulk=auto", o.AsideBelow, o.High, o.Bulk)
	}
	if depthGiven && o.AsideDepth != 0 && (o.AsideBelow == 0 || o.High != HighAuto || o.Bulk != BulkAuto) {
		return o, fmt.Errorf("prism aside-depth=%g says when to step aside, but stepping aside is off (aside-below=0, or not high=auto and bulk=auto): drop aside-depth or turn aside-below on", o.AsideDepth)
	}
	if o.High != HighAuto || o.Bulk != BulkAuto {
		o.AsideBelow = 0 // the default has nothing to step aside with
	}
	if o.AsideBelow == 0 {
		o.AsideDepth = 0
	}
	if o.High == HighAuto && o.Bulk == BulkInline {
		return o, fmt.Errorf("prism high=auto%s moves high-priority flows between their queue and the NIC poll the way bulk flows move under bulk=queue, and bulk=inline leaves no such move: drop one of them", o.highBy)
	}
	if o.Bulk == BulkAuto && o.High != HighAuto {
		return o, fmt.Errorf("prism bulk=auto runs bulk in the NIC poll beside the busy rules high=auto runs there, but high is %s: drop bulk=auto or set high=auto", o.High)
	}
	if o.Fast && o.PrioMode == "sync" {
		return o, fmt.Errorf("prism x-fast=true with prio-mode=sync: sync's shortcut and the fast path would be two shortcuts for one flow; with x-fast=true, batch already runs a marked flow on the fast path to completion in its queue: drop one of them")
	}
	if o.VethQueues == VethClass && o.PrioMode == "sync" {
		return o, fmt.Errorf("prism veth-queues=class is a batch setting: sync already hands high-priority frames straight to the container veth's NAPI; drop one of them")
	}
	if o.VethQueues == VethClass {
		if !o.Pin {
			return o, fmt.Errorf("prism veth-queues=class needs pin=true: a class change moves a flow between the two pollers once the old queue's frames were taken, which keeps it in order only while both run on the receive core")
		}
		if hi, bulk := vethPollerRT(o); hi <= bulk {
			return o, fmt.Errorf("prism veth-queues=class would run the container veth's high-priority poller at %s, not above the bulk one at %s: give high=queue with a high-rt above bulk-rt (the default), or streamline=true", fifo(hi), fifo(bulk))
		}
	}
	if o.High == HighInline && o.Bulk == BulkInline {
		return o, fmt.Errorf("prism high=inline and bulk=inline leave no class queued, so nothing could preempt anything: set one of them to queue")
	}
	if o.Bulk == BulkInline && o.Streamline {
		return o, fmt.Errorf("prism bulk=inline with streamline=true would run all bulk processing in a real-time NIC poll, starving the applications: drop one of them")
	}
	if o.Bulk == BulkAuto && o.Streamline {
		return o, fmt.Errorf("prism bulk=auto with streamline=true would run bulk processing in a real-time NIC poll beside busy marked services, starving them: use bulk=queue")
	}
	if o.BulkSched != SchedNormal && o.Bulk == BulkInline {
		return o, fmt.Errorf("prism bulk-sched=%s sets the bulk queue's kthread, but bulk=inline has no bulk queue: drop one of them", o.BulkSched)
	}
	if o.Quiet != 0 && (o.Bulk == BulkInline || o.High == HighInline) {
		return o, fmt.Errorf("prism quiet=%v moves bulk between the NIC poll and the bulk queue, which needs bulk=queue or auto and high=queue or auto: drop quiet or the inline setting", o.Quiet)
	}
	if guardTasks && o.BulkSched != SchedIdle {
		return o, fmt.Errorf("prism guard-tasks=%v is the guard's setting for bulk-sched=idle, but bulk-sched is %s: drop guard-tasks or set bulk-sched=idle", o.GuardTasks, o.BulkSched)
	}
	if o.GuardNice != 0 && o.BulkSched != SchedIdle {
		return o, fmt.Errorf("prism guard-nice=%d is the guard's setting for bulk-sched=idle, but bulk-sched is %s: drop guard-nice or set bulk-sched=idle", o.GuardNice, o.BulkSched)
	}
	if o.BulkSched == SchedIdle && o.Streamline {
		return o, fmt.Errorf("prism bulk-sched=idle with streamline=true would put bulk work below a real-time NIC poll and below every application: drop one of them")
	}
	if o.BulkSched != SchedNormal && o.BulkRT > 0 {
		return o, fmt.Errorf("prism bulk-sched=%s is for a normally scheduled bulk queue, but bulk-rt=%d makes it real-time: drop one of them", o.BulkSched, o.BulkRT)
	}
	if o.HighRT >= 0 && o.High == HighInline {
		return o, fmt.Errorf("prism high-rt=%d sets the high-priority queue's kthread, but high=inline has no such queue: drop one of them", o.HighRT)
	}
	if o.NetdevBudget > 0 && o.High == HighInline {
		return o, fmt.Errorf("prism netdev-budget=%d lets the high-priority queue's kthread take the core sooner, but high=inline has no such queue: drop one of them", o.NetdevBudget)
	}
	if o.HighRT == 0 && o.BulkSched != SchedIdle {
		return o, fmt.Errorf("prism high-rt=0 leaves the high-priority queue at normal scheduling, which preempts bulk work only when bulk runs SCHED_IDLE: add bulk-sched=idle")
	}
	if o.HighRT > 0 {
		below, what := o.BulkRT, fmt.Sprintf("bulk-rt %d", o.BulkRT)
		if o.Streamline {
			below, what = o.Ladder().Container, fmt.Sprintf("the ladder's container veths at %d", o.RT+2)
		}
		if o.HighRT <= below {
			return o, fmt.Errorf("prism high-rt %d must be above %s: high-priority frames must preempt that work", o.HighRT, what)
		}
	}
	if o.BulkRT >= o.RT {
		return o, fmt.Errorf("prism bulk-rt %d must be below rt %d: the NIC poll must preempt bulk work", o.BulkRT, o.RT)
	}
	return o, nil
}
