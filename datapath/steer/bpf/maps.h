/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Every map of the steer datapath, with what its key and value mean, and
 * the value types they hold (katran's balancer_maps.h). The control plane
 * pins each under its own name (datapath/steer's pinnedMaps) and writes
 * most of them; which program reads or writes a map, and why, is told by
 * the concern's header (order.h, place.h, prio.h, mflow.h, sync.h). At the
 * end, the accessors every concern uses: the config and the counters.
 */
#pragma once

#include "consts.h"
#include "counters.h"
#include "mode.h"

struct steer_cfg {
	__u32 ncpus;      /* entries used in cpus and rps_lo; 0 = not configured */
	__u32 rps_span;   /* floor(2^32 / ncpus), capped at 2^32-1 */
	__u64 flowlet_ns; /* idle gap after which a flow may move */
	__u64 drain_ns;   /* idle gap after which a flow may move with frames still
			   * counted in flight (they were dropped); 0: do not wait */
	__u32 vxlan_port; /* outer UDP destination port, host byte order */
	__u32 flags;      /* CFG_*: the runtime switches (mode.h has the rest) */
	__u32 cpus[MAX_CPUS];   /* core numbers, ascending: the order of the RPS mask */
	__u32 rps_lo[MAX_CPUS]; /* ceil(i * 2^32 / ncpus): lowest hash RPS maps to cpus[i] */
	__u32 index_of[MAX_CPUS]; /* core number -> its index in cpus, or STAY: no per-packet search */
	/* MFLOW (MODE_MFLOW, MODE_MFLOW_BRIDGE) */
	__u64 mf_window_ns; /* the elephant test's rate window */
	/* With a reassembler: an elephant stays one until the flow has been
	 * idle this long, by which time the reassembler holds none of its
	 * frames (see elephant()). 0: none, it falls back by rate. */
	__u64 mf_quiet_ns;
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
	__type(key, __u32); /* stage * BUCKETS + bucket */
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
	__u32 mf_elephant;   /* MF_*: split, mid-segment, the cut's rotation */
	__u32 mf_started;    /* micro-flows started; the current one's sequence number is mf_started - 1 */
	__u32 mf_left;       /* frames the current micro-flow still takes */
	__u32 mf_core;       /* index into cpus of the current micro-flow */
	__u32 mf_last;       /* the flow's last frame, in 2^MF_LAST_SHIFT ns (wraps) */
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
	/* Split stage under aside_pct: the aside pass's gen at the flow's last
	 * frame placed (struct aside_pass). */
	__u32 pass_gen;
	/* The window (slot_window) in which the state last noted itself in
	 * its slot of steer_epochs (note_slot); 0: at its next frame. */
	__u32 slot_win;
};

/* Sized per host at load (steer.FlowEntries): the LRU keeps part of its
 * free entries on each CPU's own list, so a small map on many CPUs evicts
 * long before it is full. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct steer_flow_key); /* a flow (its 5-tuple) at one stage */
	__type(value, struct steer_flow_state); /* where that stage runs, its in-flight count, MFLOW state */
} steer_flows SEC(".maps");

/*
 * Per stage and slot of flows (flow hash modulo EPOCH_SLOTS): the count
 * epochs handed out there, and a note of one flow's state in the slot:
 * where its frames go and in which count. A flow state takes the next
 * epoch of its slot when it is made and whenever it starts counting
 * afresh, so a state made anew after the LRU evicted its flow's never
 * takes the epoch the old one had last if the note is that flow's, and
 * otherwise only after seven other epochs were handed out in the slot in
 * between. The note is how a state made anew learns where the evicted one
 * left frames that may still be queued (remake(), order.h): the state
 * notes itself once per window of the coarse clock while its flow runs
 * and whenever its place or epoch changes, and keeps the slot while its
 * note is recent (within the drain time), so a burst of new flows, the
 * very thing that evicts it, cannot take its note away.
 */
#define EPOCH_SLOTS 65536

struct flow_slot {
	__u32 fh;       /* flow hash of the state noted */
	__u32 place;    /* its cpu_idx */
	__u32 win;      /* the window of its last note (slot_window); 0: no note */
	__u16 n;        /* count epochs handed out in the slot (wraps: read modulo HASH_EPOCHS) */
	__u8 epoch;     /* its count epoch */
	__u8 stay_cpu;  /* its stay_cpu: where a staying container stage queues */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NUM_STAGES * EPOCH_SLOTS);
	__type(key, __u32); /* stage * EPOCH_SLOTS + flow hash % EPOCH_SLOTS */
	__type(value, struct flow_slot); /* its epochs, and one flow state's note */
} steer_epochs SEC(".maps");

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
	__type(key, __u32); /* ifindex of the host-side veth (the container stage's hook) */
	__type(value, __u64); /* deadline, bpf_ktime_get_ns() */
} steer_adopt SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_CPUMAP);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32); /* core number */
	__type(value, struct bpf_cpumap_val); /* the queue size, no program */
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
	__type(value, struct bpf_cpumap_val); /* the queue size, no program */
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

