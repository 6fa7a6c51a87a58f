//go:build ignore

/*
 * steer: per-stage core placement for overlay receive (Falcon on stock
 * kernels). Each program finds the inner flow of a frame, hashes it with the
 * hook device and stage into one of BUCKETS buckets, and sends the next
 * stage of the receive path to the core the control plane wrote into that
 * bucket:
 *
 *   steer_xdp         STAGE_SPLIT     underlay NIC, XDP: cpumap redirect, so
 *                                     skb allocation, GRO, outer IP/UDP and
 *                                     VXLAN decap run on the chosen core.
 *   steer_tc_ingress  STAGE_BRIDGE    underlay NIC, tc ingress (before
 *                                     decap): an L4 skb hash that RPS on the
 *                                     VXLAN device turns into the chosen
 *                                     core for bridge + veth transmit.
 *   steer_tc_egress   STAGE_CONTAINER host-side veth, tc egress: an L4 skb
 *                                     hash that RPS on the container-side
 *                                     veth turns into the chosen core for
 *                                     inner IP + TCP/UDP.
 *   steer_tc_seen     (end of CONTAINER) container-side veth, tc ingress:
 *                                     places nothing, counts frames seen.
 *   steer_tc_split_seen (end of SPLIT) underlay tc ingress where
 *                                     steer_tc_ingress is not attached.
 *
 * Each stage counts the frames it queues per flow and the next program
 * counts them seen (steer_xdp's frames are marked in XDP metadata, which
 * reaches the skb), so a flow moves only when its old queue is empty.
 *
 * MFLOW (CFG_MFLOW, CFG_MFLOW_BRIDGE): a flow above a rate threshold (an
 * elephant) is cut into micro-flows of mf_batch consecutive frames, and
 * each micro-flow goes to the next split core, round robin, so the stages
 * after the split run for several micro-flows of one flow in parallel.
 * CFG_MFLOW splits in steer_xdp, before any skb exists (MFLOW's IRQ
 * splitting: cpumap), and marks each frame with its micro-flow's sequence
 * number in XDP metadata; CFG_MFLOW_BRIDGE splits in steer_tc_ingress, by
 * the RPS hash of the VXLAN device (the stages after VXLAN's GRO cell).
 * Micro-flows overtake each other by design: a stock kernel has no
 * reassembly before TCP/UDP, so they bypass the in-flight accounting (never
 * counted, never held by the flowlet rule), and the tc side counts the
 * frames that arrive after a later micro-flow's. Mice (below the
 * threshold) take whatever path the table gives them, with their in-flight
 * counts intact. What may reorder besides micro-flows overtaking each
 * other: when a flow turns into an elephant, its first micro-flow may
 * overtake the frames its mouse path still holds (the NIC poll's GRO, or
 * Falcon's split queue when composed); when it falls back to a mouse, its
 * next frames may overtake the last micro-flow's. Neither waits for a
 * drain: an elephant is already reordering.
 *
 * PRISM-sync (CFG_SYNC, with CFG_PRIO): a high-priority frame whose
 * container the control plane vouches for (steer_sync) is decapsulated
 * here and redirected to that container's host-side veth: it reaches the
 * socket in one pass of the receive core. See sync_dest().
 *
 * Nothing here rewrites a packet byte, drops or consumes a frame, with one
 * exception: PRISM-sync strips the outer headers of the frames it hands to
 * a container, exactly as the VXLAN device would. Whatever is not
 * understood goes on untouched (XDP_PASS, TC_ACT_UNSPEC), so the worst a
 * bug can do is place a stage on the wrong core. place.go mirrors
 * the hashing so the control plane can predict every decision.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "vxlan.h"
#include "lanes_meta.h"
#define MFLOW_TAG_SKB
#include "mflow_tag.h"

char __license[] SEC("license") = "Dual MIT/GPL";

#define STAGE_SPLIT 0
#define STAGE_BRIDGE 1
#define STAGE_CONTAINER 2
#define NUM_STAGES 3

#define MF_SEEN (1ull << 32) /* flow state mf_seen: a sequence number is stored */

#define BUCKETS 256
#define MAX_CPUS 64
#define STAY 0xffffffffu /* table/flow value: leave the stage where the kernel puts it */

/* steer_cfg.flags */
#define CFG_ENABLED 0x1
#define CFG_PRIO 0x2 /* classify flows against steer_prio (PRISM) */
/* steer_xdp marks and counts its frames in flight: set only while a program
 * that counts them seen (steer_tc_ingress, steer_tc_split_seen) is attached
 * to the underlay's tc ingress, or the counts would never drain. */
#define CFG_COUNT_SPLIT 0x4
/* MFLOW: split elephants into micro-flows in steer_xdp (cpumap, before skb
 * allocation), or in steer_tc_ingress (the RPS hash of the VXLAN device). */
#define CFG_MFLOW 0x8
#define CFG_MFLOW_BRIDGE 0x10
/* steer_tc_ingress does not count the bridge stage's frames in flight: set
 * while nothing (steer_tc_egress) counts them seen, or the counts would
 * only grow. */
#define CFG_NO_BRIDGE_COUNT 0x20
/* PRISM-sync: high-priority frames for a destination in steer_sync skip
 * every queue (see sync_dest). Only with CFG_PRIO. */
#define CFG_SYNC 0x40
/* The stage is at home: every flow's stage runs where the kernel runs it
 * and stays there, so its program skips the per-flow state (lookups, clock,
 * in-flight counts) and only keeps vanilla placement. Runtime state, set
 * by lanes agent only when the stage's table is all STAY and no flow's
 * stage is elsewhere; before it leaves home it restarts the stage's stale
 * flow states (deleted; the bridge stage's set back to STAY_FRESH with
 * nothing in flight), so counting starts afresh. PRISM's classification and
 * MFLOW's splitting need the full path: steer_xdp ignores the bit then. */
#define CFG_HOME(stage) (0x80u << (stage))
/* PRISM alone (not with Falcon's placement): while steer_prio holds no rule
 * (prio_shapes 0) there is nothing to preempt for, so bulk flows stay in
 * the NIC poll, vanilla's path, instead of paying the bulk queue's hop;
 * with the first rule each goes to the queue as soon as none of its frames
 * is left behind (place(), PLACE_LOCAL). Set by the planner only where the
 * NIC is polled on the receive core alone, the one the queues are on.
 * With prio_quiet_ms set, also while the high class is quiet: no
 * high-priority frame for that long (see prio_quiet). */
#define CFG_PRIO_IDLE_INLINE 0x400u
/* PRISM's per-class queue at the container veth (steer_tc_veth_class):
 * each class goes to its own receive queue of the container-side veth. */
#define CFG_VETH_CLASS 0x800u
/* The bridge stage stays through the RPS backlog, as before stay_direct:
 * for measuring what running on changes. */
#define CFG_STAY_QUEUED 0x1000u
/* The bridge stage at home runs every frame on without looking its flow up
 * (steer_tc): no flow there can have frames queued in an RPS backlog.
 * Runtime state, set by lanes agent only while the stage is at home and
 * no bridge-stage state that would queue (not running on, on this core)
 * saw a frame within drain_ns (steer.Datapath.HomeQueues); cleared with CFG_HOME. */
#define CFG_HOME_BARE 0x2000u

/* In a flow's cpu_idx: the core's high-priority queue (steer_cpumap_hi)
 * rather than its normal one. Far above any core index, below STAY. */
#define CLASS_HI 0x40000000u
/* A flow's cpu_idx: PRISM-sync's shortcut to the container, no core. */
#define SYNC_IDX 0x20000000u

/* Low bit of the skb hash the tc programs set: the frame was counted into
 * its flow's in-flight count (see hash_counted). */
#define HASH_COUNTED 1u
/* Counts a flow's later-stage frames can belong to (steer_flow_state.epoch),
 * in bits 1-3 of the hash. */
#define HASH_EPOCHS 8

/* Not in the UAPI headers (they live in include/net/ip.h). */
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

/* Longest header chain each parser may read: IPv4 options at their maximum. */
#define MAX_INNER_HDRS (ETH_HLEN + 60 + sizeof(struct tcphdr))
#define MAX_OUTER_HDRS (ETH_HLEN + 60 + sizeof(struct udphdr) + sizeof(struct vxlanhdr) + MAX_INNER_HDRS)

enum counter {
	CNT_STEERED,  /* next stage sent to a chosen core */
	CNT_STAYED,   /* vanilla placement (table says STAY, or the core has no cpumap entry) */
	CNT_PASSED,   /* frame not understood: passed untouched */
	CNT_HELD,     /* a move deferred to keep the flow in order (not idle for a flowlet gap, frames in flight; a container stage holding its core) */
	CNT_MOVED,    /* a flow moved at a flowlet boundary */
	CNT_DISABLED, /* cfg not enabled */
	CNT_UNDRAINED, /* a move after drain_ns although frames were still counted in flight */
	CNT_HIGH,     /* frame of a high-priority flow (CFG_PRIO) */
	CNT_MF_FRAMES,   /* frames of elephants sent to their micro-flow's core */
	CNT_MF_STARTED,  /* micro-flows started */
	CNT_MF_ELEPHANT, /* a flow became an elephant */
	CNT_MF_ENDED,    /* an elephant fell below the threshold */
	CNT_MF_ARRIVED,  /* micro-flow frames whose metadata a tc program read back (per core: where they ran) */
	CNT_MF_LATE,     /* of those, frames of a micro-flow older than one already seen: batch-level reordering */
	CNT_SYNC,        /* high-priority frames decapsulated and handed to their container's veth */
	CNT_SYNC_MISS,   /* high-priority frames (CFG_SYNC) with no vouched-for destination, or too long: batch path */
	CNT_HOME,        /* frames that took the at-home fast path (CFG_HOME): vanilla placement, no flow state */
	CNT_SETTLED,     /* a wait ended: the flow's frames counted in flight were gone, its core's queues seen empty (queue_settled) */
	CNT_DROPPED,     /* later stages: frames counted in flight that the kernel reported dropped (steer_drops_skb) */
	CNT_DIRECT,      /* bridge stage: frames that stayed without a pass through the RPS backlog (stay_direct) */
	CNT_BULK_BESIDE, /* bulk frames bulk=auto kept in the NIC poll beside busy marked flows (bulk_beside_busy) */
	CNT_UNMARKED,    /* frames sent to a core's queue without lanes' metadata (no room left): that queue's counts no longer balance */
	NUM_COUNTERS,
};

struct steer_cfg {
	__u32 ncpus;      /* entries used in cpus and rps_lo; 0 = not configured */
	__u32 rps_span;   /* floor(2^32 / ncpus), capped at 2^32-1 */
	__u64 flowlet_ns; /* idle gap after which a flow may move */
	__u64 drain_ns;   /* idle gap after which a flow may move with frames still
			   * counted in flight (they were dropped); 0: do not wait */
	__u32 vxlan_port; /* outer UDP destination port, host byte order */
	__u32 flags;      /* CFG_* */
	__u32 cpus[MAX_CPUS];   /* core numbers, ascending: the order of the RPS mask */
	__u32 rps_lo[MAX_CPUS]; /* ceil(i * 2^32 / ncpus): lowest hash RPS maps to cpus[i] */
	__u32 index_of[MAX_CPUS]; /* core number -> its index in cpus, or STAY: no per-packet search */
	__u32 prio_shapes; /* bit SHAPE(dir, i): steer_prio holds a rule of that shape (see high_prio) */
	__u32 prio_quiet_ms; /* CFG_PRIO_IDLE_INLINE: also while no high-priority frame came for this long; 0: only while no rule */
	/* MFLOW (CFG_MFLOW, CFG_MFLOW_BRIDGE) */
	__u64 mf_window_ns; /* the elephant test's rate window */
	__u32 mf_thresh;    /* frames within a window from which a flow is an elephant; 0: every flow */
	__u32 mf_batch;     /* frames per micro-flow */
	__u32 mf_ncores;    /* entries used in mf_cores; 0: nothing is split */
	/* This datapath's mark in the metadata's LANES_META_GEN bits, so a
	 * frame marked by a datapath loaded before (still queued during a
	 * re-apply) is not counted out of this one's queues. Set from the
	 * bulk cpumap's map id (low 16 bits), constant while the datapath
	 * lives. */
	__u32 meta_gen;
	__u32 mf_cores[MAX_CPUS]; /* split cores as indices into cpus, in dispatch order */
	/* How far behind the precise clock the coarse one may be (two ticks):
	 * the flowlet test's margin for a coarse stamp (see now_ns). 0: stamp
	 * every packet with the precise clock. */
	__u64 coarse_lag_ns;
	/* The core set before the last change of it (prev_ncpus 0: none):
	 * frames hashed for it may still be queued, and hash_of_count
	 * decodes their hashes with it. */
	__u32 prev_ncpus;
	__u32 prev_span;
	__u32 prev_rps_lo[MAX_CPUS];
	/* PRISM high=auto (with CFG_PRIO_IDLE_INLINE): the frame rate of a
	 * rule's flows from which lanes agent runs them in the NIC poll
	 * (steer_high_inline); read by the agent only. 0: high=auto is off,
	 * and steer_high_inline is ignored. */
	__u32 high_auto_pps;
	/* PRISM high=auto: high-priority frames also run in the NIC poll
	 * while no bulk frame came for this long (bulk_quiet): with no bulk
	 * work to preempt, their queue's kthread hop is pure cost. 0: off. */
	__u32 bulk_quiet_ms;
	/* PRISM bulk=auto (with high=auto): bulk frames also run in the NIC
	 * poll while every high-priority frame of the last bulk_auto_ms ran
	 * there as a busy rule's (bulk_beside_busy). 0: off. */
	__u32 bulk_auto_ms;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, struct steer_cfg);
} steer_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); /* VNI, host byte order */
	__type(value, __u8); /* 1 */
} steer_vni SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_STAGES * BUCKETS);
	__type(key, __u32);   /* stage * BUCKETS + bucket */
	__type(value, __u32); /* index into steer_cfg.cpus, or STAY */
} steer_table SEC(".maps");

struct steer_flow_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 stage;
	__u16 pad; /* always 0: the key is hashed as bytes */
};

struct steer_flow_state {
	__u32 cpu_idx; /* index into steer_cfg.cpus the flow uses, or STAY */
	__u32 ifindex; /* hook device of the last packet */
	__u32 bucket;  /* table bucket of the last packet, so the balancer need not rehash */
	__u32 inline_mark; /* INLINE_*: a move out of the NIC poll under PLACE_LOCAL (see place()) */
	__u64 last_ns; /* arrival of the last packet; low bit: NS_PRECISE (see now_ns) */
	__u64 packets;
	__u64 bytes;
	/* Frames handed to this stage's queue (cpumap ring, RPS backlog) that
	 * the next stage's program has not seen yet. Signed: the two sides
	 * run on different cores and update it atomically. */
	__s64 inflight;
	/* MF_SEEN | the highest sequence number of the micro-flows whose
	 * frames the skb side has seen; 0: none yet (split stage). Every split
	 * core updates it, so it is 64-bit: the compare-and-swap needs that on
	 * BPF CPU v1. */
	__u64 mf_seen;
	/* MFLOW, kept by the program that splits the flow (see microflow()). */
	__u64 mf_win_start;  /* start of the current rate window */
	__u64 mf_frames;     /* frames sent as micro-flows */
	__u32 mf_win_frames; /* frames in the current window */
	__u32 mf_elephant;   /* 1 while the flow is split */
	__u32 mf_started;    /* micro-flows started; the current one's sequence number is mf_started - 1 */
	__u32 mf_left;       /* frames the current micro-flow still takes */
	__u32 mf_core;       /* index into cpus of the current micro-flow */
	__u32 mf_pad;
	/* Split stage: the core (q_key) whose queue accounting took this
	 * flow's last counted frame, and its enqueue count (struct
	 * steer_queue.enq) just after (queue_settled); q_epoch 0: none. */
	__u64 q_epoch;
	__u32 q_key;
	/* Later stages (tc): which count the frames in flight belong to
	 * (HASH_EPOCHS values, in the hash rps_to gives them). A count
	 * presumed drained (an undrained move) starts a new epoch, so frames
	 * of the older one, seen or reported dropped later, do not lower it. */
	__u32 epoch;
	/* Bridge stage at STAY: STAY_* (see stay_direct); 0 after every move. */
	__u32 stay;
	__u32 stay_cpu; /* STAY_DIRECT: the core whose GRO cell it runs on */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct steer_flow_key);
	__type(value, struct steer_flow_state);
} steer_flows SEC(".maps");

