/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The constants every part of steer shares: the stages, the table's size,
 * the config's flags, the values of a flow's cpu_idx and of the fields of
 * its state that more than one concern reads. The kernel and libbpf
 * headers come in here, so every other header starts from this one.
 */
#pragma once

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

#define STAGE_SPLIT 0
#define STAGE_BRIDGE 1
#define STAGE_CONTAINER 2
#define NUM_STAGES 3

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