/* The rule shapes steer_prio holds: bit SHAPE(dir, i) (see high_prio).
 * An entry of its own, apart from steer_cfg: its one writer is lanes prio,
 * while the apply and lanes agent write the config (placement, home), and
 * two writers that read, modify and write back one shared entry lose each
 * other's changes (a rule lanes prio reported added, never looked up). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, __u32); /* the rule shapes in use: bit dir * 4 + i */
} steer_prio_shapes SEC(".maps");

/*
 * PRISM-sync's destinations: a (VNI, inner destination MAC) the bridge
 * forwards to a container's host-side veth, on a path where nothing but
 * the forward happens (policy/prism/sync.go decides, lanes agent keeps it
 * fresh). The devmap holds the veths the redirect may use; an entry
 * vanishes with its device. A destination holds only until its deadline,
 * which the agent pushes on at every round: an agent that died, or never
 * started, leaves the shortcut closed (fail closed), and every frame on
 * the kernel's path.
 */
struct sync_key {
	__u32 vni;   /* host byte order */
	__u8 mac[6]; /* inner MAC: the destination's (steer_sync), the source's (steer_sync_src) */
	__u16 pad;   /* 0: the key is hashed as bytes */
};

struct sync_dest {
	__u32 ifindex;   /* host-side veth, key of steer_sync_dev */
	__u32 mtu;       /* the smaller of the two veth ends' MTUs: longer inner frames take the batch path */
	__u64 deadline;  /* bpf_ktime_get_ns(): from then on the destination is void */
	__u64 changes;   /* steer_changes when its facts were read: once the count moves on, the destination is void */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sync_key); /* (VNI, inner destination MAC) */
	__type(value, struct sync_dest); /* the container's host-side veth, its MTU, the deadline */
} steer_sync SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* ifindex */
	__type(value, __u32); /* the same ifindex (struct bpf_devmap_val without a program) */
} steer_sync_dev SEC(".maps");

/*
 * The count of the changes announced on the path a shortcut skips that
 * may make it unsafe: nftables and IPsec changes in every namespace the
 * path runs through, counted by steer_notify on lanes agent's netlink
 * sockets. The kernel runs that filter as it sends the notification, in
 * the changing process's context, before the command that made the
 * change returns. PRISM-sync's destinations (sync_dest.changes) and the
 * fast path's entries (fast_entry.changes) record the count under which
 * they were vouched for: once it moved on, they are void until the agent
 * has read the path again (the fast path's are deleted), so no frame that
 * arrives after the command returned takes a shortcut past the new rule,
 * however late the agent itself reads the notification.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, __u64); /* changes counted */
} steer_changes SEC(".maps");

/*
 * PRISM-sync's local VTEPs: a frame takes the shortcut only if its outer
 * destination is one of this host's VTEP addresses on the device it came
 * in on, with that device's MAC as its Ethernet destination: what ip_rcv
 * (PACKET_OTHERHOST) and the route lookup (local delivery) let through
 * to the VXLAN socket. Narrower than the kernel (which takes any local
 * address), never wider.
 */
struct sync_local_key {
	__u32 ifindex; /* the underlay device (the frame's ingress) */
	__be32 addr;   /* a local VTEP address */
};

struct sync_local {
	__u8 mac[6]; /* the underlay device's MAC */
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct sync_local_key); /* (underlay device, local VTEP address) */
	__type(value, struct sync_local); /* that device's MAC */
} steer_sync_local SEC(".maps");

