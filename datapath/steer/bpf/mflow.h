/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * MFLOW's micro-flow cutting: the elephant test, the cut of an elephant
 * into micro-flows of mf_batch frames dealt to the split cores round
 * robin, at the NIC poll (split_microflow: a cpumap redirect, the
 * sequence number in the XDP metadata) or at the bridge (split_bridge: the
 * RPS hash of the VXLAN device), and the skb side's reading back of the
 * sequence (arrived), which it hands on in skb->priority (mflow_tag.h).
 */
#pragma once

#define MFLOW_TAG_SKB
#include "mflow_tag.h"
#include "place.h"

#define MF_SEEN (1ull << 32) /* flow state mf_seen: a sequence number is stored */

/* mf_last's unit: 1024 ns, so 32 bits span 73 minutes. */
#define MF_LAST_SHIFT 10

/* The flow state's mf_elephant */
#define MF_BIG 0x1       /* the flow is split */
#define MF_MID_SEG 0x2   /* its last frame did not end a GRO segment */
#define MF_OFF_SHIFT 8   /* bits 8-15: the cut's rotation (next_microflow) */

/*
 * The rotation that puts micro-flow mf_started, a cut's first, on the
 * core this program runs on, or 0 where that is not a split core. The
 * flow's frames before the cut ran here, in the NIC poll (or tc ingress)
 * and the per-core path behind it (the VXLAN device's GRO cell, a FIFO
 * per core); a cpumap kthread or backlog on this core runs after them and
 * joins that path behind them, so the cut's first micro-flow cannot pass
 * them on the way to the reassembler, which lets a flow's first one
 * through at once.
 * Micro-flow k then goes to slot (k + rotation) % mf_ncores: round robin
 * by sequence number still, which the reassembler's rule by core needs
 * (the micro-flows of one residue share a core).
 */
static __always_inline __u32 cut_rotation(const struct steer_cfg *cfg, const struct steer_flow_state *st)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 idx = cpu < MAX_CPUS ? cfg->index_of[cpu] : STAY;
	__u32 n = cfg->mf_ncores;

	for (__u32 s = 0; s < MAX_CPUS; s++) {
		if (s >= n)
			break;
		if (cfg->mf_cores[s] == idx)
			return (s + n - st->mf_started % n) % n;
	}
	return 0;
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
 *
 * With a reassembler (mf_quiet_ns) an elephant falls back only after the
 * flow was idle for mf_quiet_ns: its frames after the fall back carry no
 * micro-flow tag, and the reassembler, which tells flows apart by their
 * tags alone, would let them pass what it still holds of the flow's last
 * micro-flows. The planner sets twice the reassembler's timeout: by then
 * it has released or skipped all it held of the flow, unless a frame took
 * longer than its timeout on the way, which it would skip anyway. So a
 * slowed elephant stays split, in order, until it pauses.
 */
static __always_inline int elephant(const struct steer_cfg *cfg, struct steer_flow_state *st,
				    __u64 now, __u32 n, __u32 stage, int seg_end)
{
	__u32 el = st->mf_elephant;
	__u64 age = now - st->mf_win_start;

	if (cfg->mf_quiet_ns) {
		/* Serial difference: a gap of a multiple of 73 minutes reads
		 * short, which keeps an elephant split (the safe side). Stamped
		 * only here: without a reassembler nothing reads it. */
		__u32 gap = (__u32)(now >> MF_LAST_SHIFT) - st->mf_last;

		st->mf_last = (__u32)(now >> MF_LAST_SHIFT);
		if ((el & MF_BIG) && cfg->mf_thresh && gap >= (cfg->mf_quiet_ns >> MF_LAST_SHIFT)) {
			el &= MF_MID_SEG;
			count(stage, CNT_MF_ENDED);
			/* A new window from this frame, as after any gap. */
			age = cfg->mf_window_ns;
		}
	} else if (age >= cfg->mf_window_ns && (el & MF_BIG) && cfg->mf_thresh &&
		   (st->mf_win_frames < cfg->mf_thresh || age >= 2 * cfg->mf_window_ns)) {
		el &= MF_MID_SEG;
		count(stage, CNT_MF_ENDED);
	}
	if (age >= cfg->mf_window_ns) {
		st->mf_win_start = now;
		st->mf_win_frames = 0;
	}
	st->mf_win_frames += n;
	/* A cut starts only where the underlay's GRO holds nothing of the
	 * flow: after a frame that ended a segment (a later one flushed at
	 * once, a PSH, could pass one still held), so no earlier frame is
	 * left behind in the NIC poll; and on this core (cut_rotation). */
	if (!(el & MF_BIG) && st->mf_win_frames >= cfg->mf_thresh && !(el & MF_MID_SEG)) {
		el = MF_BIG | (cut_rotation(cfg, st) << MF_OFF_SHIFT);
		st->mf_left = 0;
		count(stage, CNT_MF_ELEPHANT);
	}
	el = seg_end ? (el & ~MF_MID_SEG) : (el | MF_MID_SEG);
	st->mf_elephant = el;
	return el & MF_BIG;
}

/* Start the flow's next micro-flow on the next split core, round robin by
 * sequence number from the cut's rotation (one division per micro-flow,
 * none per frame). */
static __always_inline void next_microflow(const struct steer_cfg *cfg, struct steer_flow_state *st,
					   __u32 stage)
{
	__u32 slot = (st->mf_started + (st->mf_elephant >> MF_OFF_SHIFT)) % cfg->mf_ncores;
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
 * goes to mf_cores[(k + rotation) % mf_ncores]; a GRO skb across a
 * boundary stays whole in the micro-flow it starts in. st->last_ns is the
 * arrival time place() just stored; seg_end says whether the frames end a
 * GRO segment (always, past GRO).
 *
 * One writer, no atomics: a flow's frames reach the splitting program from
 * one rx queue (RSS keeps a flow on one queue), whose NAPI poll runs on one
 * core at a time; tc ingress on the underlay runs there too, or, when
 * Falcon's split stage composes, on the one split core the flow is placed
 * on at a time.
 */
static __always_inline __u32 microflow(const struct steer_cfg *cfg, struct steer_flow_state *st,
				       __u32 n, __u32 stage, int seg_end)
{
	if (!cfg->mf_ncores || !cfg->mf_batch || !elephant(cfg, st, st->last_ns, n, stage, seg_end))
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
 * MFLOW's later split (MODE_MFLOW_BRIDGE), in tc ingress on the underlay:
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
 * skb->hash. Splitting before decap is MODE_MFLOW's job, before the skb.
 */
static __always_inline int split_bridge(struct __sk_buff *skb, const struct steer_cfg *cfg,
					struct steer_flow_state *st, __u32 fh)
{
	__u32 n = skb_frames(skb);
	__u32 idx = microflow(cfg, st, n, STAGE_BRIDGE, 1);

	if (idx == STAY)
		return 0;
	split_sent(st, n, STAGE_BRIDGE);
	/* For the reassembler at the container's veth (mflow_tag.h). */
	mflow_tag_skb(skb, fh, cfg->meta_gen, st->mf_started - 1);
	rps_to(skb, cfg, idx, fh, STAGE_BRIDGE, 0, 0);
	return 1;
}