/*
 * Container devices lanes adopted after apply (control/follow.go): a
 * container started later gets its programs and RPS maps while its flows
 * may already run, on the core vanilla runs them on, with frames of theirs
 * in flight there that no program counted. Until the deadline, a flow of
 * such a device whose container stage has no state yet starts at STAY,
 * counted, wherever the table points: it leaves for the table's core only
 * through the move rule (an idle gap, nothing in flight), as every flow
 * did when the plan itself was applied with its tables at STAY. After the
 * deadline a flow without state is new (or idle for longer than any queue
 * holds a frame) and takes the table at once, as everywhere. Looked up
 * only when a flow state is created.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);   /* ifindex of the host-side veth (the container stage's hook) */
	__type(value, __u64); /* deadline, bpf_ktime_get_ns() */
} steer_adopt SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32); /* core number */
	__type(value, struct bpf_cpumap_val);
} steer_cpumap SEC(".maps");

/*
 * PRISM's high-priority class: a second cpumap, so each core can have a
 * second queue with its own kthread, which the control plane runs at a
 * higher real-time priority than the first. High-priority frames then
 * overtake bulk frames at the kthreads' batch boundaries (PRISM-batch's
 * batch-level preemption) instead of waiting behind them.
 */
struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32); /* core number */
	__type(value, struct bpf_cpumap_val);
} steer_cpumap_hi SEC(".maps");

/* PRISM's IP/port database: which inner flows are high priority. A flow
 * matches on its destination (dir 0) or source (dir 1) address, with the
 * port and protocol given or 0 for any. */
struct prio_rule {
	__be32 addr;
	__be16 port;  /* 0: any */
	__u8 proto;   /* IPPROTO_TCP, IPPROTO_UDP, 0: any */
	__u8 dir;     /* 0: destination, 1: source */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct prio_rule);
	__type(value, __u8); /* 1 */
} steer_prio SEC(".maps");

/*
 * PRISM-sync's destinations: a (VNI, inner destination MAC) the bridge
 * forwards to a container's host-side veth, on a path where nothing but
 * the forward happens (policy/prism/sync.go decides, lanes agent keeps it
 * fresh). The devmap holds the veths the redirect may use; an entry
 * vanishes with its device.
 */
struct sync_key {
	__u32 vni;   /* host byte order */
	__u8 mac[6]; /* inner destination MAC */
	__u16 pad;   /* 0: the key is hashed as bytes */
};

struct sync_dest {
	__u32 ifindex; /* host-side veth, key of steer_sync_dev */
	__u32 mtu;     /* the container interface's MTU: longer inner frames take the batch path */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sync_key);
	__type(value, struct sync_dest);
} steer_sync SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);   /* ifindex */
	__type(value, __u32); /* the same ifindex (struct bpf_devmap_val without a program) */
} steer_sync_dev SEC(".maps");

/* MFLOW: micro-flows sent to each core. Written once per micro-flow, not
 * per frame, so one shared counter per core costs nothing that matters. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32);   /* core number */
	__type(value, __u64); /* micro-flows */
} steer_mf_cores SEC(".maps");

/*
 * Accounting of each core's split-stage queues (its cpumap entries of both
 * classes, and, where the NIC is polled on that core under PLACE_LOCAL,
 * the frames the NIC poll marks), so a flow whose frames are still counted
 * in flight can tell frames that are gone (dropped: the ring was full, no
 * skb could be allocated) from frames still queued behind a starved
 * kthread. Without it, the only way out was a timeout (drain_ns), and a
 * kthread starved for longer than that let a move overtake its frames
 * (measured: 1277 of 20000 datagrams out of order, docs/prism.md "Under CPU
 * contention a path change could reorder"). Every frame steer_xdp marks
 * for the core is counted in enq; the skb side counts it seen when it
 * reaches the underlay's tc ingress (after the kthread's GRO), and the
 * kernel's cpumap tracepoints count the ones dropped on the way. When seen
 * plus dropped (plus what the control plane booked lost) equals enq, the
 * core's queues hold nothing: every frame that went in before has come out
 * or was dropped. A flow counted in flight whose core's queues were seen
 * empty after its last frame went in (empty_at >= the flow's q_epoch) has
 * nothing left there, whatever its count says. With no other fallback, a
 * frame counted in and then lost where nothing reports it (a redirect that
 * fails after the verdict, another program taking the skb before lanes'
 * tc program) would hold the core's waiting flows until lanes agent books
 * it lost (steer_queue_lost).
 *
 * Two cache lines: the producer's (steer_xdp on the NIC poll's core, and
 * the enqueue tracepoint, which runs there too) and the consumer's (tc
 * ingress and the kthread tracepoint, on the queue's core), so the
 * per-frame counts do not bounce a shared line between cores. The
 * consumer reads the producer's line only when a flow waits for the queue
 * to empty (want > empty_at).
 */
struct steer_queue {
	__u64 enq;         /* frames handed to the queue (marked, counted) */
	__u64 dropped_enq; /* of those, dropped at the ring (xdp_cpumap_enqueue) */
	/* A frame went to one of the core's cpumaps unmarked (no metadata
	 * room, or counting off): the kernel's drop reports may then count
	 * frames enq never did, so the core can never be told empty.
	 * Sticky: its flows fall back to the drain time for good. */
	__u64 untracked;
	__u64 pad0[5];
	__u64 seen;            /* frames of the core's queues the skb side saw */
	__u64 dropped_kthread; /* frames dropped in the kthread before an skb existed (xdp_cpumap_kthread) */
	__u64 empty_at;        /* the highest enq at which the queue was seen empty */
	__u64 want;            /* the highest q_epoch a flow waits for: the consumer checks while want > empty_at */
	__u64 pad1[4];
};

/*
 * One entry per core, not per class: a flow's frames carry the entry's key
 * in their metadata (LANES_META_QID), and GRO, in the kthreads and in the
 * shared VXLAN GRO cell, only merges frames whose metadata is equal. A
 * flow that changes class on its core, or leaves the queue for the NIC
 * poll there, keeps equal metadata, so its frames still merge into one
 * segment in order, as they did before the accounting existed.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32);   /* core number */
	__type(value, struct steer_queue);
} steer_queues SEC(".maps");

/* Frames of a core's queues the control plane found lost: counted in,
 * never seen nor reported dropped, while every thread that could hold
 * them slept and nothing changed (lanes agent's steer.Reconciler). They count as out,
 * so one lost frame does not hold that core's flows for good. Written by
 * the control plane only. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32);   /* core number */
	__type(value, __u64);
} steer_queue_lost SEC(".maps");

/* The kernel ids of steer_cpumap (0) and steer_cpumap_hi (1), which the
 * tracepoints report drops by. Written by the control plane once the
 * drop tracepoints are attached; 0 (not yet, or they could not be) leaves
 * every queue on the drain timeout. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} steer_qmaps SEC(".maps");

/* PRISM high=auto, rule by rule: 1 while the high-priority flows a rule
 * marks run their first stage in the NIC poll that classified them, as
 * bulk does under CFG_PRIO_IDLE_INLINE while no rule exists, instead of
 * taking the high-priority queue. Runtime state of lanes agent, which
 * switches each rule by its frame rate (steer_high_frames): a busy marked
 * service pays the queue's kthread hop on every request; a light one gains
 * from the queue's real-time preemption, also while another rule's service
 * is busy. Heeded only while cfg->high_auto_pps is set, which the planner
 * does only with CFG_PRIO_IDLE_INLINE, whose fast moves (place(),
 * PLACE_LOCAL) take each flow between the queue and the NIC poll in order,
 * without an idle gap. Maps of their own, not a cfg flag nor steer_prio's
 * value: the agent writes them without rewriting what other writers (lanes
 * prio) write. A flow marked by several rules goes by the first that
 * high_prio() finds. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct prio_rule);
	__type(value, __u32); /* 1: inline */
} steer_high_inline SEC(".maps");

/* Frames each rule marked (while cfg->high_auto_pps is set), per core: the
 * agent's rate of the rule. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct prio_rule);
	__type(value, __u64);
} steer_high_frames SEC(".maps");

static __always_inline int high_inline(const struct steer_cfg *cfg, const struct prio_rule *r)
{
	__u64 one = 1, *n;
	__u32 *on;

	if (!cfg->high_auto_pps)
		return 0;
	n = bpf_map_lookup_elem(&steer_high_frames, r);
	if (n)
		*n += 1; /* this core's slot: no other writer */
	else
		bpf_map_update_elem(&steer_high_frames, r, &one, BPF_NOEXIST);
	on = bpf_map_lookup_elem(&steer_high_inline, r);
	return on && *on;
}

/* PRISM high=auto: when the last bulk frame arrived (coarse clock, ns; 0:
 * none yet), for cfg->bulk_quiet_ms; written only when the tick changed,
 * so busy bulk costs one store per tick. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);   /* always 0 */
	__type(value, __u64);
} steer_bulk_seen SEC(".maps");

/* PRISM bulk=auto: when the last high-priority frame of a busy rule ran
 * in the NIC poll (high=auto's switch), and when the last one took its
 * queue (coarse clock, ns; 0: none yet). Stamped only while
 * cfg->bulk_auto_ms is set, once per tick. One entry with both, so a bulk
 * frame's question (bulk_beside_busy) costs one lookup and one clock read. */
struct high_seen {
	__u64 busy;
	__u64 queued;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);   /* always 0 */
	__type(value, struct high_seen);
} steer_high_seen SEC(".maps");

/* PRISM: when the last high-priority frame arrived (coarse clock, ns; 0:
 * none yet), for cfg->prio_quiet_ms. Written only when the tick changed,
 * so a busy high-priority flow costs one store per tick. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);   /* always 0 */
	__type(value, __u64);
} steer_prio_seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NUM_STAGES * NUM_COUNTERS);
	__type(key, __u32); /* stage * NUM_COUNTERS + enum counter */
	__type(value, __u64);
} steer_stats SEC(".maps");

/*
 * PRISM's two queues at the container veth (CFG_VETH_CLASS): the queue a
 * flow's frames take into the container, and how many of them the
 * container side has not seen yet. A flow changes queue (its class
 * changed) only once none is left in the old one, or after drain_ns idle
 * (frames the veth dropped are never seen).
 */
struct veth_class_state {
	__u64 last_ns; /* the flow's last frame through the host-side veth (precise clock) */
	__s64 inflight; /* frames handed to the container veth's queue, not yet seen on its ingress */
	__u32 queue;    /* container-veth receive queue: 0 bulk, 1 high priority */
	/* Which count the frames belong to (VETH_EPOCHS values, in their mark):
	 * a new count starts a new epoch, so frames counted in an older one
	 * (before a drain-time move, or before the state was evicted and made
	 * anew) are not counted out of it. */
	__u32 epoch;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct steer_flow_key); /* stage STAGE_CONTAINER */
	__type(value, struct veth_class_state);
} steer_veth_class SEC(".maps");

struct tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	/* The frame ends a GRO segment of its flow (see mark_inline): a TCP
	 * segment with URG, PSH, RST, SYN or FIN, or without payload, which
	 * make GRO hand the merged segment on at once, or any UDP datagram.
	 * Not part of the flow's identity. */
	__u8 seg_end;
};

/* A read position in a packet; every step is checked against end. */
struct cursor {
	void *pos;
	void *end;
};

static __always_inline void count_n(__u32 stage, __u32 ctr, __u32 n)
{
	__u32 key = stage * NUM_COUNTERS + ctr;
	__u64 *v = bpf_map_lookup_elem(&steer_stats, &key);

	if (v)
		*v += n;
}

static __always_inline void count(__u32 stage, __u32 ctr)
{
	count_n(stage, ctr, 1);
}

static __always_inline void *take(struct cursor *c, __u32 len)
{
	void *p = c->pos;

	if (p + len > c->end)
		return NULL;
	c->pos = p + len;
	return p;
}

/* IPv4 header including options; fragments are refused because only the
 * first carries ports, and steering the rest differently would split them. */
static __always_inline struct iphdr *parse_ipv4(struct cursor *c)
{
	struct iphdr *ip = take(c, sizeof(*ip));
	__u32 opts;

	if (!ip || ip->version != 4 || ip->ihl < 5)
		return NULL;
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return NULL;
	opts = (ip->ihl - 5) * 4;
	if (c->pos + opts > c->end)
		return NULL;
	c->pos += opts;
	return ip;
}

/* TCP flags (byte 13 of the header) that make tcp_gro_receive flush the
 * segment: URG, PSH, RST, SYN, FIN. */
#define TCP_GRO_FLUSH_FLAGS 0x2f