/*
 * PRISM-sync's sources: the inner source MACs whose frames may take the
 * shortcut, each from the one VTEP a static forwarding entry of the VXLAN
 * device sends it to. With such an entry the kernel takes the frame from
 * that VTEP alone (vxlan_snoop drops it from any other, and learns
 * nothing), and a known remote MAC is a valid unicast address that is not
 * the VXLAN device's own (vxlan_set_mac). The bridge's forwarding entry
 * for the source, which the frames the shortcut takes no longer refresh
 * by learning, lanes agent refreshes from seen (see policy/prism).
 */
struct sync_src {
	__be32 vtep; /* the outer source address the frames must come from */
	__u32 pad;
	__u64 seen;  /* coarse clock of the last frame the shortcut took from this source (0: none) */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct sync_key); /* (VNI, inner source MAC) */
	__type(value, struct sync_src); /* its VTEP, when the shortcut last took a frame of it */
} steer_sync_src SEC(".maps");

/*
 * The fast path into the container (MODE_FAST, fast.h): a flow of the
 * overlay, by its VNI and inner 5-tuple.
 */
struct fast_key {
	__u32 vni;     /* host byte order */
	__be32 saddr;  /* inner IPv4 addresses and ports */
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];   /* 0: the key is hashed as bytes */
};

/*
 * What the underlay's tc ingress saw of a flow's frame that took the
 * kernel's path (no entry yet): the outer facts the kernel accepted it
 * with, and what identifies the same packet where it leaves the overlay
 * (its inner IP id and total length), with its TTL then.
 */
struct fast_note {
	__be32 vtep_src;       /* outer source and destination addresses */
	__be32 vtep_dst;
	__u8 outer_dmac[6];    /* outer Ethernet destination (the underlay's MAC) */
	__u8 in_dmac[6];       /* the inner Ethernet header as it arrived */
	__u8 in_smac[6];
	__u8 ttl;              /* inner TTL as it arrived */
	__u8 pad;
	__u32 underlay;        /* ifindex the frame came in on */
	__be16 id;             /* inner IP id and total length */
	__be16 tot_len;
	__u64 changes;         /* steer_changes when it came in */
	__u64 at;              /* bpf_ktime_get_ns() when it came in */
	/* Until then the note teaches nothing: a frame of the flow with
	 * other outer facts came within FAST_NOTE_NS of another, so the
	 * packet that leaves the overlay may be either's. */
	__u64 unsure_until;
};

/*
 * A flow the kernel's path delivered to a container, learned where the
 * frame left the overlay (the host-side veth's egress), from a frame whose
 * note it matched: later frames with the same outer facts go from the
 * underlay's tc ingress straight into the container's namespace.
 */
struct fast_entry {
	__u32 ifindex;         /* host-side veth: bpf_redirect_peer goes to its peer */
	__u32 underlay;        /* the frames come in on this device ... */
	__be32 vtep_src;       /* ... from this VTEP to this one ... */
	__be32 vtep_dst;
	__u8 outer_dmac[6];    /* ... with these MACs ... */
	__u8 in_dmac[6];
	__u8 in_smac[6];
	__u8 dmac[6];          /* the inner Ethernet header as the kernel's path delivered it */
	__u8 smac[6];
	__u8 ttl_dec;          /* what the kernel's path took off the TTL: 0 bridged, 1 routed */
	__u8 pad;
	__u32 mtu;             /* longest inner IP packet the path forwards to the container */
	__u64 changes;         /* steer_changes at admission: once it moved, the entry is void */
	__u64 last;            /* bpf_ktime_get_ns() of its last use (stamped once per FAST_STAMP_NS) */
};

#define FAST_ENTRIES 16384

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FAST_ENTRIES);
	__type(key, struct fast_key);
	__type(value, struct fast_entry);
} steer_fast SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FAST_ENTRIES);
	__type(key, struct fast_key);
	__type(value, struct fast_note);
} steer_fast_notes SEC(".maps");

