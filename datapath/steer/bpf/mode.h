/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * What a mode fixes when it is applied: constants the control plane sets
 * before the object is loaded (steer.LoadFor, from the config), in
 * .rodata, which the kernel freezes. The verifier reads them as the
 * constants they are and drops the code of every feature the mode leaves
 * out, so a mode pays per packet only for what it uses, as katran's
 * compile-time features do without one build per mode. What lanes agent
 * switches while the programs run stays in steer_cfg (consts.h: CFG_*).
 *
 * The flags' bits are apart from steer_cfg.flags' (CFG_*), so the control
 * plane reads the two as one set.
 */
#pragma once

#include "consts.h"

/* steer_mode.flags */
#define MODE_PRIO 0x2 /* classify flows against steer_prio (PRISM) */
/* steer_xdp marks and counts its frames in flight: set only while a program
 * that counts them seen (steer_tc_ingress, steer_tc_split_seen) is attached
 * to the underlay's tc ingress, or the counts would never drain. */
#define MODE_COUNT_SPLIT 0x4
/* MFLOW: split elephants into micro-flows in steer_xdp (cpumap, before skb
 * allocation), or in steer_tc_ingress (the RPS hash of the VXLAN device). */
#define MODE_MFLOW 0x8
#define MODE_MFLOW_BRIDGE 0x10
/* steer_tc_ingress does not count the bridge stage's frames in flight: set
 * while nothing (steer_tc_egress) counts them seen, or the counts would
 * only grow. */
#define MODE_NO_BRIDGE_COUNT 0x20
/* PRISM-sync: high-priority frames for a destination in steer_sync skip
 * every queue (see sync_dest). Only with MODE_PRIO. */
#define MODE_SYNC 0x40
/* While steer_prio holds no rule (prio_shapes 0) there is nothing to
 * preempt for, so bulk flows whose first stage would take a queue on
 * inline_cpu stay in the NIC poll, vanilla's path, instead of paying that
 * queue's hop; with the first rule each goes to the queue as soon as none
 * of its frames is left behind (place(), PLACE_LOCAL). Set by the planner
 * only where the NIC is polled on inline_cpu alone: PRISM's receive core,
 * or falcon-prism's IRQ core (its first stage's home). With prio_quiet_ms
 * set, also while the high class is quiet: no high-priority frame for that
 * long (see prio_quiet). */
#define MODE_PRIO_IDLE_INLINE 0x400u
/* PRISM's per-class queue at the container veth (steer_tc_veth_class):
 * each class goes to its own receive queue of the container-side veth. */
#define MODE_VETH_CLASS 0x800u
/* The bridge stage stays through the RPS backlog, as before stay_direct:
 * for measuring what running on changes. */
#define MODE_STAY_QUEUED 0x1000u
/* The fast path into the container (fast.h): steer_tc_fast and
 * steer_tc_fast_learn act only with it. */
#define MODE_FAST 0x4000u
/* With MODE_FAST: the fast path from a VXLAN device (fast_vx) leaves GSO
 * frames to the kernel's path, as the one from the underlay does. */
#define MODE_FAST_NO_GSO 0x8000u
/* With MODE_FAST: beside another mode whose programs count frames through
 * their queues (falcon, PRISM). A frame the fast path takes is counted
 * out of the first stage's queue (fast_dequeued) and leaves with a hash
 * no later stage counts out; alone, the fast path skips both. */
#define MODE_FAST_BESIDE 0x10000u
struct steer_mode {
	__u32 flags; /* MODE_* */
	/* MODE_PRIO_IDLE_INLINE: bulk also stays in the NIC poll while no
	 * high-priority frame came for this long; 0: only while no rule. */
	__u32 prio_quiet_ms;
	/* PRISM high=auto (with MODE_PRIO_IDLE_INLINE): the frame rate of a
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
	/* MODE_PRIO_IDLE_INLINE: the core the NIC is polled on alone. Its
	 * NIC poll and its queues' kthreads run one after another with bottom
	 * halves off, so a flow moves between them at once (PLACE_LOCAL);
	 * a move to or from another core's queue waits for an idle gap. */
	__u32 inline_cpu;
	/* PRISM aside-below (with high=auto and bulk=auto): the receive
	 * work, in percent of inline_cpu, under which lanes agent stands PRISM
	 * aside (steer_aside); read by the agent. 0: off, and steer_aside is
	 * ignored. */
	__u32 aside_pct;
	/* PRISM aside-depth (with aside_pct): the frames per poll of the
	 * underlay NIC on inline_cpu, in hundredths, under which lanes agent
	 * stands PRISM aside where it can count the NIC's polls (aside_pct's
	 * receive work decides where it cannot); read by the agent. 0: the
	 * receive work alone. */
	__u32 aside_depth;
	/* MODE_FAST: an entry unused for this long is void (deleted at its
	 * next frame, which takes the kernel's path). */
	__u32 fast_idle_ms;
};

const volatile struct steer_mode steer_mode = {};

/* Does the mode have any of the MODE_* flags f? */
static __always_inline int mode(__u32 f)
{
	return (steer_mode.flags & f) != 0;
}

/* Does the mode have PRISM's aside pass (prio.h's aside_pass)? Stepping
 * aside (aside_pct, which the planner sets only with high=auto, bulk=auto
 * and so MODE_PRIO_IDLE_INLINE); never with micro-flows, which the control
 * plane does not compose with it. */
static __always_inline int mode_aside_pass(void)
{
	return mode(MODE_PRIO_IDLE_INLINE) && steer_mode.aside_pct && !mode(MODE_MFLOW);
}