/* Ethernet + IPv4 + a complete TCP or UDP header. */
static __always_inline int parse_inner(struct cursor *c, struct tuple *t)
{
	struct ethhdr *eth = take(c, sizeof(*eth));
	struct iphdr *ip;

	if (!eth || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	ip = parse_ipv4(c);
	if (!ip)
		return -1;
	t->saddr = ip->saddr;
	t->daddr = ip->daddr;
	t->proto = ip->protocol;
	if (ip->protocol == IPPROTO_TCP) {
		struct tcphdr *th = take(c, sizeof(*th));

		if (!th)
			return -1;
		t->sport = th->source;
		t->dport = th->dest;
		/* A segment without payload (a pure ACK) is never merged. */
		t->seg_end = (((__u8 *)th)[13] & TCP_GRO_FLUSH_FLAGS) != 0 ||
			     bpf_ntohs(ip->tot_len) <= ip->ihl * 4 + th->doff * 4;
		return 0;
	}
	if (ip->protocol == IPPROTO_UDP) {
		struct udphdr *uh = take(c, sizeof(*uh));

		if (!uh)
			return -1;
		t->sport = uh->source;
		t->dport = uh->dest;
		/* Inner UDP is not merged by GRO on the underlay (no socket
		 * there asks for UDP GRO), unless the NIC has rx-gro-list or
		 * rx-udp-gro-forwarding on (off by default): lanes assumes
		 * both off, and the plan says so. */
		t->seg_end = 1;
		return 0;
	}
	return -1;
}

/* Where parse_outer found the overlay: for PRISM-sync, which strips the
 * outer headers. */
struct overlay {
	__u32 vni;
	__u32 inner_off; /* offset of the inner Ethernet header */
};

/* parse_outer's answer for a frame of the overlay (a VNI lanes knows)
 * whose inner frame lanes does not parse: inner IPv6, ARP, a fragment. */
#define PARSE_INNER_UNKNOWN (-2)

/* Outer Ethernet/IPv4/UDP/VXLAN of a VNI lanes knows, then the inner flow;
 * ov (may be NULL) gets the VNI and where the inner frame starts. -1: not
 * the overlay; PARSE_INNER_UNKNOWN: the overlay, an inner frame lanes does
 * not parse. */
static __always_inline int parse_outer(struct cursor *c, const struct steer_cfg *cfg, struct tuple *t,
				       struct overlay *ov)
{
	void *start = c->pos;
	struct ethhdr *eth = take(c, sizeof(*eth));
	struct iphdr *ip;
	struct udphdr *uh;
	struct vxlanhdr *vx;
	__u32 vni;

	if (!eth || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	ip = parse_ipv4(c);
	if (!ip || ip->protocol != IPPROTO_UDP)
		return -1;
	uh = take(c, sizeof(*uh));
	if (!uh || uh->dest != bpf_htons((__u16)cfg->vxlan_port))
		return -1;
	vx = take(c, sizeof(*vx));
	if (!vx || !(vx->vx_flags & bpf_htonl(VXLAN_FLAG_VNI)))
		return -1;
	vni = bpf_ntohl(vx->vx_vni) >> 8;
	if (!bpf_map_lookup_elem(&steer_vni, &vni))
		return -1;
	if (ov) {
		ov->vni = vni;
		ov->inner_off = c->pos - start;
	}
	return parse_inner(c, t) < 0 ? PARSE_INNER_UNKNOWN : 0;
}

/*
 * Does a rule in steer_prio match the flow? A rule has one of eight shapes:
 * a side (dir), and port and protocol each given or "any" (i: 0 both, 1
 * port only, 2 protocol only, 3 neither). Only shapes the control plane
 * says exist are looked up (cfg->prio_shapes), so a bulk flow costs one
 * lookup per shape in use, not eight.
 */
static __always_inline int high_prio(const struct steer_cfg *cfg, const struct tuple *t, struct prio_rule *hit)
{
	struct prio_rule r = {};

#pragma unroll
	for (int dir = 0; dir < 2; dir++) {
		r.dir = dir;
		r.addr = dir ? t->saddr : t->daddr;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if (!(cfg->prio_shapes & (1u << (dir * 4 + i))))
				continue;
			r.port = i < 2 ? (dir ? t->sport : t->dport) : 0;
			r.proto = (i % 2) == 0 ? t->proto : 0;
			if (bpf_map_lookup_elem(&steer_prio, &r)) {
				if (hit)
					*hit = r;
				return 1;
			}
		}
	}
	return 0;
}

/*
 * The quiet settings' clock: a one-entry map (steer_prio_seen,
 * steer_bulk_seen) holding when its class's last frame came, on the coarse
 * clock (0: none yet), written only when the tick changed, so a busy class
 * costs one store per tick. quiet_for says whether none came for ms
 * milliseconds (0: the setting is off, never quiet).
 */
static __always_inline int gap_over(const struct steer_cfg *cfg, __u64 stamp, __u64 now, __u32 ms)
{
	if (!stamp)
		return 1; /* none yet */
	/* Both readings are the coarse clock's, so the gap can look a tick
	 * longer than it was: coarse_lag_ns (two ticks) keeps the quiet from
	 * starting early. Signed: a stamp written on another core after our
	 * clock read is no gap at all. */
	return (__s64)(now - stamp) > (__s64)((__u64)ms * 1000000 + cfg->coarse_lag_ns);
}

static __always_inline int quiet_for(const struct steer_cfg *cfg, void *seen, __u32 ms)
{
	__u32 zero = 0;
	__u64 *last;

	if (!ms)
		return 0;
	last = bpf_map_lookup_elem(seen, &zero);
	if (!last)
		return 0;
	return gap_over(cfg, *last, bpf_ktime_get_coarse_ns(), ms);
}

static __always_inline void stamp_at(__u64 *last)
{
	__u64 now = bpf_ktime_get_coarse_ns();

	if (*last != now)
		*last = now;
}

static __always_inline void stamp_tick(void *seen)
{
	__u32 zero = 0;
	__u64 *last = bpf_map_lookup_elem(seen, &zero);

	if (last)
		stamp_at(last);
}

/*
 * Is the high class quiet (cfg->prio_quiet_ms set and no high-priority
 * frame for that long)? Then bulk keeps the NIC poll as while no rule
 * exists: the bulk queue's hop only pays off when there is something to
 * preempt for. A high-priority frame ends the quiet at once (seen_high), and
 * the bulk flows then move to their queue as after a rule's arrival. The
 * price: that first frame finds bulk still in the NIC poll, as in vanilla.
 */
static __always_inline int prio_quiet(const struct steer_cfg *cfg)
{
	return quiet_for(cfg, &steer_prio_seen, cfg->prio_quiet_ms);
}

/*
 * Is bulk quiet (cfg->bulk_quiet_ms set and no bulk frame for that long)?
 * Then high-priority flows run in the NIC poll, as under high=auto's
 * switch: there is nothing to preempt, and their queue's kthread would
 * have to wake for every frame of a light flow. A bulk frame ends the
 * quiet at once (seen_bulk), before the next high-priority frame is
 * classified, and the flows then move back to their queue in order (the
 * fast move). Until a flow's move is done (one of its frames counted in
 * the NIC poll: for inner TCP from its next segment end, see mark_inline)
 * its frames still run in the NIC poll, and so do those polled in the same
 * batch ahead of that bulk frame. Frames steer_xdp does not steer (not
 * VXLAN, other VNIs, inner packets it does not parse) count as bulk too,
 * from PASSED_AS_BULK of them in one tick (seen_passed): they are work in
 * the NIC poll.
 */
static __always_inline int bulk_quiet(const struct steer_cfg *cfg)
{
	return quiet_for(cfg, &steer_bulk_seen, cfg->bulk_quiet_ms);
}

/*
 * Does bulk run in the NIC poll beside busy marked flows (bulk=auto)? Yes
 * while high-priority frames came in the last bulk_auto_ms and every one
 * of them ran in the NIC poll as a busy rule's. The bulk queue exists so
 * that a queued high-priority frame waits behind no bulk frame's full
 * receive work; when no marked frame takes a queue, its hop (a redirect
 * and a second skb build for every bulk frame) buys nothing and costs the
 * core that the busy marked service runs on (measured on 2 cores,
 * 2026-11-25: a marked memcached under a 65% background got 0.58-0.65x of
 * vanilla's request rate with bulk queued). One queued high-priority frame
 * (a light rule's) ends it at once, and bulk flows go back to their queue
 * in order, as after a rule's arrival; that frame, and those right behind
 * it, find bulk still in the NIC poll.
 */
static __always_inline int bulk_beside_busy(const struct steer_cfg *cfg)
{
	__u32 zero = 0, ms = cfg->bulk_auto_ms;
	struct high_seen *seen;
	__u64 now;

	if (!ms)
		return 0;
	seen = bpf_map_lookup_elem(&steer_high_seen, &zero);
	if (!seen)
		return 0;
	now = bpf_ktime_get_coarse_ns();
	return !gap_over(cfg, seen->busy, now, ms) && gap_over(cfg, seen->queued, now, ms);
}

/* bulk=auto's clocks, by where a high-priority frame goes, not where its
 * flow is headed: a busy rule's frame running in the NIC poll, or any
 * other (queued, on sync's shortcut, or inline for a light flow), which
 * gains from bulk keeping its queue. */
static __always_inline void seen_high_placed(const struct steer_cfg *cfg, int busy_inline)
{
	__u32 zero = 0;
	struct high_seen *seen;

	if (!cfg->bulk_auto_ms)
		return;
	seen = bpf_map_lookup_elem(&steer_high_seen, &zero);
	if (seen)
		stamp_at(busy_inline ? &seen->busy : &seen->queued);
}

/* Only while a rule exists: without one no frame is high priority, and
 * the bulk path, the busy one, need not read the clock for nobody. */
static __always_inline void seen_bulk(const struct steer_cfg *cfg)
{
	if (cfg->bulk_quiet_ms && cfg->prio_shapes)
		stamp_tick(&steer_bulk_seen);
}

/* Frames steer_xdp passes without steering them, per core, in the current
 * coarse tick: for bulk quiet, they count as bulk once PASSED_AS_BULK of
 * them came within one tick on one core (2000 frames/s at HZ=250, 8000
 * at HZ=1000), so a flood of
 * traffic it does not steer (another overlay, inner fragments) ends the
 * quiet, and the odd ARP or neighbour solicitation does not. */
#define PASSED_AS_BULK 8

struct passed_tick {
	__u64 tick;
	__u32 n;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct passed_tick);
} steer_passed_tick SEC(".maps");

static __always_inline void seen_passed(const struct steer_cfg *cfg)
{
	struct passed_tick *p;
	__u32 zero = 0;
	__u64 now;

	if (!cfg->bulk_quiet_ms || !cfg->prio_shapes)
		return;
	p = bpf_map_lookup_elem(&steer_passed_tick, &zero);
	if (!p)
		return;
	now = bpf_ktime_get_coarse_ns();
	if (p->tick != now) {
		p->tick = now;
		p->n = 0;
	}
	if (++p->n == PASSED_AS_BULK)
		seen_bulk(cfg);
}

static __always_inline void seen_high(const struct steer_cfg *cfg)
{
	if (cfg->prio_quiet_ms)
		stamp_tick(&steer_prio_seen);
}

static __always_inline __u32 rotl32(__u32 x, int r)
{
	return (x << r) | (x >> (32 - r));
}