/*
 * The fast path's order keeping: frames of a flow handed on from the
 * underlay's ingress, by either path, that its container's ingress has
 * not seen yet (steer_tc_fast_seen). A frame takes the fast path only
 * while none is on the kernel's path (its GRO cell, the bridge, the
 * backlog), so it never overtakes one of its flow's; a count a frame the
 * kernel's path dropped leaves behind ends once the flow was idle for the
 * drain time. By inner 5-tuple (fast_key, VNI 0): the container's ingress
 * does not know the VNI.
 */
struct fast_flight {
	__u32 n;    /* frames handed on, not yet seen at the container's ingress */
	__u32 pad;
	__u64 at;   /* bpf_ktime_get_ns() when the last was handed on */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 2 * FAST_ENTRIES);
	__type(key, struct fast_key);
	__type(value, struct fast_flight);
} steer_fast_flight SEC(".maps");

/* Inner IPv4 fragments the fast path counted in flight, all flows
 * together (fast.h's fast_frag_in): while none is, no frame looks up its
 * addresses' count. Signed: a count a lost update left below zero reads
 * as none. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __s64);
} steer_fast_frags SEC(".maps");

/* The fast path's lease: lanes agent vouches for the path until deadline
 * (bpf_ktime_get_ns), under the change count it read before it read the
 * path (steer_changes). It renews it every round; past the deadline, or
 * once another change was counted, nothing is admitted or used (an agent
 * that died leaves the kernel's path to every frame; a change leaves it
 * there until the agent has read the path again). */
struct fast_lease {
	__u64 deadline; /* 0: none */
	__u64 changes;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, struct fast_lease);
} steer_fast_lease SEC(".maps");

/* The VXLAN devices whose frames the fast path may learn from, by the
 * ifindex a frame they received carries on (skb->ingress_ifindex), with
 * their VNI. Written by lanes agent where nothing on the path can change
 * the kernel's verdict. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); /* ifindex of a VXLAN device */
	__type(value, __u32); /* its VNI */
} steer_fast_vxlan SEC(".maps");

/* The host-side veths the fast path may deliver to, with what the path
 * to each allows: the longest inner IP packet it forwards (the smallest
 * MTU on the way) and the container interface's MAC (a frame for another
 * MAC, flooded, teaches nothing). Written by lanes agent. */
struct fast_dev {
	__u32 mtu;
	__u8 mac[6];
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* ifindex of a host-side veth */
	__type(value, struct fast_dev);
} steer_fast_dev SEC(".maps");

/* MFLOW: micro-flows sent to each core. Written once per micro-flow, not
 * per frame, so one shared counter per core costs nothing that matters. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32); /* core number */
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
 * (docs/decisions/README.md, Falcon: split-stage queues are tracked, not
 * timed). Every frame steer_xdp marks
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
	/* Under the aside pass (mode_aside_pass): when the core last counted
	 * a frame in, queued or marked in the NIC poll (coarse clock, stamped
	 * when the tick changed): the pass starts only a flowlet gap after
	 * it, when the shared GRO cell holds no marked frame a passed one
	 * could overtake. */
	__u64 marked_at;
	__u64 pad0[4];
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
	__type(key, __u32); /* core number */
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
	__type(key, __u32); /* core number */
	__type(value, __u64); /* frames the control plane booked lost */
} steer_queue_lost SEC(".maps");

/* The kernel ids of steer_cpumap (0) and steer_cpumap_hi (1), which the
 * tracepoints report drops by. Written by the control plane once the
 * drop tracepoints are attached; 0 (not yet, or they could not be) leaves
 * every queue on the drain timeout. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32); /* 0: steer_cpumap, 1: steer_cpumap_hi */
	__type(value, __u32); /* its kernel map id (0: drops not tracked) */
} steer_qmaps SEC(".maps");

/* PRISM high=auto, rule by rule: until when (CLOCK_MONOTONIC ns; 0: not)
 * the high-priority flows a rule marks run their first stage in the NIC
 * poll that classified them, as
 * bulk does under MODE_PRIO_IDLE_INLINE while no rule exists, instead of
 * taking the high-priority queue. Runtime state of lanes agent, which
 * switches each rule by its frame rate (steer_high_frames): a busy marked
 * service pays the queue's kthread hop on every request; a light one gains
 * from the queue's real-time preemption, also while another rule's service
 * is busy. Heeded only while steer_mode.high_auto_pps is set, which the planner
 * does only with MODE_PRIO_IDLE_INLINE, whose fast moves (place(),
 * PLACE_LOCAL) take each flow between the queue and the NIC poll in order,
 * without an idle gap. Maps of their own, not a cfg flag nor steer_prio's
 * value: the agent writes them without rewriting what other writers (lanes
 * prio) write. A flow marked by several rules goes by the first that
 * high_prio() finds. The agent renews each deadline at every sample, as
 * steer_aside's, so the switches of an agent that dies lapse with it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct prio_rule);
	__type(value, __u64); /* deadline, CLOCK_MONOTONIC ns; 0: in the queue */
} steer_high_inline SEC(".maps");

