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

/*
 * steer_cfg.flags: what the control plane switches while the programs run.
 * What a mode fixes when it is applied is not here but in the load-time
 * constants (mode.h), so the verifier drops the code a mode does not use.
 */
/* The config is written (SetConfig): off, every program passes every frame
 * untouched. */
#define CFG_ENABLED 0x1
/* The stage is at home: every flow's stage runs where the kernel runs it
 * and stays there, so its program skips the per-flow state (lookups, clock,
 * in-flight counts) and only keeps vanilla placement. Runtime state, set
 * by lanes agent only when the stage's table is all STAY and no flow's
 * stage is elsewhere; before it leaves home it restarts the stage's stale
 * flow states (deleted; the bridge stage's set back to STAY_FRESH with
 * nothing in flight), so counting starts afresh. PRISM's classification and
 * MFLOW's splitting need the full path: steer_xdp ignores the bit then. */
#define CFG_HOME(stage) (0x80u << (stage))
/* The bridge stage at home runs every frame on without looking its flow up
 * (steer_tc): no flow there can have frames queued in an RPS backlog.
 * Runtime state, set by lanes agent only while the stage is at home and
 * no bridge-stage state that would queue (not running on, on this core)
 * saw a frame within drain_ns (steer.Placement.HomeQueues); cleared with CFG_HOME. */
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