/* One murmur3_32 block round. */
static __always_inline __u32 mm3_round(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 fmix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/*
 * murmur3_32 (seed 0) of the 5-tuple as four host-order words. Our own hash,
 * not the skb's: XDP has none, and the skb hash differs between the outer
 * and the inner headers, while every stage must agree on the flow.
 */
static __always_inline __u32 flow_hash(const struct tuple *t)
{
	__u32 h = 0;

	h = mm3_round(h, bpf_ntohl(t->saddr));
	h = mm3_round(h, bpf_ntohl(t->daddr));
	h = mm3_round(h, ((__u32)bpf_ntohs(t->sport) << 16) | bpf_ntohs(t->dport));
	h = mm3_round(h, t->proto);
	return fmix32(h ^ 16);
}

/* Falcon's hash_32(skb_get_hash(skb) + ifindex, 16), plus a stage term so
 * that the stages of one flow land in unrelated buckets. */
static __always_inline __u32 bucket_of(__u32 fh, __u32 ifindex, __u32 stage)
{
	__u32 h = (fh + ifindex + stage * 0x9E3779B9u) * 0x61C88647u >> 16;

	return h % BUCKETS;
}

/* The steer_flows key of a flow's stage. */
static __always_inline struct steer_flow_key flow_key(const struct tuple *t, __u32 stage)
{
	struct steer_flow_key key = {
		.saddr = t->saddr,
		.daddr = t->daddr,
		.sport = t->sport,
		.dport = t->dport,
		.proto = t->proto,
		.stage = stage,
	};

	return key;
}

/* This datapath's mark for the metadata (LANES_META_GEN). */
static __always_inline __u32 meta_gen(const struct steer_cfg *cfg)
{
	return (cfg->meta_gen & LANES_META_GEN_MASK) << LANES_META_GEN_SHIFT;
}

/* Metadata flags as this datapath reads them: 0 for a frame another
 * datapath marked (one loaded before, its frames still queued during a
 * re-apply), whose counts are not this one's. */
static __always_inline __u32 meta_ours(const struct steer_cfg *cfg, __u32 flags)
{
	if (!cfg || ((flags >> LANES_META_GEN_SHIFT) & LANES_META_GEN_MASK) != (cfg->meta_gen & LANES_META_GEN_MASK))
		return 0;
	return flags;
}

/* The core (plus one) whose queue accounting counted a frame with these
 * flags (meta_ours) in, or 0: none. */
static __always_inline __u32 meta_qid(__u32 flags)
{
	return (flags >> LANES_META_QID_SHIFT) & LANES_META_QID_MASK;
}

/* The queue accounting of a core (struct steer_queue), or NULL. */
static __always_inline struct steer_queue *core_queue(__u32 core)
{
	if (core >= MAX_CPUS)
		return NULL;
	return bpf_map_lookup_elem(&steer_queues, &core);
}

/* Can q be told empty? Not if a frame went in unmarked, nor before the
 * drop tracepoints are attached (steer_qmaps, both written at once). */
static __always_inline int queue_tracked(const struct steer_queue *q)
{
	__u32 bulk = 0;
	__u32 *id = bpf_map_lookup_elem(&steer_qmaps, &bulk);

	return q && !q->untracked && id && *id;
}

/* A frame went into q that the skb side cannot count seen. */
static __always_inline void queue_untrack(struct steer_queue *q)
{
	if (q && !q->untracked)
		q->untracked = 1;
}

/*
 * Is q empty now? If so, note at which enqueue count (empty_at). The counts
 * frames leave by are read before the one they enter by, each with a full
 * barrier (fetch-and-add of 0): each is then at most its value at the
 * later read, so out >= in means every frame that went in by then came out
 * or was dropped. Only a flow waiting for the queue makes anyone look, so
 * the producer's line is read from the consumer's core rarely.
 */
static __always_inline int queue_empty_now(struct steer_queue *q, __u32 core)
{
	__u64 *lost = bpf_map_lookup_elem(&steer_queue_lost, &core);
	__u64 out = __sync_fetch_and_add(&q->seen, 0) + __sync_fetch_and_add(&q->dropped_kthread, 0) +
		    __sync_fetch_and_add(&q->dropped_enq, 0) + (lost ? *lost : 0);
	__u64 in = __sync_fetch_and_add(&q->enq, 0);
	__u64 old;

	if (out < in)
		return 0;
	for (int i = 0; i < 4; i++) {
		old = q->empty_at;
		if (old >= in || __sync_val_compare_and_swap(&q->empty_at, old, in) == old)
			break;
	}
	return 1;
}

/*
 * Has everything a flow put into q up to epoch (its q_epoch) come out or
 * been dropped? Yes once the queue was seen empty at that count or later.
 * If not, ask the queue's consumer to look (want): the frames that bring
 * it to empty may be the last it sees for a while.
 */
static __always_inline int queue_settled(struct steer_queue *q, __u32 core, __u64 epoch)
{
	if (q->empty_at >= epoch || queue_empty_now(q, core))
		return 1;
	if (q->want < epoch)
		q->want = epoch;
	return 0;
}

/*
 * The skb side saw n frames of core qid - 1's queues (LANES_META_QID). Called
 * after the frames' per-flow seen(): a flow is settled only once its queue
 * is empty, and by then every frame that came out has already been taken
 * off its flow's count, so a late per-flow decrement cannot cancel a frame
 * of the flow's next path.
 */
static __always_inline void queue_seen(__u32 qid, __u32 n)
{
	struct steer_queue *q;

	if (!qid)
		return;
	q = core_queue(qid - 1);
	if (!q)
		return;
	/* Not atomic: the core's frames come out on that core (its kthread,
	 * or its NIC poll under PLACE_LOCAL), one writer. Were there two
	 * (RPS on the underlay), a lost update would count too few out,
	 * which only makes the core look busy longer (the safe side; lanes
	 * agent books the difference lost once nothing moves). */
	q->seen += n;
	if (q->want > q->empty_at)
		queue_empty_now(q, qid - 1);
}

/*
 * Clock. The precise clock (bpf_ktime_get_ns: a TSC read and its
 * conversion, about 30 ns a packet on the IRQ core of the 2-core Xeon VM,
 * profiled 2026-11-23) is only needed by the flowlet test, which runs
 * while a move is pending, and by MFLOW's rate windows. Other packets
 * stamp the coarse clock (CLOCK_MONOTONIC too, updated every tick, so up
 * to a tick behind). The low bit of a stamp says which clock made it
 * (set: precise; one nanosecond of error). A coarse stamp can be older
 * than the packet it stamps by up to a tick, which would make the idle
 * gap since it look longer than it was, so the flowlet and drain tests
 * take cfg->coarse_lag_ns off a gap measured from a coarse stamp: a move
 * can come later than with precise stamps, never earlier.
 */
#define NS_PRECISE 1ull

static __always_inline __u64 now_ns(const struct steer_cfg *cfg, int precise)
{
	if (precise || !cfg->coarse_lag_ns)
		return bpf_ktime_get_ns() | NS_PRECISE;
	return bpf_ktime_get_coarse_ns() & ~NS_PRECISE;
}

/* The idle gap since stamp at now (a precise reading), at least. */
static __always_inline __u64 idle_since(const struct steer_cfg *cfg, __u64 stamp, __u64 now)
{
	__u64 lag = (stamp & NS_PRECISE) ? 0 : cfg->coarse_lag_ns;

	/* Another core may have stamped it after our clock read. */
	if (now < stamp + lag)
		return 0;
	return now - stamp - lag;
}

/* place()'s opts, for PRISM's classes under CFG_PRIO_IDLE_INLINE (bulk's
 * while no rule exists or the high class is quiet, high's while
 * steer_high_inline says so for the rule that marked them). */
#define PLACE_STAY 0x1  /* leave the stage where the kernel runs it (want STAY) */
#define PLACE_LOCAL 0x2 /* the stage's queue is on this core: see place() */

/* What uncounted() adds for a frame that could not be marked: the count
 * stays above zero until the flowlet rule presumes it dropped (drain_ns
 * idle), so the flow never takes PLACE_LOCAL's fast move past a frame
 * nobody counts. */
#define UNCOUNTED (1ll << 40)

/*
 * steer_flow_state.stay, the bridge stage's way of staying (see
 * stay_direct). A flow starts, and restarts after every move, queued.
 */
#define STAY_FRESH 0  /* no frame of this stint counted in flight yet */
#define STAY_QUEUED 1 /* staying through this core's RPS backlog, counted */
#define STAY_DIRECT 2 /* staying without RPS: the GRO cell's poll runs the stage on */
#define STAY_MODE 3   /* the bits above */
/* A frame of this stint ran on, counted: zero hashes count out (a flow
 * that left STAY_DIRECT for another core or for the backlog may still
 * have such frames in flight). Cleared with the count, on a move or a
 * restart. */
#define STAY_RAN_ON 4

/* steer_flow_state.inline_mark (see mark_inline) */
#define INLINE_COUNT 0x1    /* a move out of the NIC poll waits: mark and count its frames */
#define INLINE_COUNTED 0x2  /* a frame was marked and counted since marking started */
#define INLINE_MARKING 0x4  /* the flow's frames in the NIC poll are being marked */
#define INLINE_BOUNDARY 0x8 /* its last frame there ended a GRO segment: nothing of it is held */

/*
 * A stage that stays (STAY) runs where the stage before it ran, so a move
 * of the split stage moves a staying bridge stage with it: the bridge
 * stage's frames in flight on the old core (in its GRO cell, run on, or in
 * its RPS backlog) could be overtaken by the first frames decapsulated on
 * the new one. So a split-stage move also waits for the in-flight count of
 * the flow's bridge stage when that stays, with the same drain-time
 * presumption as for its own. The bridge stage needs no such wait for the
 * container stage after it: that one holds its core itself (stay_core),
 * which the split stage cannot do for the bridge stage, since no program
 * can send a frame into another core's GRO cell.
 */
static __always_inline int followers_out(const struct steer_cfg *cfg, const struct tuple *t, __u32 stage,
					 __u64 idle)
{
	struct steer_flow_key key;
	struct steer_flow_state *next;

	if (stage != STAGE_SPLIT || !cfg->drain_ns)
		return 1;
	key = flow_key(t, STAGE_BRIDGE);
	next = bpf_map_lookup_elem(&steer_flows, &key);
	return !next || next->cpu_idx != STAY || next->inflight <= 0 || idle >= cfg->drain_ns;
}

/*
 * The container stage of a flow that stays (STAY) runs where the bridge
 * stage ran: its frames queue in the RPS backlog of whatever core that
 * was. That core changes when the bridge stage moves, when the split stage
 * moves while the bridge stage stays, or when an RPS map sends a flow's
 * queued and run-on frames to different cores; the container stage's next
 * frames would then queue on another core than its frames still in
 * flight, and could overtake them. So it holds its core as a move would:
 * STAY_QUEUED with stay_cpu, the core its counted frames were queued on;
 * while any is in flight, the frames go on to that core (RPS can name any
 * core of the set, not only the one it runs on), until the count is out,
 * or presumed lost after drain_ns idle (a new epoch then, as for an
 * undrained move). Returns the index to steer to, or STAY: this core,
 * which becomes the held one. A core outside the set cannot be named:
 * frames queued there went uncounted and the drain time rules.
 */
static __always_inline __u32 stay_core(const struct steer_cfg *cfg, struct steer_flow_state *st, __u64 now)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 idx;

	if (st->stay == STAY_QUEUED && st->stay_cpu == cpu)
		return STAY; /* the common case: nothing to hold, nothing to write */
	if ((st->stay & STAY_MODE) == STAY_QUEUED && st->inflight > 0) {
		idx = st->stay_cpu < MAX_CPUS ? cfg->index_of[st->stay_cpu & (MAX_CPUS - 1)] : STAY;
		if (cfg->drain_ns && idle_since(cfg, st->last_ns, now) >= cfg->drain_ns) {
			st->inflight = 0;
			st->epoch = (st->epoch + 1) % HASH_EPOCHS;
			count(STAGE_CONTAINER, CNT_UNDRAINED);
		} else if (idx < cfg->ncpus) {
			count(STAGE_CONTAINER, CNT_HELD);
			return idx;
		}
	}
	st->stay = STAY_QUEUED;
	st->stay_cpu = cpu;
	return STAY;
}

/* Is ifindex a container device adopted after apply, still in its window
 * (steer_adopt)? */
static __always_inline int adopting(__u32 ifindex)
{
	__u64 *until = bpf_map_lookup_elem(&steer_adopt, &ifindex);

	return until && bpf_ktime_get_ns() < *until;
}

/*
 * The core index the stage of this flow goes to, or STAY. The table says
 * where the flow should go; the flow's state says where it went last.
 * Moving a busy flow would let its packets on the new core overtake those
 * still queued on the old one, so a move waits until the flow has been idle
 * for flowlet_ns and the next stage has seen every frame this stage queued
 * (inflight 0). An idle gap alone is not enough: a starved consumer (a
 * cpumap kthread waiting behind a busy task) can hold frames far longer
 * than any fixed gap. Frames dropped between the two counting points would
 * keep inflight above 0 for ever: on a split-stage cpumap queue the
 * queue's own accounting tells them gone (queue_settled); elsewhere (the
 * RPS backlogs of the later stages, a queue that cannot be tracked) the
 * flow moves anyway after drain_ns idle. A change of priority class (hi: the core's high-priority queue)
 * is a move like any other, and so is a high-priority flow taking
 * PRISM-sync's shortcut (sync: SYNC_IDX), which must not overtake what the
 * flow still has queued. Leaving the shortcut needs no wait: what it
 * delivered is already in the container's queue, ahead of anything the
 * longer path can bring. *out is the flow's state, for the caller's
 * in-flight count (NULL if it could not be stored).
 */
static __always_inline __u32 place(const struct steer_cfg *cfg, const struct tuple *t, __u32 fh,
				   __u32 stage, __u32 ifindex, __u64 len, int hi, int sync,
				   __u32 opts, struct steer_flow_state **out)
{
	struct steer_flow_key key = flow_key(t, stage);
	struct steer_flow_state *st;
	struct steer_queue *q = NULL;
	__u32 bucket = bucket_of(fh, ifindex, stage);
	__u32 slot = stage * BUCKETS + bucket;
	__u32 *entry = bpf_map_lookup_elem(&steer_table, &slot);
	__u32 want = entry ? *entry : STAY;
	/* MFLOW's rate windows want real arrival times. */
	int precise = cfg->mf_ncores != 0;
	__u64 now, idle;
	__u32 was, held = STAY;

	if (want >= cfg->ncpus)
		want = STAY;
	else if (hi)
		want |= CLASS_HI;
	if (opts & PLACE_STAY)
		want = STAY;
	if (sync)
		want = SYNC_IDX;

	st = bpf_map_lookup_elem(&steer_flows, &key);
	if (!st) {
		now = now_ns(cfg, precise);
		if (stage == STAGE_CONTAINER && want != STAY && adopting(ifindex))
			want = STAY;
		struct steer_flow_state fresh = {
			.cpu_idx = want,
			.ifindex = ifindex,
			.bucket = bucket,
			.last_ns = now,
			.packets = 1,
			.bytes = len,
			.inline_mark = INLINE_BOUNDARY,
			/* Unknown to frames of an evicted state, 7 times in 8. */
			.epoch = bpf_get_prandom_u32() % HASH_EPOCHS,
			/* A staying container stage queues here (stay_core). */
			.stay = stage == STAGE_CONTAINER && want == STAY ? STAY_QUEUED : STAY_FRESH,
			.stay_cpu = bpf_get_smp_processor_id(),
		};

		/* A failed insert only loses the history: place by the table.
		 * NOEXIST: if another core inserted the flow meanwhile, its
		 * entry (and in-flight count) stays. */
		bpf_map_update_elem(&steer_flows, &key, &fresh, BPF_NOEXIST);
		*out = bpf_map_lookup_elem(&steer_flows, &key);
		return want;
	}

	/* A pending move needs the precise clock for its flowlet test, and
	 * so does the next packet's test: stamp this one precisely too. */
	now = now_ns(cfg, precise || st->cpu_idx != want);
	was = st->cpu_idx;
	if (st->cpu_idx != want) {
		/* Counted in flight on a cpumap queue whose accounting can tell
		 * it empty (struct steer_queue): frames that were dropped no
		 * longer hold the flow back, and no timeout lets it overtake
		 * frames still queued, however long the queue's kthread starves. */
		/* Not for a flow with a frame that went uncounted (UNCOUNTED):
		 * no core's accounting saw that one, so an empty core proves
		 * nothing about it; the drain time does. */
		if (stage == STAGE_SPLIT && st->inflight > 0 && st->inflight < UNCOUNTED && st->q_epoch) {
			q = core_queue(st->q_key);
			if (!queue_tracked(q)) {
				q = NULL;
			} else if (queue_settled(q, st->q_key, st->q_epoch)) {
				st->inflight = 0;
				count(stage, CNT_SETTLED);
			}
		}
		if (st->cpu_idx == SYNC_IDX) {
			/* Off the shortcut: nothing of the flow is queued behind. */
			st->cpu_idx = want;
			st->inline_mark = INLINE_BOUNDARY;
			count(stage, CNT_MOVED);
		} else if (st->cpu_idx != STAY && (st->cpu_idx & ~CLASS_HI) >= cfg->ncpus) {
			/* The core set shrank under the flow: its old index names
			 * no core any more, so there is no order left to keep. */
			st->cpu_idx = want;
			st->inline_mark = INLINE_BOUNDARY;
			count(stage, CNT_MOVED);
		} else if ((opts & PLACE_LOCAL) && want != SYNC_IDX && st->inflight <= 0 &&
			   (st->cpu_idx != STAY || (st->inline_mark & INLINE_COUNTED))) {
			/* The NIC poll and the queues (either class's) are on
			 * this one core, where the later stages' queues are shared
			 * and fed in order: a frame counted seen has reached them
			 * (the NIC poll and a queue's kthread run a frame from the
			 * seen count to the next queue with bottom halves off),
			 * and with it every earlier frame of its flow (GRO hands a
			 * flow's frames on in order). A queue's frames are always
			 * counted; the NIC poll's only while a move out of it
			 * waits (mark_inline), so that costs nothing while bulk
			 * stays: once one of those was counted and none is in
			 * flight, nothing of the flow is left behind in the NIC
			 * poll's GRO. So the flow moves at once, no idle gap
			 * needed. Not onto sync's shortcut, which skips the shared
			 * queues. Into the NIC poll from a queue, its frames go on
			 * marked until the flow's next segment end: the queue's
			 * frames carry their metadata into the shared GRO cell
			 * after decapsulation, where GRO compares it too. */
			st->inline_mark = want == STAY ? INLINE_MARKING : INLINE_BOUNDARY;
			st->cpu_idx = want;
			count(stage, CNT_MOVED);
		} else if ((idle = idle_since(cfg, st->last_ns, now)) >= cfg->flowlet_ns &&
			   (st->inflight <= 0 || !cfg->drain_ns || (!q && idle >= cfg->drain_ns)) &&
			   followers_out(cfg, t, stage, idle)) {
			if (st->inflight > 0) {
				/* Presumed dropped: start counting afresh. Never
				 * from a tracked queue (q), which settles instead. */
				if (cfg->drain_ns)
					count(stage, CNT_UNDRAINED);
				st->inflight = 0;
				st->epoch = (st->epoch + 1) % HASH_EPOCHS;
			}
			st->cpu_idx = want;
			/* An idle gap: the NIC poll's GRO holds nothing of it. */
			st->inline_mark = INLINE_BOUNDARY;
			count(stage, CNT_MOVED);
		} else {
			if ((opts & PLACE_LOCAL) && st->cpu_idx == STAY)
				st->inline_mark |= INLINE_COUNT;
			count(stage, CNT_HELD);
		}
	} else if (st->inline_mark & INLINE_COUNT) {
		/* The move it waited for was called off (the rule went):
		 * mark_inline stops marking at the next segment end. */
		st->inline_mark &= ~INLINE_COUNT;
	}
	if (st->cpu_idx != was) {
		st->stay = STAY_FRESH;
	} else if (was == STAY && stage == STAGE_BRIDGE && (st->stay & STAY_MODE) == STAY_QUEUED && st->inflight > 0 &&
		   cfg->drain_ns && idle_since(cfg, st->last_ns, now) >= cfg->drain_ns) {
		/* Staying queued (stay_direct) with frames counted in flight
		 * after drain_ns idle: presumed dropped, as for a move, so a
		 * lost frame does not keep the flow queuing (and the stage
		 * from home) for as long as it lives. Fresh, not straight to
		 * running on: a frame still queued, starved past drain_ns, is
		 * then overtaken by nothing, since the next counted frame
		 * queues behind it. */
		st->inflight = 0;
		st->epoch = (st->epoch + 1) % HASH_EPOCHS;
		st->stay = STAY_FRESH;
		count(stage, CNT_UNDRAINED);
	}
	if (stage == STAGE_CONTAINER && st->cpu_idx == STAY)
		held = stay_core(cfg, st, now);
	st->ifindex = ifindex;
	st->bucket = bucket;
	st->last_ns = now;
	st->packets++;
	st->bytes += len;
	*out = st;
	return held != STAY ? held : st->cpu_idx;
}