/* PRISM aside-below: until when (CLOCK_MONOTONIC ns; 0: not) PRISM stands
 * aside, every flow running its first stage in the NIC poll as vanilla
 * runs it: lanes agent sets it while the receive core's receive work is
 * too light for the queues to pay, renewing the deadline at every sample,
 * so an agent that dies leaves the plan's placement back within it. Heeded
 * only while steer_mode.aside_pct is set, which the planner does only with
 * high=auto and bulk=auto (fast moves, as the rules' switches above).
 * Runtime state of the agent, in a map of its own. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, __u64); /* deadline, CLOCK_MONOTONIC ns; 0: not aside */
} steer_aside SEC(".maps");

/*
 * The aside pass (aside_pass, prio.h): while PRISM stands aside and the
 * receive core's queues hold nothing, steer_xdp passes every frame at once,
 * without parsing, classifying or tracking it. gen is odd while the pass
 * is on and goes up by one at each start and end, so a flow state stamped
 * with another gen (steer_flow_state.pass_gen) may have had frames passed
 * since; end_ns (precise, NS_PRECISE) is when the last pass ended. State
 * of steer_xdp alone (the NIC is polled on steer_mode.inline_cpu alone
 * under MODE_PRIO_IDLE_INLINE); kept across a re-apply with the flow
 * states it describes.
 */
struct aside_pass {
	__u32 on;
	__u32 gen;
	__u64 end_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, struct aside_pass);
} steer_aside_pass SEC(".maps");

/* Frames each rule marked (while steer_mode.high_auto_pps is set), per core: the
 * agent's rate of the rule. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct prio_rule); /* a rule */
	__type(value, __u64); /* frames it marked, this core's */
} steer_high_frames SEC(".maps");

/* PRISM high=auto: when the last bulk frame arrived (coarse clock, ns; 0:
 * none yet), for steer_mode.bulk_quiet_ms; written only when the tick changed,
 * so busy bulk costs one store per tick. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, __u64); /* coarse clock of the last bulk frame, 0: none */
} steer_bulk_seen SEC(".maps");

/* PRISM bulk=auto: when the last high-priority frame of a busy rule ran
 * in the NIC poll (high=auto's switch), and when the last one took its
 * queue (coarse clock, ns; 0: none yet). Stamped only while
 * steer_mode.bulk_auto_ms is set, once per tick. One entry with both, so a bulk
 * frame's question (bulk_beside_busy) costs one lookup and one clock read. */
struct high_seen {
	__u64 busy;
	__u64 queued;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, struct high_seen); /* coarse clocks of the last busy and queued high-priority frames */
} steer_high_seen SEC(".maps");

/* PRISM: when the last high-priority frame arrived (coarse clock, ns; 0:
 * none yet), for steer_mode.prio_quiet_ms. Written only when the tick changed,
 * so a busy high-priority flow costs one store per tick. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, __u64); /* coarse clock of the last high-priority frame, 0: none */
} steer_prio_seen SEC(".maps");

/* Frames steer_xdp passed without steering them, this core's in the
 * current coarse tick (prio.h: seen_passed). */

struct passed_tick {
	__u64 tick;
	__u32 n;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, struct passed_tick); /* this core's tick and its frames passed */
} steer_passed_tick SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NUM_STAGES * NUM_COUNTERS);
	__type(key, __u32); /* stage * NUM_COUNTERS + enum counter */
	__type(value, __u64);
} steer_stats SEC(".maps");

/*
 * PRISM's two queues at the container veth (MODE_VETH_CLASS): the queue a
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

static __always_inline struct steer_cfg *get_cfg(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&steer_cfg, &zero);
}

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
