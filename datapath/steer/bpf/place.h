/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Falcon's placement: the core a flow's stage goes to (the table's bucket,
 * the flow's own state, the move rule that keeps it in order), and how a
 * tc stage names that core to the next device's RPS (rps_to) or stays on
 * the core it runs on, with or without a pass through the RPS backlog
 * (stay_direct, run_on), also while the stage is at home (home_idle).
 */
#pragma once

#include "prio.h"

/* place()'s opts, for PRISM's classes under MODE_PRIO_IDLE_INLINE (bulk's
 * while no rule exists or the high class is quiet, high's while
 * steer_high_inline says so for the rule that marked them). */
#define PLACE_STAY 0x1  /* run in the NIC poll (STAY) where the table says inline_cpu */
#define PLACE_LOCAL 0x2 /* this core is inline_cpu: see place() */

/* Is place i (a core index of either class, or STAY) on steer_mode's
 * inline_cpu: its queues, or the NIC poll, which runs there alone? */
static __always_inline int inline_place(const struct steer_cfg *cfg, __u32 i)
{
	__u32 c = i & ~CLASS_HI;

	return i == STAY || (c < cfg->ncpus && cfg->cpus[c & (MAX_CPUS - 1)] == steer_mode.inline_cpu);
}

/*
 * The split stage after PRISM's aside pass (aside_pass): a flow state
 * stamped before the pass's latest start or end may have had frames
 * passed since, unplaced and untracked, which all ran in the NIC poll; so
 * it is taken as a flow in the NIC poll whose last frame came when the
 * pass ended, with no frame counted there: its move to a queue waits for
 * an idle gap, or for a counted frame (the fast move), as any flow's out
 * of the NIC poll. A flow without a state may have had frames passed too
 * if it comes within a flowlet gap of the end: it starts in the NIC poll.
 * A frame here while the pass is on is one aside_pass no longer passes,
 * so the pass ends with it: the one place it ends. In every mode, as a
 * mode change (setMode) keeps the maps. Returns whether a flow without a
 * state starts in the NIC poll; *gen is the pass's gen, for its state.
 */
static __always_inline int pass_return(const struct steer_cfg *cfg, __u32 stage, struct steer_flow_state *st,
				       __u32 *gen)
{
	struct aside_pass *p;

	if (stage != STAGE_SPLIT)
		return 0;
	p = pass_state();
	if (!p || !p->gen)
		return 0;
	if (p->on)
		pass_end(p);
	*gen = p->gen;
	if (!st)
		return idle_since(cfg, p->end_ns, bpf_ktime_get_ns()) < cfg->flowlet_ns;
	if (st->pass_gen == p->gen)
		return 0;
	st->pass_gen = p->gen;
	st->cpu_idx = STAY;
	st->inline_mark = 0;
	if (p->end_ns > st->last_ns)
		st->last_ns = p->end_ns;
	return 0;
}

/*
 * A state for a flow that has none at this stage (new, or evicted by the
 * LRU): where the table puts it (want), or in the NIC poll if the aside
 * pass may have passed frames of it (pass_return), or at STAY on a
 * container device still in its adoption window; where its flow's
 * evicted state left its frames (remake). No frame counted yet: place()
 * places the frame that made it as any, by the move rule. NULL if it
 * could not be stored.
 */
static __always_inline struct steer_flow_state *make_state(const struct steer_cfg *cfg,
							   const struct steer_flow_key *key, __u32 fh, __u32 stage,
							   __u32 ifindex, __u32 bucket, __u32 want)
{
	__u32 gen = 0;
	int passed = pass_return(cfg, stage, NULL, &gen);
	/* MFLOW's rate windows want real arrival times. */
	__u64 now = now_ns(cfg, cfg->mf_ncores != 0);

	if (passed || (stage == STAGE_CONTAINER && want != STAY && adopting(ifindex)))
		want = STAY;
	struct steer_flow_state fresh = {
		.cpu_idx = want,
		.ifindex = ifindex,
		.bucket = bucket,
		.last_ns = now,
		.inline_mark = INLINE_BOUNDARY,
		/* A staying container stage queues here (stay_core). */
		.stay = stage == STAGE_CONTAINER && want == STAY ? STAY_QUEUED : STAY_FRESH,
		.stay_cpu = bpf_get_smp_processor_id(),
		.pass_gen = gen,
	};

	/* Frames passed by the aside pass ran in the NIC poll, after
	 * anything an evicted state queued: the pass ran only with the
	 * queues empty. */
	remake(cfg, stage, fh, now, !passed, &fresh);
	/* NOEXIST: if another core inserted the flow meanwhile, its entry
	 * (and in-flight count) stays. */
	bpf_map_update_elem(&steer_flows, key, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&steer_flows, key);
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
	__u32 was, held = STAY, gen = 0, win, noted_idx, noted_epoch, noted_cpu;
	int made = 0;

	if (want >= cfg->ncpus)
		want = STAY;
	else if (hi)
		want |= CLASS_HI;
	/* The hop to inline_cpu's queue buys nothing then; one to another
	 * core's (Falcon's spreading) still does. */
	if ((opts & PLACE_STAY) && inline_place(cfg, want))
		want = STAY;
	if (sync)
		want = SYNC_IDX;

	st = bpf_map_lookup_elem(&steer_flows, &key);
	if (!st) {
		/* Where make_state puts it is this frame's place: no move. */
		made = 1;
		st = make_state(cfg, &key, fh, stage, ifindex, bucket, want);
		if (!st) {
			/* Not stored: place by the table, without history. */
			*out = NULL;
			return want;
		}
	}
	noted_idx = st->cpu_idx;
	noted_epoch = st->epoch;
	noted_cpu = st->stay_cpu;
	pass_return(cfg, stage, st, &gen);
	/* A pending move needs the precise clock for its flowlet test, and
	 * so does the next packet's test: stamp this one precisely too. */
	now = now_ns(cfg, precise || st->cpu_idx != want);
	was = st->cpu_idx;
	if (st->cpu_idx != want && !made) {
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
			   (st->cpu_idx != STAY || (st->inline_mark & INLINE_COUNTED)) &&
			   inline_place(cfg, st->cpu_idx) && inline_place(cfg, want)) {
			/* The NIC poll and the queues (either class's) the flow
			 * leaves and takes are on this one core (inline_cpu),
			 * where the later stages' queues are shared and fed in
			 * order: a frame counted seen has reached them
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
				st->epoch = next_epoch_after(stage, fh, st->epoch);
			}
			st->cpu_idx = want;
			/* An idle gap: the NIC poll's GRO holds nothing of it. */
			st->inline_mark = INLINE_BOUNDARY;
			count(stage, CNT_MOVED);
		} else {
			/* Counting the NIC poll's frames readies the fast move
			 * and tells sync's shortcut when none is left behind,
			 * so only for those: a move to another core's queue
			 * waits for the idle gap, which may be long in coming. */
			if ((opts & PLACE_LOCAL) && st->cpu_idx == STAY) {
				if (want == SYNC_IDX || inline_place(cfg, want))
					st->inline_mark |= INLINE_COUNT;
				else
					st->inline_mark &= ~INLINE_COUNT;
			}
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
		st->epoch = next_epoch_after(stage, fh, st->epoch);
		st->stay = STAY_FRESH;
		count(stage, CNT_UNDRAINED);
	}
	if (stage == STAGE_CONTAINER && st->cpu_idx == STAY)
		held = stay_core(cfg, st, now, fh);
	/* Its slot's note, once a window and whenever where its frames go or
	 * their count changed (remake). */
	win = slot_window(now);
	if (st->slot_win != win || st->cpu_idx != noted_idx || st->epoch != noted_epoch || st->stay_cpu != noted_cpu)
		note_slot(cfg, flow_slot(stage, fh), fh, st, win);
	st->ifindex = ifindex;
	st->bucket = bucket;
	st->last_ns = now;
	st->packets++;
	st->bytes += len;
	*out = st;
	return held != STAY ? held : st->cpu_idx;
}

/* The index of the core this program runs on, or STAY if it is not in the set. */
static __always_inline __u32 this_cpu_index(const struct steer_cfg *cfg)
{
	__u32 cpu = bpf_get_smp_processor_id();

	return cpu < MAX_CPUS ? cfg->index_of[cpu] : STAY;
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
 * busy IRQ core, one more FIFO to wait in, which raised the ping-pong's
 * p99 under background with the stages at home (docs/decisions/README.md,
 * Falcon), as plain RPS maps aimed at the IRQ core itself did. A zero
 * hash is the stock kernel's one way around it: get_rps_cpu
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
	return !mode(MODE_MFLOW | MODE_MFLOW_BRIDGE | MODE_NO_BRIDGE_COUNT | MODE_STAY_QUEUED);
}

/* Hand the frame on without an RPS pass (see stay_direct). */
static __always_inline int run_on(struct __sk_buff *skb)
{
	bpf_set_hash(skb, 0);
	return TC_ACT_UNSPEC;
}

/*
 * At home, a flow whose bridge-stage state would queue (it does not run on,
 * on this core) queues, uncounted, behind whatever it has queued, unless
 * it was idle for drain_ns: its frames queued before are presumed out
 * then, as for a move (place()), and it runs on like a flow without state.
 * A flow that queues is stamped, so that lanes agent sees it queuing
 * (steer.Placement.HomeQueues) and keeps the stage off its bare path (CFG_HOME_BARE).
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