/* This stage queued n more frames of the flow. */
static __always_inline void queued(struct steer_flow_state *st, __u32 n)
{
	if (st)
		__sync_fetch_and_add(&st->inflight, n);
}


/* A frame of the flow went on uncounted. Added once, not per frame, so the
 * count cannot wrap around to a value that lets a move through. */
static __always_inline void uncounted(struct steer_flow_state *st)
{
	if (st && st->inflight < UNCOUNTED)
		__sync_fetch_and_add(&st->inflight, UNCOUNTED);
}

/*
 * Mark the frame in XDP metadata (in the headroom: no packet byte changes),
 * which reaches the skb, where steer_tc_ingress or steer_tc_split_seen
 * counts it seen, and count it in flight. qid: the core whose queue
 * accounting counts it, plus one (LANES_META_QID). 0 if the driver gave no
 * room.
 */
static __always_inline int mark_queued(struct xdp_md *ctx, struct steer_flow_state *st, __u32 qid,
				       const struct steer_cfg *cfg)
{
	struct lanes_meta *meta;

	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*meta)) != 0)
		return 0;
	meta = (void *)(long)ctx->data_meta;
	if ((void *)(meta + 1) > (void *)(long)ctx->data)
		return 0;
	meta->magic = LANES_META_MAGIC;
	meta->flags = LANES_META_QUEUED | (qid << LANES_META_QID_SHIFT) | meta_gen(cfg);
	queued(st, 1);
	return 1;
}

/*
 * mark_queued for core's queue accounting (struct steer_queue): the frame
 * carries the core in its metadata and is counted in there, and the flow
 * notes where and at which count. to_cpumap: it goes to one of the core's
 * cpumap entries (else it stays in the NIC poll). 1 if marked.
 */
static __always_inline int mark_counted(struct xdp_md *ctx, const struct steer_cfg *cfg,
					struct steer_flow_state *st, __u32 core, int to_cpumap)
{
	struct steer_queue *q = core_queue(core);
	__u64 epoch;

	if (!mark_queued(ctx, st, core + 1, cfg)) {
		/* A frame the cpumap may drop, which the kernel then reports
		 * with the marked ones: the core's counts can no longer
		 * balance. (Unmarked in the NIC poll, it touches no count.) */
		if (to_cpumap) {
			queue_untrack(q);
			count(STAGE_SPLIT, CNT_UNMARKED);
		}
		return 0;
	}
	if (q) {
		epoch = __sync_fetch_and_add(&q->enq, 1) + 1;
		if (st) {
			st->q_epoch = epoch;
			st->q_key = core;
		}
	}
	return 1;
}

/*
 * A frame of a flow that runs in the NIC poll under PLACE_LOCAL. While a
 * move out of the NIC poll waits (INLINE_COUNT) its frames are marked and
 * counted in flight like a queue's: once one was counted seen, with none
 * in flight, the NIC poll's GRO holds nothing of the flow (place()). GRO
 * merges only frames with equal metadata, so marking must not start or
 * stop in the middle of a GRO segment: a marked segment handed on early
 * (a PSH) would overtake the unmarked one held before it. So it starts
 * and stops only after a frame that ended a segment (INLINE_BOUNDARY).
 * A flow that came back from a queue starts marked (place()): the queue's
 * frames reach the shared VXLAN GRO cell with their metadata.
 */
static __always_inline void mark_inline(struct xdp_md *ctx, const struct steer_cfg *cfg,
					struct steer_flow_state *st, int seg_end)
{
	__u32 m = st->inline_mark;
	int want = (m & INLINE_COUNT) != 0;

	if (want != ((m & INLINE_MARKING) != 0) && (m & INLINE_BOUNDARY))
		m = want ? (m | INLINE_MARKING) : (m & ~(INLINE_MARKING | INLINE_COUNTED));
	if (m & INLINE_MARKING) {
		/* PLACE_LOCAL: this core is the queues' core. */
		if (mark_counted(ctx, cfg, st, bpf_get_smp_processor_id(), 0))
			m |= INLINE_COUNTED;
		else
			uncounted(st);
	}
	m = seg_end ? (m | INLINE_BOUNDARY) : (m & ~INLINE_BOUNDARY);
	if (m != st->inline_mark)
		st->inline_mark = m;
}

/* n frames counted in the flow's stage count are out (seen by the next
 * stage's program, or reported dropped). The count never goes below zero
 * on purpose, since a negative count would let a later move through while
 * frames are still queued. Compare-and-swap, so a racing update on another
 * core is retried, not lost; a few tries bound the loop for the verifier.
 * Giving up leaves the count high: the safe side. */
static __always_inline void count_out(__s64 *inflight, __s64 n)
{
	for (int i = 0; i < 4; i++) {
		__s64 old = *inflight, new;

		if (old <= 0)
			return;
		new = old > n ? old - n : 0;
		if (__sync_val_compare_and_swap(inflight, old, new) == old)
			return;
	}
}

/*
 * The program of the next stage has seen n frames the given stage of the
 * flow queued. A flow or stage that was never counted is left alone.
 */
static __always_inline void seen(const struct tuple *t, __u32 stage, __u32 n)
{
	struct steer_flow_key key = flow_key(t, stage);
	struct steer_flow_state *st = bpf_map_lookup_elem(&steer_flows, &key);

	if (st)
		count_out(&st->inflight, n);
}

/* The count epoch in a hash rps_hash gave on a core set of n cores (lo:
 * its ranges' starts); garbage for any other hash. */
static __always_inline __u32 epoch_in(const __u32 *lo, __u32 n, __u32 hash)
{
	__u64 idx = ((__u64)hash * n) >> 32;

	/* The verifier cannot bound a product: mask after the compiler's
	 * view of it is hidden. */
	barrier_var(idx);
	idx &= MAX_CPUS - 1;
	return ((hash - ((lo[idx] + 1) & ~1u)) >> 1) % HASH_EPOCHS;
}

/*
 * seen() for a later stage (tc), whose frames carry their count in the
 * hash rps_to gave them: only counted frames of the flow's current count
 * (epoch) are counted out, so frames of a count presumed drained (an
 * undrained move) do not lower the next one. The flow is the one whose
 * state the frame's 5-tuple found, so only the epoch is read from the
 * hash (cheaply: steer_drops_skb, which must also find flow and stage
 * from it, checks it whole); on the current core set or, for frames
 * hashed before it last changed, the previous one. No hash at all
 * (BPF_PROG_RUN) counts; a zero hash on a frame from a device is one the
 * bridge stage ran on (stay_direct), which carries no epoch.
 */
static __always_inline void seen_hashed(const struct steer_cfg *cfg, const struct tuple *t, __u32 stage,
					__u32 n, __u32 hash, __u32 ingress_ifindex)
{
	struct steer_flow_key key = flow_key(t, stage);
	struct steer_flow_state *st = bpf_map_lookup_elem(&steer_flows, &key);

	if (!st)
		return;
	/* A zero hash on a frame a device received is one the bridge stage
	 * ran on (stay_direct), counted only under STAY_RAN_ON; under
	 * BPF_PROG_RUN (no device) it is a frame no program hashed. */
	if (!hash && ingress_ifindex && !(st->stay & STAY_RAN_ON))
		return;
	if (hash && (!(hash & HASH_COUNTED) ||
		     (epoch_in(cfg->rps_lo, cfg->ncpus, hash) != st->epoch &&
		      (!cfg->prev_ncpus || epoch_in(cfg->prev_rps_lo, cfg->prev_ncpus, hash) != st->epoch))))
		return;
	count_out(&st->inflight, n);
}

/*
 * MFLOW's elephant test, on n more frames of the flow at now: is the flow
 * above the rate threshold? A window of mf_window_ns starts with the first
 * frame after the previous one closed. The flow becomes an elephant with
 * the frame that brings its window to mf_thresh frames, and stays one while
 * every window reaches it; it falls back when a window closes short, or
 * when a whole window passed without a frame (age >= 2 windows). A flow
 * that turns into an elephant starts a new micro-flow. With mf_thresh 0
 * every flow is an elephant from its first frame and stays one.
 */
static __always_inline int elephant(const struct steer_cfg *cfg, struct steer_flow_state *st,
				    __u64 now, __u32 n, __u32 stage)
{
	__u64 age = now - st->mf_win_start;

	if (age >= cfg->mf_window_ns) {
		if (st->mf_elephant && cfg->mf_thresh &&
		    (st->mf_win_frames < cfg->mf_thresh || age >= 2 * cfg->mf_window_ns)) {
			st->mf_elephant = 0;
			count(stage, CNT_MF_ENDED);
		}
		st->mf_win_start = now;
		st->mf_win_frames = 0;
	}
	st->mf_win_frames += n;
	if (!st->mf_elephant && st->mf_win_frames >= cfg->mf_thresh) {
		st->mf_elephant = 1;
		st->mf_left = 0;
		count(stage, CNT_MF_ELEPHANT);
	}
	return st->mf_elephant;
}

/* Start the flow's next micro-flow on the next split core, round robin by
 * sequence number (one division per micro-flow, none per frame). */
static __always_inline void next_microflow(const struct steer_cfg *cfg, struct steer_flow_state *st,
					   __u32 stage)
{
	__u32 slot = st->mf_started % cfg->mf_ncores;
	__u32 idx = cfg->mf_cores[slot & (MAX_CPUS - 1)];
	__u32 core = cfg->cpus[idx & (MAX_CPUS - 1)];
	__u64 *sent = bpf_map_lookup_elem(&steer_mf_cores, &core);

	st->mf_core = idx;
	st->mf_started++;
	st->mf_left = cfg->mf_batch;
	count(stage, CNT_MF_STARTED);
	if (sent)
		__sync_fetch_and_add(sent, 1);
}

/*
 * MFLOW's split of n frames (a GRO-merged skb counts gso_segs) of a flow:
 * the index into cfg->cpus of the micro-flow they belong to, or STAY for a
 * mouse, which keeps whatever placement it has. Micro-flow k of an
 * elephant is frames [k * batch, (k + 1) * batch) since it became one and
 * goes to mf_cores[k % mf_ncores]; a GRO skb across a boundary stays whole
 * in the micro-flow it starts in. st->last_ns is the arrival time place()
 * just stored.
 *
 * One writer, no atomics: a flow's frames reach the splitting program from
 * one rx queue (RSS keeps a flow on one queue), whose NAPI poll runs on one
 * core at a time; tc ingress on the underlay runs there too, or, when
 * Falcon's split stage composes, on the one split core the flow is placed
 * on at a time.
 */
static __always_inline __u32 microflow(const struct steer_cfg *cfg, struct steer_flow_state *st,
				       __u32 n, __u32 stage)
{
	if (!cfg->mf_ncores || !cfg->mf_batch || !elephant(cfg, st, st->last_ns, n, stage))
		return STAY;
	if (st->mf_left == 0)
		next_microflow(cfg, st, stage);
	if (st->mf_core >= cfg->ncpus)
		return STAY; /* the core set shrank under a stale config: vanilla */
	st->mf_left = st->mf_left > n ? st->mf_left - n : 0;
	return st->mf_core;
}

/* n frames of the flow went to their micro-flow's core. */
static __always_inline void split_sent(struct steer_flow_state *st, __u32 n, __u32 stage)
{
	st->mf_frames += n;
	count_n(stage, CNT_MF_FRAMES, n);
}

/*
 * n frames of micro-flow seq of the flow reached the skb side (tc ingress
 * on the underlay, on the core the micro-flow was sent to): count them on
 * this core, and as late if a later micro-flow of the flow was already seen
 * here, the batch-level reordering a reassembler would have to undo. Every
 * split core updates the flow's mf_seen, so the maximum is kept by
 * compare-and-swap; giving up after a few tries only loses a late count.
 * The sequence is 32 bits (2^32 micro-flows of 256 frames is 12 days at
 * 1 Mpps), so it is compared in serial-number order and may wrap.
 */
static __always_inline void arrived(const struct tuple *t, __u32 seq, __u32 n)
{
	struct steer_flow_key key = flow_key(t, STAGE_SPLIT);
	struct steer_flow_state *st = bpf_map_lookup_elem(&steer_flows, &key);
	__u64 old;
	__s32 ahead;

	count_n(STAGE_SPLIT, CNT_MF_ARRIVED, n);
	if (!st)
		return;
	for (int i = 0; i < 4; i++) {
		old = st->mf_seen;
		/* Serial-number order, so the 32-bit sequence may wrap. */
		ahead = (__s32)(seq - (__u32)old);
		if ((old & MF_SEEN) && ahead == 0)
			return;
		if ((old & MF_SEEN) && ahead < 0) {
			count_n(STAGE_SPLIT, CNT_MF_LATE, n);
			return;
		}
		if (__sync_val_compare_and_swap(&st->mf_seen, old, MF_SEEN | seq) == old)
			return;
	}
}

/* Frames a (possibly GRO-merged) skb stands for. */
static __always_inline __u32 skb_frames(const struct __sk_buff *skb)
{
	return skb->gso_segs > 1 ? skb->gso_segs : 1;
}

static __always_inline struct steer_cfg *get_cfg(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&steer_cfg, &zero);
}

/*
 * Hand a micro-flow's frame to its core's cpumap entry, marked with the
 * micro-flow's sequence number for the skb side. Not counted in flight and
 * not subject to the flowlet rule: micro-flows are meant to overtake each
 * other. A core without a cpumap entry falls back to XDP_PASS (vanilla);
 * without metadata room the frame still goes, unmarked.
 */
static __always_inline int split_microflow(struct xdp_md *ctx, const struct steer_cfg *cfg,
					   struct steer_flow_state *st, __u32 idx)
{
	struct lanes_meta_mflow *meta;
	__u32 core = cfg->cpus[idx & (MAX_CPUS - 1)];
	struct steer_queue *q = core_queue(core);
	long ret = bpf_redirect_map(&steer_cpumap, core, XDP_PASS);

	if (ret != XDP_REDIRECT) {
		count(STAGE_SPLIT, CNT_STAYED);
		return ret;
	}
	split_sent(st, 1, STAGE_SPLIT);
	/* Its queue counts it like any other frame (struct steer_queue): a
	 * mouse sharing the queue may wait for it to empty. */
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*meta)) == 0) {
		meta = (void *)(long)ctx->data_meta;
		if ((void *)(meta + 1) <= (void *)(long)ctx->data) {
			meta->hdr.magic = LANES_META_MAGIC;
			meta->hdr.flags = LANES_META_MFLOW | (((core & LANES_META_QID_MASK) + 1) << LANES_META_QID_SHIFT) |
					  meta_gen(cfg);
			meta->seq = st->mf_started - 1;
			if (q)
				__sync_fetch_and_add(&q->enq, 1);
			return ret;
		}
	}
	queue_untrack(q);
	count(STAGE_SPLIT, CNT_UNMARKED);
	return ret;
}

/*
 * PRISM-sync: the host-side veth a high-priority frame may go to directly,
 * or 0. The control plane lists a (VNI, inner destination MAC) only where
 * the bridge forwards that MAC to that veth and nothing on the way could
 * act on the frame; a frame longer than the container's MTU would be
 * dropped by the veth, so it takes the batch path (CNT_SYNC_MISS).
 */
static __always_inline __u32 sync_dest(struct xdp_md *ctx, const struct overlay *ov)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data + (ov->inner_off & 0xff); /* < 256: outer headers, IPv4 options at most */
	struct sync_key key = { .vni = ov->vni };
	struct sync_dest *d;

	if ((void *)(eth + 1) > data_end)
		return 0;
	__builtin_memcpy(key.mac, eth->h_dest, sizeof(key.mac));
	d = bpf_map_lookup_elem(&steer_sync, &key);
	if (!d || data_end - (void *)eth - ETH_HLEN > d->mtu) {
		count(STAGE_SPLIT, CNT_SYNC_MISS);
		return 0;
	}
	return d->ifindex;
}

/*
 * Strip the outer Ethernet/IPv4/UDP/VXLAN headers, as the VXLAN device
 * would, and hand the inner frame to the container's host-side veth: the
 * veth's transmit puts it on its peer's queue, whose NAPI runs next on
 * this core and takes it through inner IP and UDP/TCP to the socket.
 * The devmap is checked first, so a vanished veth leaves the frame whole
 * on the normal path; a redirect that still fails (the device went in
 * between) drops the frame, which then no longer is a valid overlay frame.
 */
static __always_inline int sync_redirect(struct xdp_md *ctx, const struct overlay *ov, __u32 ifindex)
{
	if (!bpf_map_lookup_elem(&steer_sync_dev, &ifindex) ||
	    bpf_xdp_adjust_head(ctx, (int)(ov->inner_off & 0xff))) {
		count(STAGE_SPLIT, CNT_SYNC_MISS);
		return XDP_PASS;
	}
	count(STAGE_SPLIT, CNT_SYNC);
	return bpf_redirect_map(&steer_sync_dev, ifindex, XDP_DROP);
}

SEC("xdp")
int steer_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct cursor c = { .pos = data, .end = data_end };
	struct steer_cfg *cfg = get_cfg();
	struct tuple t = {};
	struct steer_flow_state *st = NULL;
	struct overlay ov = {};
	struct prio_rule rule = {};
	__u32 idx, core, dest = 0, opts = 0;
	__u64 cpu;
	long ret;
	int hi, busy = 0, beside = 0;

	if (!cfg || !(cfg->flags & CFG_ENABLED)) {
		count(STAGE_SPLIT, CNT_DISABLED);
		return XDP_PASS;
	}
	if ((cfg->flags & CFG_HOME(STAGE_SPLIT)) && !(cfg->flags & (CFG_PRIO | CFG_MFLOW))) {
		count(STAGE_SPLIT, CNT_HOME);
		return XDP_PASS;
	}
	if (parse_outer(&c, cfg, &t, &ov) < 0) {
		/* Not ours to steer (not VXLAN, another port or VNI, an inner
		 * packet we do not parse), but work in the NIC poll all the
		 * same: no bulk quiet while it comes in numbers. */
		seen_passed(cfg);
		count(STAGE_SPLIT, CNT_PASSED);
		return XDP_PASS;
	}
	hi = (cfg->flags & CFG_PRIO) && high_prio(cfg, &t, &rule);
	if (hi) {
		count(STAGE_SPLIT, CNT_HIGH);
		if (cfg->flags & CFG_SYNC)
			dest = sync_dest(ctx, &ov);
	}
	if (cfg->flags & CFG_PRIO_IDLE_INLINE) {
		if (hi) {
			busy = high_inline(cfg, &rule); /* counts the rule's frame too */
			seen_high(cfg);
			if (busy || bulk_quiet(cfg))
				opts |= PLACE_STAY;
		} else {
			seen_bulk(cfg);
			if (!cfg->prio_shapes || prio_quiet(cfg)) {
				opts |= PLACE_STAY;
			} else if (bulk_beside_busy(cfg)) {
				opts |= PLACE_STAY;
				beside = 1;
			}
		}
		/* The fast move needs every frame counted, inline ones too. */
		if ((cfg->flags & CFG_COUNT_SPLIT) && cfg->ncpus == 1 && cfg->cpus[0] == bpf_get_smp_processor_id())
			opts |= PLACE_LOCAL;
	}
	/* data_end - data subtracts packet pointers, which the verifier
	 * allows only with CAP_PERFMON: the loader runs as root anyway. */
	idx = place(cfg, &t, flow_hash(&t), STAGE_SPLIT, ctx->ingress_ifindex, data_end - data, hi, dest != 0, opts, &st);
	if (hi)
		seen_high_placed(cfg, busy && idx == STAY);
	else if (beside && idx == STAY)
		count(STAGE_SPLIT, CNT_BULK_BESIDE); /* not while its move waits */
	if (idx == SYNC_IDX)
		return sync_redirect(ctx, &ov, dest);
	/* High-priority flows are PRISM's: never split. */
	if ((cfg->flags & CFG_MFLOW) && st && !hi) {
		__u32 mf = microflow(cfg, st, 1, STAGE_SPLIT);

		if (mf != STAY)
			return split_microflow(ctx, cfg, st, mf);
	}
	cpu = idx & ~CLASS_HI;
	if (idx == STAY || cpu >= MAX_CPUS) {
		count(STAGE_SPLIT, CNT_STAYED);
		if ((opts & PLACE_LOCAL) && st)
			mark_inline(ctx, cfg, st, t.seg_end);
		return XDP_PASS;
	}
	/* The mask is a no-op after the check; it lets the verifier see the
	 * bound the compiler may have moved away. */
	core = cfg->cpus[cpu & (MAX_CPUS - 1)];
	/* A core without a cpumap entry falls back to XDP_PASS: vanilla. */
	if (idx & CLASS_HI)
		ret = bpf_redirect_map(&steer_cpumap_hi, core, XDP_PASS);
	else
		ret = bpf_redirect_map(&steer_cpumap, core, XDP_PASS);
	if (ret != XDP_REDIRECT) {
		/* No queue there after all: the frame runs on in the NIC poll,
		 * uncounted, behind the flow's place. */
		count(STAGE_SPLIT, CNT_STAYED);
		/* The flow's own count says so (UNCOUNTED), and its moves
		 * fall back to the drain time: the core's accounting never
		 * saw this frame and stays right. */
		if (opts & PLACE_LOCAL)
			uncounted(st);
		return ret;
	}
	count(STAGE_SPLIT, CNT_STEERED);
	/* Mark the frame so tc ingress on the split core can count it seen,
	 * for its flow and for its queue. Without metadata room (some
	 * drivers) the frame goes uncounted, the queue can no longer be told
	 * empty, and moves of this flow fall back to the idle gap alone (and,
	 * under PLACE_LOCAL, to the drain time). */
	if (!(cfg->flags & CFG_COUNT_SPLIT))
		queue_untrack(core_queue(core));
	else if (!mark_counted(ctx, cfg, st, core, 1) && (opts & PLACE_LOCAL))
		uncounted(st);
	return ret;
}

/* The index of the core this program runs on, or STAY if it is not in the set. */
static __always_inline __u32 this_cpu_index(const struct steer_cfg *cfg)
{
	__u32 cpu = bpf_get_smp_processor_id();

	return cpu < MAX_CPUS ? cfg->index_of[cpu] : STAY;
}


/* The flow bits of a later stage's hash: the stages hash apart, so a
 * frame's hash tells which stage's count it is in (steer_drops_skb). */
static __always_inline __u32 stage_fh(__u32 fh, __u32 stage)
{
	return stage == STAGE_CONTAINER ? fmix32(fh ^ 0x9e3779b9u) : fh;
}

/*
 * The hash rps_to gives a frame of the flow (fh) at the stage, steered to
 * cfg->cpus[idx], counted (in the count of epoch) or not; 0 if the core set
 * leaves no room. Any value in [rps_lo[idx], rps_lo[idx] + rps_span)
 * selects cpus[idx]; inside that range the flow's own bits keep flows apart
 * (GRO, the flow dissector), and the low four bits carry the count's epoch
 * and HASH_COUNTED.
 */
static __always_inline __u32 range_hash(__u32 lo, __u32 span, __u32 fh, __u32 stage, __u32 epoch);

static __always_inline __u32 rps_hash(const struct steer_cfg *cfg, __u64 idx, __u32 fh, __u32 stage,
				      __u32 epoch, int counted)
{
	__u32 v;

	if (idx >= MAX_CPUS || cfg->rps_span < 2 * 2 * HASH_EPOCHS)
		return 0;
	/* Masked where the compiler cannot drop the mask as redundant: it may
	 * index with a copy of idx the check above did not bound. */
	barrier_var(idx);
	v = range_hash(cfg->rps_lo[idx & (MAX_CPUS - 1)], cfg->rps_span, fh, stage, epoch) -
	    (counted ? 0 : HASH_COUNTED);
	/* 0 means "no hash" to the stack, which would recompute one. */
	return v ? v : 2;
}

/*
 * The hash a counted frame of the flow (fh) at the stage gets on the core
 * whose RPS range is [lo, lo + span), in the count of epoch: pairs of
 * hashes inside the range, in runs of HASH_EPOCHS pairs.
 */
static __always_inline __u32 range_hash(__u32 lo, __u32 span, __u32 fh, __u32 stage, __u32 epoch)
{
	__u32 base = (lo + 1) & ~1u, slots = (span - 1) / 2 / HASH_EPOCHS;
	__u32 v = base + ((stage_fh(fh, stage) % slots) * HASH_EPOCHS + (epoch % HASH_EPOCHS)) * 2 + HASH_COUNTED;

	return v;
}

/* hash_of_count on one core set (n cores, the idx-th from lo[idx]). */
static __always_inline int decode_hash(const __u32 *lo, __u32 n, __u32 span, __u32 hash, __u32 fh, __u32 stage,
				       __u32 *epoch)
{
	__u64 idx;

	if (!n || n > MAX_CPUS || span < 2 * 2 * HASH_EPOCHS)
		return 0;
	idx = ((__u64)hash * n) >> 32;
	/* As in epoch_in. */
	barrier_var(idx);
	idx &= MAX_CPUS - 1;
	*epoch = epoch_in(lo, n, hash);
	return range_hash(lo[idx], span, fh, stage, *epoch) == hash;
}

/*
 * Is hash one rps_to gave a counted frame of the flow (fh) at the stage?
 * Then *epoch is the count it went into. The core is the one RPS picks from
 * the hash, as the kernel does it, on the current core set or, for frames
 * hashed before it last changed, the previous one.
 */
static __always_inline int hash_of_count(const struct steer_cfg *cfg, __u32 hash, __u32 fh, __u32 stage,
					 __u32 *epoch)
{
	if (!(hash & HASH_COUNTED))
		return 0;
	return decode_hash(cfg->rps_lo, cfg->ncpus, cfg->rps_span, hash, fh, stage, epoch) ||
	       decode_hash(cfg->prev_rps_lo, cfg->prev_ncpus, cfg->prev_span, hash, fh, stage, epoch);
}

/*
 * tc programs cannot move the skb themselves; they leave an L4 hash that
 * RPS on the next device maps to cfg->cpus[idx]: the control plane sets that
 * device's RPS mask to exactly the core set, and RPS picks
 * cpus[(hash * n) >> 32], so any hash in [rps_lo[idx], rps_lo[idx] + rps_span)
 * selects cpus[idx] (rps_hash). bpf_set_hash marks the hash as L4, which
 * survives VXLAN decapsulation (only non-L4 hashes are cleared) and veth.
 * A frame that keeps its hash keeps no mark: a previous stage's mark would
 * let steer_drops_skb count a drop against a count the frame has left.
 */
static __always_inline int set_rps_hash(struct __sk_buff *skb, __u32 v)
{
	if (v)
		bpf_set_hash(skb, v);
	else if (skb->hash & HASH_COUNTED)
		bpf_set_hash(skb, (skb->hash & ~HASH_COUNTED) ?: 2);
	else if (!skb->hash)
		/* The zero L4 hash of a frame the bridge stage ran on is a
		 * mark too (steer_drops_skb): off, and the kernel hashes the
		 * frame itself if it needs to. */
		bpf_set_hash_invalid(skb);
	return TC_ACT_UNSPEC;
}

static __always_inline int rps_to(struct __sk_buff *skb, const struct steer_cfg *cfg, __u64 idx, __u32 fh,
				  __u32 stage, __u32 epoch, int counted)
{
	return set_rps_hash(skb, rps_hash(cfg, idx, fh, stage, epoch, counted));
}

/*
 * Staying at the bridge stage without the RPS backlog.
 *
 * RPS on the VXLAN device queues every frame to a core's backlog, the one
 * the GRO cell runs on too, so "stay" expressed as a hash for this core
 * costs a pass through the backlog that vanilla does not make: under a
 * busy IRQ core, one more FIFO to wait in (measured on Calico: the
 * ping-pong's p99 under a 65% background at 1.9-2.7x vanilla's with the
 * stages at home; plain RPS maps aimed at the IRQ core itself did the
 * same). A zero hash is the stock kernel's one way around it: get_rps_cpu
 * picks no core for a frame whose hash is 0, and bpf_set_hash marks it
 * L4, so decapsulation keeps it and nothing recomputes it; the GRO cell's
 * poll then runs the stage on itself, as in vanilla (run_on). The cost:
 * the GRO cell's GRO files skbs in 8 lists by hash, and these share one
 * (as every flow does in vanilla when the underlay gives no hash, like
 * the testbed's veth).
 *
 * Order: a frame run on overtakes its flow's frames still queued in the
 * backlog, and in one batch of the GRO cell's output
 * (netif_receive_skb_list_internal) the queued ones are handed to RPS
 * before the rest run on. So a flow runs on only once none of its frames
 * can be queued: it must have counted a queued frame of its own since it
 * came to stay (STAY_FRESH -> STAY_QUEUED) and seen every counted frame
 * out (inflight <= 0). A flow's frames leave the GRO cell in order, so
 * everything queued before that frame, counted or not, is past the stage
 * by then. Frames run on are counted in flight too, and seen with hash 0
 * at the host-side veth (seen_hashed), so a move away waits for them as
 * for any. The queued step also keeps frames run on uncounted (at home)
 * from lowering a fresh state's count: the host-side veth cannot tell them
 * from counted ones, so it counts a zero hash out only once the flow ran
 * a counted frame on (STAY_RAN_ON), which it does behind them. A flow the
 * split stage moved to another core starts over there (queued, keeping
 * STAY_RAN_ON until its count is out): frames run on go through this
 * core's GRO cell, and what it left in the other's must be seen first.
 * Returns whether this frame runs on; the caller counts it in flight
 * either way.
 */
static __always_inline int stay_direct(struct steer_flow_state *st)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 mode = st->stay & STAY_MODE;

	if (mode == STAY_DIRECT && st->stay_cpu == cpu)
		return 1;
	if (mode == STAY_QUEUED && st->inflight <= 0) {
		/* Nothing in flight: none of those run on either. */
		st->stay = STAY_DIRECT | STAY_RAN_ON;
		st->stay_cpu = cpu;
		return 1;
	}
	st->stay = STAY_QUEUED | (st->stay & STAY_RAN_ON);
	return 0;
}

/* Configurations under which the bridge stage never runs on: MFLOW queues
 * micro-flows uncounted (at the NIC poll or at this stage), so no count
 * proves the backlog free of a flow's frames; the same without bridge
 * counts. */
static __always_inline int direct_ok(const struct steer_cfg *cfg)
{
	return !(cfg->flags & (CFG_MFLOW | CFG_MFLOW_BRIDGE | CFG_NO_BRIDGE_COUNT | CFG_STAY_QUEUED));
}

/* Hand the frame on without an RPS pass (see stay_direct). */
static __always_inline int run_on(struct __sk_buff *skb)
{
	bpf_set_hash(skb, 0);
	return TC_ACT_UNSPEC;
}

/* Did the previous stage count this frame queued? Frames it queued without
 * counting (a stage at home, MFLOW's micro-flows) must not be counted seen:
 * they would cancel counted frames still queued behind them, and a move
 * would then overtake those (measured: after a stage left home, 45
 * datagrams of a stream out of order). No hash at all (BPF_PROG_RUN, a
 * frame no lanes program hashed) counts, as before this bit existed. */
static __always_inline int hash_counted(const struct __sk_buff *skb)
{
	return skb->hash == 0 || (skb->hash & HASH_COUNTED);
}

/* The frame was counted out: its mark goes, so a drop after this point
 * (the socket's queue, say) is not reported against the count it left. */
static __always_inline void unmark(struct __sk_buff *skb)
{
	if (skb->hash & HASH_COUNTED)
		bpf_set_hash(skb, (skb->hash & ~HASH_COUNTED) ?: 2);
}

/*
 * What steer_xdp noted in the skb's metadata: LANES_META_* flags, 0 if the
 * metadata is not ours; with LANES_META_MFLOW, the micro-flow's sequence
 * number in *seq (the flag is dropped if the sequence is cut off).
 */
static __always_inline __u32 meta_flags(const struct __sk_buff *skb, __u32 *seq)
{
	void *data = (void *)(long)skb->data;
	struct lanes_meta *meta = (void *)(long)skb->data_meta;
	struct lanes_meta_mflow *mf = (void *)meta;
	__u32 flags;

	if ((void *)(meta + 1) > data || meta->magic != LANES_META_MAGIC)
		return 0;
	flags = meta->flags;
	if (!(flags & LANES_META_MFLOW))
		return flags;
	if ((void *)(mf + 1) > data)
		return flags & ~LANES_META_MFLOW;
	*seq = mf->seq;
	return flags;
}

/* Pull the first want bytes (capped at the skb's length) into the linear
 * area, only if they are not there yet: pulling unclones the skb. */
static __always_inline int pull(struct __sk_buff *skb, __u32 want)
{
	if (want > skb->len)
		want = skb->len;
	if ((void *)(long)skb->data + want <= (void *)(long)skb->data_end)
		return 0;
	return bpf_skb_pull_data(skb, want);
}

/* The inner flow of a frame whose data starts at the inner Ethernet header
 * (the veths' tc hooks); -1 if it is not one lanes understands. */
static __always_inline int skb_inner_tuple(struct __sk_buff *skb, struct tuple *t)
{
	struct cursor c;

	if (pull(skb, MAX_INNER_HDRS) < 0)
		return -1;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	return parse_inner(&c, t);
}

/*
 * MFLOW's later split (CFG_MFLOW_BRIDGE), in tc ingress on the underlay:
 * an elephant's micro-flow gets the hash RPS on the VXLAN device maps to
 * its core, so the GRO cell's output (bridge, veth, container stage,
 * socket) runs there; a GRO skb counts gso_segs frames of the batch.
 * Returns 0 for a mouse, which the caller places as usual.
 *
 * This is the earliest skb-level split a stock kernel allows: VXLAN decap
 * runs in the underlay's own protocol handler, and the one hand-off before
 * it, RPS on the underlay (get_rps_cpu in netif_receive_skb_internal and
 * friends), has already chosen a core by the time tc ingress runs (in
 * __netif_receive_skb_core); XDP, which runs before it, cannot set
 * skb->hash. Splitting before decap is CFG_MFLOW's job, before the skb.
 */
static __always_inline int split_bridge(struct __sk_buff *skb, const struct steer_cfg *cfg,
					struct steer_flow_state *st, __u32 fh)
{
	__u32 n = skb_frames(skb);
	__u32 idx = microflow(cfg, st, n, STAGE_BRIDGE);

	if (idx == STAY)
		return 0;
	split_sent(st, n, STAGE_BRIDGE);
	/* For the reassembler at the container's veth (mflow_tag.h). */
	mflow_tag_skb(skb, fh, cfg->meta_gen, st->mf_started - 1);
	rps_to(skb, cfg, idx, fh, STAGE_BRIDGE, 0, 0);
	return 1;
}

/*
 * At home, a flow whose bridge-stage state would queue (it does not run on,
 * on this core) queues, uncounted, behind whatever it has queued, unless
 * it was idle for drain_ns: its frames queued before are presumed out
 * then, as for a move (place()), and it runs on like a flow without state.
 * A flow that queues is stamped, so that lanes agent sees it queuing
 * (steer.Datapath.HomeQueues) and keeps the stage off its bare path (CFG_HOME_BARE).
 */
static __always_inline int home_idle(const struct steer_cfg *cfg, struct steer_flow_state *st)
{
	__u64 now;

	if (!cfg->drain_ns)
		return 0;
	now = now_ns(cfg, 0);
	if (idle_since(cfg, st->last_ns, now) >= cfg->drain_ns)
		return 1;
	st->last_ns = now;
	return 0;
}

/* *qid: the core whose queue accounting counted the frames (meta's
 * LANES_META_QID), for the caller's queue_seen once this returns. */
static __always_inline int steer_tc(struct __sk_buff *skb, __u32 stage, int outer, __u32 *qid)
{
	struct steer_cfg *cfg = get_cfg();
	struct steer_flow_state *st = NULL;
	struct tuple t = {};
	struct cursor c;
	__u32 fh, flags = 0, seq = 0, v, in_hash = skb->hash, in_ifindex = skb->ingress_ifindex;
	int counted, ret, bridge_out = 0;
	__u64 idx; /* 64-bit so the bounds check and the array index are one register */

	/* Read before pulling, which may move the data. */
	if (outer) {
		flags = meta_ours(cfg, meta_flags(skb, &seq));
		*qid = meta_qid(flags);
	}
	if (!cfg || !(cfg->flags & CFG_ENABLED)) {
		count(stage, CNT_DISABLED);
		return TC_ACT_UNSPEC;
	}

	if (pull(skb, outer ? MAX_OUTER_HDRS : MAX_INNER_HDRS) < 0) {
		count(stage, CNT_PASSED);
		return TC_ACT_UNSPEC;
	}

	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	ret = outer ? parse_outer(&c, cfg, &t, NULL) : parse_inner(&c, &t);
	if (ret < 0) {
		count(stage, CNT_PASSED);
		/* A frame of the overlay whose inner frame lanes does not parse
		 * (inner IPv6, ARP, an IPv4 fragment, ICMP) goes on through the
		 * next device's RPS map, which is lanes' (the VXLAN device's,
		 * the container veth's): left alone, RPS would spread it by its
		 * own hash, a placement nobody planned that changes whenever
		 * lanes rewrites the maps (parking), reordering such a flow
		 * then. The zero L4 hash keeps it on the core it is on, where
		 * vanilla runs it, whatever the maps say. Frames that are not
		 * the overlay's (other ports and VNIs, the host's own traffic)
		 * meet no map of lanes' and stay untouched, hash included. */
		if (!outer || ret == PARSE_INNER_UNKNOWN)
			return run_on(skb);
		return TC_ACT_UNSPEC;
	}

	/* The previous stage's queue handed these frames on (a stage at home
	 * counted none). The bridge stage's frames are counted out only once
	 * this stage has counted them in (out:), so that a bridge-stage move,
	 * which waits for that count, never finds the frame in neither count:
	 * the container stage then holds its core for it (stay_core). */
	if (flags & LANES_META_QUEUED)
		seen(&t, STAGE_SPLIT, skb_frames(skb));
	else if (!outer && !(cfg->flags & CFG_HOME(STAGE_BRIDGE)) && hash_counted(skb))
		bridge_out = 1;

	fh = flow_hash(&t);
	if (flags & LANES_META_MFLOW) {
		/* A micro-flow split at the NIC poll keeps its core for the
		 * rest of the path (MFLOW's full-path parallelism), outside
		 * the table and the in-flight counts, like at the split. */
		arrived(&t, seq, skb_frames(skb));
		/* The sequence number leaves the metadata for skb->priority,
		 * which reaches the container's veth (mflow_tag.h). */
		mflow_tag_skb(skb, fh, cfg->meta_gen, seq);
		count(stage, CNT_STAYED);
		return rps_to(skb, cfg, this_cpu_index(cfg), fh, stage, 0, 0);
	}
	if ((cfg->flags & CFG_HOME(stage)) && !(outer && (cfg->flags & CFG_MFLOW_BRIDGE))) {
		count(stage, CNT_HOME);
		/* At home the bridge stage runs on as in vanilla. The agent
		 * comes home only when every active flow runs on already
		 * (Activity.Away), and a flow whose state says it queues
		 * (one that started between that read and the switch) keeps
		 * queuing, uncounted, until the stage leaves home: no frame
		 * runs on past one of its flow still queued. */
		if (outer && direct_ok(cfg)) {
			struct steer_flow_key key;

			/* On the bare path no flow would queue (lanes agent's
			 * word, CFG_HOME_BARE): no lookup. Not for frames a
			 * queue of the split stage marked. */
			if ((cfg->flags & CFG_HOME_BARE) && !flags && !(cfg->flags & CFG_PRIO)) {
				count(stage, CNT_DIRECT);
				return run_on(skb);
			}
			key = flow_key(&t, STAGE_BRIDGE);
			st = bpf_map_lookup_elem(&steer_flows, &key);
			if (!st || (st->cpu_idx == STAY && (st->stay & STAY_MODE) == STAY_DIRECT &&
				    st->stay_cpu == bpf_get_smp_processor_id()) ||
			    home_idle(cfg, st)) {
				count(stage, CNT_DIRECT);
				return run_on(skb);
			}
		}
		ret = rps_to(skb, cfg, this_cpu_index(cfg), fh, stage, 0, 0);
		goto out;
	}
	idx = place(cfg, &t, fh, stage, skb->ifindex, skb->len, 0, 0, 0, &st);
	if (outer && (cfg->flags & CFG_MFLOW_BRIDGE) && st && split_bridge(skb, cfg, st, fh))
		return TC_ACT_UNSPEC;
	/* RPS on the next device queues every skb, even to the core it runs
	 * on and whether or not we set the hash: count it before any return.
	 * A frame that cannot carry the mark (no hash for that core) goes on
	 * uncounted, which leaves the flow on the drain time. */
	counted = st && !(outer && (cfg->flags & CFG_NO_BRIDGE_COUNT));
	if (idx == STAY) {
		/* Vanilla placement for a tc stage is the core we run on. */
		count(stage, CNT_STAYED);
		/* At the bridge stage, without the RPS pass once the flow's
		 * queued frames are out. A frame queued otherwise (no flow
		 * state aside) starts the flow over. */
		if (outer && counted && direct_ok(cfg)) {
			if (stay_direct(st)) {
				count(stage, CNT_DIRECT);
				queued(st, skb_frames(skb));
				return run_on(skb);
			}
		} else if (outer && st) {
			st->stay = STAY_FRESH | (st->stay & STAY_RAN_ON);
		}
		idx = this_cpu_index(cfg);
	} else {
		count(stage, CNT_STEERED);
	}
	v = rps_hash(cfg, idx, fh, stage, st ? st->epoch : 0, counted);
	if (counted && !v) {
		uncounted(st);
		counted = 0;
	}
	if (counted)
		queued(st, skb_frames(skb));
	ret = set_rps_hash(skb, v);
out:
	if (bridge_out)
		seen_hashed(cfg, &t, STAGE_BRIDGE, skb_frames(skb), in_hash, in_ifindex);
	return ret;
}

SEC("tc")
int steer_tc_ingress(struct __sk_buff *skb)
{
	__u32 qid = 0;
	int ret = steer_tc(skb, STAGE_BRIDGE, 1, &qid);

	/* Out of its queue, whatever steer_tc made of it. */
	queue_seen(qid, skb_frames(skb));
	return ret;
}

SEC("tc")
int steer_tc_egress(struct __sk_buff *skb)
{
	__u32 qid = 0;

	return steer_tc(skb, STAGE_CONTAINER, 0, &qid);
}

/*
 * tc ingress on the container-side veth: the end of the container stage's
 * queue (the RPS backlog). It places nothing; it only counts the frames
 * the container stage queued as seen, so that stage's moves wait for them.
 */
SEC("tc")
int steer_tc_seen(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct tuple t = {};

	/* Uncounted frames return before any parsing. */
	if (!cfg || !(cfg->flags & CFG_ENABLED) || (cfg->flags & CFG_HOME(STAGE_CONTAINER)) || !hash_counted(skb))
		return TC_ACT_UNSPEC;
	if (skb_inner_tuple(skb, &t) == 0) {
		seen_hashed(cfg, &t, STAGE_CONTAINER, skb_frames(skb), skb->hash, skb->ingress_ifindex);
		/* Out of the count (or of an older one): a drop further on
		 * is not its. */
		unmark(skb);
	}
	return TC_ACT_UNSPEC;
}

/*
 * tc ingress on the underlay when nothing else runs there (PRISM, MFLOW at
 * the NIC poll): the end of the split stage's queue (the cpumap ring, or
 * the NIC poll's own frames marked under PLACE_LOCAL), on the core that
 * took the frame off it. Like steer_tc_seen it places nothing: it counts
 * queued frames seen (per flow, then for the core's queue accounting)
 * and reads micro-flows' sequence numbers back; frames steer_xdp did not
 * mark return at once, unparsed.
 */
static __always_inline void split_seen(struct __sk_buff *skb, const struct steer_cfg *cfg, __u32 flags,
				       __u32 seq)
{
	struct tuple t = {};
	struct cursor c;

	if (!cfg || !(cfg->flags & CFG_ENABLED))
		return;
	if (!(flags & (LANES_META_QUEUED | LANES_META_MFLOW)))
		return;
	if (pull(skb, MAX_OUTER_HDRS) < 0)
		return;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	if (parse_outer(&c, cfg, &t, NULL) < 0)
		return;
	if (flags & LANES_META_QUEUED)
		seen(&t, STAGE_SPLIT, skb_frames(skb));
	if (flags & LANES_META_MFLOW) {
		arrived(&t, seq, skb_frames(skb));
		/* The sequence number leaves the metadata for skb->priority,
		 * which reaches the container's veth (mflow_tag.h). */
		mflow_tag_skb(skb, flow_hash(&t), cfg->meta_gen, seq);
	}
}

SEC("tc")
int steer_tc_split_seen(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	__u32 seq = 0;
	/* Read before split_seen pulls, which may move the data. */
	__u32 flags = meta_ours(cfg, meta_flags(skb, &seq));

	split_seen(skb, cfg, flags, seq);
	/* Out of its queue, after its flow's seen(). */
	queue_seen(meta_qid(flags), skb_frames(skb));
	return TC_ACT_UNSPEC;
}

/*
 * PRISM's second stage per class (CFG_VETH_CLASS), on tc egress of a
 * container's host-side veth: high-priority frames take receive queue 1 of
 * the container-side veth, every other frame queue 0, each polled by its
 * own threaded NAPI (the high one real-time), so a high-priority frame
 * never waits behind bulk frames in the container's queue.
 *
 * A veth hands a frame to the peer's receive queue of the number of the
 * transmit queue the kernel picks for it (veth_xmit). The kernel picks
 * that after tc egress, and a program cannot pin it (only an skbedit
 * action sets netdev_xmit_skip_txqueue); but for a forwarded skb (no
 * socket) on a device without XPS maps or traffic classes it takes the
 * receive queue the skb recorded (skb_tx_hash: queue_mapping - 1, modulo
 * the transmit queues). So the program records "received on queue q"
 * (queue_mapping = q + 1); the planner checks that the host-side veth has
 * two transmit queues, no XPS and no qdisc. An skb with a full socket
 * (sent by the host's own sockets; a local container's frames arrive
 * without theirs) keeps the queue its socket cached, so it is left alone
 * and not counted. A frame lanes does
 * not understand takes queue 0, its bytes untouched.
 *
 * The frames a flow hands to its queue are counted in flight until
 * steer_tc_veth_seen sees them on the container side, and only frames
 * this program counted are counted out there, and only against the count
 * they went into: it gives them the hash veth_mark() (their flow's own, so
 * RPS or GRO on the container side group them as before, with the count's
 * epoch in three of its bits). A flow whose class changes moves to the other queue
 * only once none of its frames is left in the old one, or once it was
 * idle for drain_ns (the veth drops what its 256-frame ring cannot take,
 * unreported per flow); then counting starts afresh. A flow without state
 * takes its class's queue at once: a new flow has no frame anywhere, and
 * one evicted from the LRU map while busy (131072 entries) left its frames
 * in that queue unless its class changed in the same moment.
 */
#define VETH_EPOCHS 8

static __always_inline __u32 veth_mark(__u32 fh, __u32 epoch)
{
	return (fh & ~((VETH_EPOCHS - 1) << 1)) | ((epoch & (VETH_EPOCHS - 1)) << 1) | 1;
}

SEC("tc")
int steer_tc_veth_class(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct veth_class_state *st, init = {};
	struct bpf_sock *sk;
	struct steer_flow_key key;
	struct tuple t = {};
	__u32 n = skb_frames(skb), want, fh, epoch;
	__u64 now;

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !(cfg->flags & CFG_VETH_CLASS))
		return TC_ACT_UNSPEC;
	/* BPF_PROG_RUN's skbs carry a dummy socket made without a struct
	 * socket (type 0), which no real sender has. */
	sk = skb->sk;
	if (sk)
		sk = bpf_sk_fullsock(sk);
	if (sk && sk->type != 0) {
		count(STAGE_CONTAINER, CNT_PASSED);
		return TC_ACT_UNSPEC;
	}
	if (skb_inner_tuple(skb, &t) < 0)
		goto bulk;
	want = (cfg->flags & CFG_PRIO) && high_prio(cfg, &t, NULL);
	key = flow_key(&t, STAGE_CONTAINER);
	fh = flow_hash(&t);
	now = bpf_ktime_get_ns();
	st = bpf_map_lookup_elem(&steer_veth_class, &key);
	if (!st) {
		init.last_ns = now;
		init.queue = want;
		/* Unknown to frames of an evicted state, 7 times in 8. */
		init.epoch = bpf_get_prandom_u32() % VETH_EPOCHS;
		bpf_map_update_elem(&steer_veth_class, &key, &init, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&steer_veth_class, &key);
		if (!st)
			goto bulk;
	}
	if (st->queue != want) {
		if (st->inflight <= 0) {
			st->queue = want;
			count(STAGE_CONTAINER, CNT_SETTLED);
		} else if (cfg->drain_ns == 0 || now - st->last_ns >= cfg->drain_ns) {
			/* Presumed dropped: count afresh, in a new epoch. */
			st->queue = want;
			st->inflight = 0;
			st->epoch = (st->epoch + 1) % VETH_EPOCHS;
			count(STAGE_CONTAINER, CNT_UNDRAINED);
		} else {
			count(STAGE_CONTAINER, CNT_HELD);
		}
	}
	st->last_ns = now;
	/* The epoch before the count: a drain-time move on another core in
	 * between must not leave this frame marked for a count it is not in. */
	epoch = st->epoch;
	__sync_fetch_and_add(&st->inflight, n);
	bpf_set_hash(skb, veth_mark(fh, epoch));
	skb->queue_mapping = st->queue + 1;
	count(STAGE_CONTAINER, st->queue ? CNT_HIGH : CNT_STAYED);
	return TC_ACT_UNSPEC;
bulk:
	skb->queue_mapping = 1;
	count(STAGE_CONTAINER, CNT_PASSED);
	return TC_ACT_UNSPEC;
}

/*
 * tc ingress on the container-side veth, the end of steer_tc_veth_class's
 * queues: counts a flow's frames seen, only those it counted in (their
 * hash is veth_mark of the flow's and its count's epoch; no hash at all, as under BPF_PROG_RUN,
 * counts too, as in hash_counted), and never below zero.
 */
SEC("tc")
int steer_tc_veth_seen(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct veth_class_state *st;
	struct steer_flow_key key;
	struct tuple t = {};
	__s64 n = skb_frames(skb);

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !(cfg->flags & CFG_VETH_CLASS))
		return TC_ACT_UNSPEC;
	if (skb_inner_tuple(skb, &t) < 0)
		return TC_ACT_UNSPEC;
	key = flow_key(&t, STAGE_CONTAINER);
	st = bpf_map_lookup_elem(&steer_veth_class, &key);
	if (!st)
		return TC_ACT_UNSPEC;
	if (skb->hash != 0 && skb->hash != veth_mark(flow_hash(&t), st->epoch))
		return TC_ACT_UNSPEC;
	count_out(&st->inflight, n);
	/* Out of the count: a drop further on is not its. */
	unmark(skb);
	return TC_ACT_UNSPEC;
}

/*
 * Frames dropped on the way through a cpumap queue, which the skb side
 * will never count seen (struct steer_queue). The kernel reports them by
 * map id and core; steer_qmaps says which maps are ours (either class:
 * a core's queues are accounted together).
 */
static __always_inline void queue_dropped(__u32 map_id, __u32 cpu, __u32 drops, int at_ring)
{
	__u32 bulk = 0, high = 1;
	__u32 *id0, *id1;
	struct steer_queue *q;

	if (!drops || !map_id)
		return;
	id0 = bpf_map_lookup_elem(&steer_qmaps, &bulk);
	id1 = bpf_map_lookup_elem(&steer_qmaps, &high);
	if (!(id0 && *id0 == map_id) && !(id1 && *id1 == map_id))
		return;
	q = core_queue(cpu);
	if (!q)
		return;
	__sync_fetch_and_add(at_ring ? &q->dropped_enq : &q->dropped_kthread, drops);
	/* The last frames of a queue may be dropped ones: no later frame
	 * would make the consumer look. */
	if (q->want > q->empty_at)
		queue_empty_now(q, cpu);
}

/* A bulk queue's flush to the ring (bq_flush_to_queue, on the producing
 * core): frames the full ring refused.
 * TP_PROTO(int map_id, unsigned int processed, unsigned int drops, int to_cpu) */
SEC("raw_tracepoint/xdp_cpumap_enqueue")
int steer_drops_ring(struct bpf_raw_tracepoint_args *ctx)
{
	queue_dropped((__u32)ctx->args[0], (__u32)ctx->args[3], (__u32)ctx->args[2], 1);
	return 0;
}

/* One batch of the queue's kthread (bound to the queue's core): frames
 * dropped before an skb existed (kmem_alloc_drops; since 5.x the kthread
 * hands skbs on as a list and counts no later drop here).
 * TP_PROTO(int map_id, unsigned int processed, unsigned int drops, int sched,
 *          struct xdp_cpumap_stats *xdp_stats) */
SEC("raw_tracepoint/xdp_cpumap_kthread")
int steer_drops_kthread(struct bpf_raw_tracepoint_args *ctx)
{
	queue_dropped((__u32)ctx->args[0], bpf_get_smp_processor_id(), (__u32)ctx->args[2], 0);
	return 0;
}

/*
 * Frames the later stages counted in flight and the kernel then dropped
 * before the next stage's program saw them: a full RPS backlog
 * (enqueue_to_backlog), a full GRO cell, the veth's full NAPI ring
 * (veth-queues=class), a filter on the way. Without this they held their
 * flow's count above zero until the drain time presumed them dropped,
 * the one timer left in the order-keeping of those stages; each is now
 * counted out of the count it went into (CNT_DROPPED), and the drain time
 * is left to frames that leave the path without a drop (delivered to the
 * host itself, say).
 *
 * The kernel reports every drop through this tracepoint (kfree_skb_reason;
 * a GRO-merged skb, freed as consumed, is not a drop: its frames went on
 * in the merged one's gso_segs). A frame is ours only if its hash is the
 * one rps_to (or steer_tc_veth_class) gave a counted frame of its own flow,
 * which the headers at the drop name, at that stage and in the flow's
 * current count: every program that counts a frame out takes its mark off
 * (unmark), so a frame dropped after that (the socket's queue was full)
 * is not counted twice. A foreign skb would need a flow's exact 5-tuple
 * and its exact 32-bit hash.
 *
 * The headers: every drop point between the counting programs holds the
 * frame with its data at the inner IPv4 header (after eth_type_trans on
 * the VXLAN device or the veth) or, where the mac header starts at data, at
 * the inner Ethernet header.
 */
struct sk_buff___lanes {
	unsigned char *head;
	unsigned char *data;
	__u32 hash;
	__u16 mac_header;
	__u16 network_header;
	unsigned int end;
	__u8 cloned : 1;
	__u8 l4_hash : 1;
} __attribute__((preserve_access_index));

/* Only the name matters: CO-RE takes the value from the kernel's BTF. */
enum skb_drop_reason {
	SKB_DROP_REASON_OTHERHOST = 1,
};

struct skb_shared_info___lanes {
	unsigned short gso_segs;
} __attribute__((preserve_access_index));

static __always_inline int drop_tuple(struct sk_buff___lanes *skb, struct tuple *t)
{
	unsigned char *head = BPF_CORE_READ(skb, head), *data = BPF_CORE_READ(skb, data);
	__u16 mac = BPF_CORE_READ(skb, mac_header), nh = BPF_CORE_READ(skb, network_header);
	struct iphdr ip;
	__be16 ports[2];
	__be16 proto;

	if (mac != 0xffff && head + mac == data) {
		if (bpf_probe_read_kernel(&proto, sizeof(proto), data + __builtin_offsetof(struct ethhdr, h_proto)) ||
		    proto != bpf_htons(ETH_P_IP))
			return -1;
		data += ETH_HLEN;
	}
	/* Only the skb's own network header: a GRO skb's frag_list members,
	 * freed with it, hold their payload at data. */
	if (data != head + nh)
		return -1;
	if (bpf_probe_read_kernel(&ip, sizeof(ip), data) || ip.version != 4 || ip.ihl < 5 ||
	    (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET)) ||
	    (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP))
		return -1;
	if (bpf_probe_read_kernel(ports, sizeof(ports), data + ip.ihl * 4))
		return -1;
	t->saddr = ip.saddr;
	t->daddr = ip.daddr;
	t->proto = ip.protocol;
	t->sport = ports[0];
	t->dport = ports[1];
	return 0;
}

/* TP_PROTO(struct sk_buff *skb, void *location, enum skb_drop_reason reason,
 *          struct sock *rx_sk) (6.12+; without rx_sk before) */
SEC("raw_tracepoint/kfree_skb")
int steer_drops_skb(struct bpf_raw_tracepoint_args *ctx)
{
	struct sk_buff___lanes *skb = (void *)ctx->args[0];
	struct steer_cfg *cfg;
	struct steer_flow_key key;
	struct steer_flow_state *st;
	struct veth_class_state *vst;
	struct skb_shared_info___lanes *sh;
	struct tuple t = {};
	__u32 hash, fh, epoch = 0, epoch2 = 0, stage, n = 1;
	unsigned short segs = 0;
	int bridge;

	/* Most drops are not ours: one read, then out. A zero hash marked
	 * L4 is one the bridge stage gave a frame it ran on (run_on): that
	 * frame was counted too, without an epoch. */
	hash = BPF_CORE_READ(skb, hash);
	if (!(hash & HASH_COUNTED) && (hash || !BPF_CORE_READ_BITFIELD_PROBED(skb, l4_hash)))
		return 0;
	/* A clone shares its original's hash: one of the two may have been
	 * counted out already (a promiscuous bridge passes the original up,
	 * where it is dropped as another host's, and forwards the clone), so
	 * a clone's drop is not reported; its flow waits for the drain time. */
	if (BPF_CORE_READ_BITFIELD_PROBED(skb, cloned))
		return 0;
	/* The same, for an original whose clone flag a write to it cleared
	 * (pskb_expand_head): a promiscuous bridge's original is dropped as
	 * another host's after its clone was forwarded and counted out. */
	if (bpf_core_enum_value_exists(enum skb_drop_reason, SKB_DROP_REASON_OTHERHOST) &&
	    ctx->args[2] == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_OTHERHOST))
		return 0;
	cfg = get_cfg();
	if (!cfg || !(cfg->flags & CFG_ENABLED) || drop_tuple(skb, &t) < 0)
		return 0;
	sh = (void *)(BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, end));
	if (!bpf_probe_read_kernel(&segs, sizeof(segs), &sh->gso_segs) && segs > 1)
		n = segs;
	if (!hash) {
		/* As seen_hashed counts such a frame out: only from a flow
		 * running on, and not at home, where nothing is counted. */
		if (cfg->flags & CFG_HOME(STAGE_BRIDGE))
			return 0;
		key = flow_key(&t, STAGE_BRIDGE);
		st = bpf_map_lookup_elem(&steer_flows, &key);
		if (st && (st->stay & STAY_RAN_ON)) {
			count_out(&st->inflight, n);
			count_n(STAGE_BRIDGE, CNT_DROPPED, n);
		}
		return 0;
	}
	fh = flow_hash(&t);
	if (cfg->flags & CFG_VETH_CLASS) {
		key = flow_key(&t, STAGE_CONTAINER);
		vst = bpf_map_lookup_elem(&steer_veth_class, &key);
		if (vst && hash == veth_mark(fh, vst->epoch)) {
			count_out(&vst->inflight, n);
			count_n(STAGE_CONTAINER, CNT_DROPPED, n);
			return 0;
		}
	}
	/* The stage whose hash it is; both (one flow in about 2^32 / (16 *
	 * cores) has equal hashes at the two stages on a core): neither, as
	 * the frame cannot be told. */
	bridge = hash_of_count(cfg, hash, fh, STAGE_BRIDGE, &epoch);
	if (hash_of_count(cfg, hash, fh, STAGE_CONTAINER, &epoch2)) {
		if (bridge)
			return 0;
		stage = STAGE_CONTAINER;
		epoch = epoch2;
	} else if (bridge) {
		stage = STAGE_BRIDGE;
	} else {
		return 0;
	}
	if (cfg->flags & CFG_HOME(stage))
		return 0;
	key = flow_key(&t, stage);
	st = bpf_map_lookup_elem(&steer_flows, &key);
	if (st && epoch == st->epoch) {
		count_out(&st->inflight, n);
		count_n(stage, CNT_DROPPED, n);
	}
	return 0;
}
