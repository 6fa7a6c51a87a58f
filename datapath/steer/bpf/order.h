/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Order keeping: what stops a move of a flow from letting its new frames
 * overtake its old ones. Each stage counts the frames it hands to a queue
 * in flight (queued) and the next stage's program counts them out
 * (seen_split, seen_hashed); frames cross from XDP to the skb side marked
 * in the XDP metadata (lanes_meta.h) with their count's epoch, as later
 * stages' frames carry it in their hash (flow.h). The split stage's
 * cpumap queues also keep per-core accounting (struct steer_queue), so a
 * frame dropped there is told from one still queued; the later stages'
 * drops are counted out by the kfree_skb tracepoint (drop_tuple, trace.c). Also here: the hold on
 * a staying container stage's core, the wait of a split-stage move for a
 * staying bridge stage, the adoption window of a container device that
 * lanes took over after apply, and where a state the LRU evicted is made
 * anew (remake).
 */
#pragma once

#include <bpf/bpf_core_read.h>

#include "lanes_meta.h"
#include "flow.h"

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
 * after the frames' per-flow seen_split(): a flow is settled only once its queue
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

/* What uncounted() adds for a frame that could not be marked: the count
 * stays above zero until the flowlet rule presumes it dropped (drain_ns
 * idle), so the flow never takes PLACE_LOCAL's fast move past a frame
 * nobody counts. */
#define UNCOUNTED (1ll << 40)

/* Is ifindex a container device adopted after apply, still in its window
 * (steer_adopt)? */
static __always_inline int adopting(__u32 ifindex)
{
	__u64 *until = bpf_map_lookup_elem(&steer_adopt, &ifindex);

	return until && bpf_ktime_get_ns() < *until;
}

/*
 * A flow state the LRU evicted (or that aged out) and that its flow's
 * next frame makes anew. Frames the old state queued may still be in
 * flight: in a cpumap queue behind a starved kthread, in an RPS backlog.
 * A state made anew at the table's place could let its first frames
 * overtake them (onto another core, into the other class's queue, onto
 * sync's shortcut), and one whose count epoch was the old one's would
 * count the old frames out of its own count, so that a later move
 * overtakes frames it still has queued. So each state notes in its slot
 * of steer_epochs where its frames go and in which epoch (note_slot), and
 * a state made anew whose slot holds its own flow's note starts where
 * the old one's frames went, in another epoch: its frames queue behind
 * the old ones, and it leaves only by the move rule (place()), once its
 * own frames are out (and with them, in the same queue, every older one)
 * and the flow was idle for a flowlet gap. Leaving sync's shortcut needs
 * no wait, and a core no longer in the set has no order left to keep.
 *
 * The note's windows: SLOT_WIN_SHIFT bits of the clock, about 17 ms. A
 * state notes itself at its first frame in each window and whenever its
 * place, epoch or held core changed; a note another flow's state wrote
 * within the drain time (slot_recent) is kept, so that an active flow's
 * note outlives the burst of new flows that evicts its state. Two flows
 * active at once in one slot (of EPOCH_SLOTS per stage): the second is
 * not noted, and made anew it starts as a new flow would.
 */
#define SLOT_WIN_SHIFT 24

/* The note window of clock reading now; never 0 (no note). */
static __always_inline __u32 slot_window(__u64 now)
{
	return (__u32)(now >> SLOT_WIN_SHIFT) + 1;
}

/* Was the slot's note written within the drain time (its state's last
 * frame came in the note's window or earlier, the coarse clock's lag
 * counted as activity; a note from a later window than win, stamped on
 * another core with a clock ahead, too)? Never without a drain time,
 * which presumes every queue empty. */
static __always_inline int slot_recent(const struct steer_cfg *cfg, const struct flow_slot *s, __u32 win)
{
	__s32 ago = win - s->win;

	return cfg->drain_ns && s->win &&
	       (ago <= 0 || (__u64)ago <= ((cfg->drain_ns + cfg->coarse_lag_ns) >> SLOT_WIN_SHIFT) + 1);
}

/* Note st (the state of the flow with hash fh) in its slot s, unless
 * another flow's note there is recent. */
static __always_inline void note_slot(const struct steer_cfg *cfg, struct flow_slot *s, __u32 fh,
				      struct steer_flow_state *st, __u32 win)
{
	st->slot_win = win;
	if (!s || (s->fh != fh && slot_recent(cfg, s, win)))
		return;
	s->fh = fh;
	s->place = st->cpu_idx;
	s->epoch = st->epoch;
	s->stay_cpu = st->stay_cpu;
	s->win = win;
}

/* Where a state made anew starts from its flow's note s: the noted place,
 * or for a container stage that stayed, the core it held while its note
 * is recent; STAY for the container stage means here (see stay_core). */
static __always_inline void remade_place(const struct steer_cfg *cfg, __u32 stage, const struct flow_slot *s,
					 __u32 win, struct steer_flow_state *fresh)
{
	__u32 p = s->place, cpu = s->stay_cpu;

	if (p == SYNC_IDX || (p != STAY && (p & ~CLASS_HI) >= cfg->ncpus))
		return;
	if (stage == STAGE_CONTAINER && p == STAY) {
		if (!slot_recent(cfg, s, win) || cpu == bpf_get_smp_processor_id() || cpu >= MAX_CPUS)
			return;
		p = cfg->index_of[cpu & (MAX_CPUS - 1)];
		if (p >= cfg->ncpus)
			return;
	}
	if (p != fresh->cpu_idx) {
		fresh->cpu_idx = p;
		fresh->stay = STAY_FRESH;
	}
}

/* A state made at now for the flow with hash fh: its count epoch, and
 * with restore, where it starts if the LRU evicted its flow's (see
 * above); noted in its slot. */
static __always_inline void remake(const struct steer_cfg *cfg, __u32 stage, __u32 fh, __u64 now, int restore,
				   struct steer_flow_state *fresh)
{
	struct flow_slot *s = flow_slot(stage, fh);
	__u32 win = slot_window(now);

	if (!s || !s->win || s->fh != fh) {
		fresh->epoch = slot_epoch(s);
	} else {
		fresh->epoch = slot_epoch_after(s, s->epoch);
		if (restore)
			remade_place(cfg, stage, s, win, fresh);
		count(stage, CNT_REMADE);
	}
	note_slot(cfg, s, fh, fresh, win);
}

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
static __always_inline __u32 stay_core(const struct steer_cfg *cfg, struct steer_flow_state *st, __u64 now,
				       __u32 fh)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 idx;

	if (st->stay == STAY_QUEUED && st->stay_cpu == cpu)
		return STAY; /* the common case: nothing to hold, nothing to write */
	if ((st->stay & STAY_MODE) == STAY_QUEUED && st->inflight > 0) {
		idx = st->stay_cpu < MAX_CPUS ? cfg->index_of[st->stay_cpu & (MAX_CPUS - 1)] : STAY;
		if (cfg->drain_ns && idle_since(cfg, st->last_ns, now) >= cfg->drain_ns) {
			st->inflight = 0;
			st->epoch = next_epoch_after(STAGE_CONTAINER, fh, st->epoch);
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
	meta->flags = LANES_META_QUEUED | (qid << LANES_META_QID_SHIFT) | meta_gen(cfg) |
		      ((st ? st->epoch : 0) & LANES_META_EPOCH_MASK) << LANES_META_EPOCH_SHIFT;
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
		if (mode_aside_pass())
			stamp_at(&q->marked_at);
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
 * The skb side has seen n frames the split stage of the flow queued, in
 * the count epoch their metadata carries (LANES_META_EPOCH, from flags):
 * frames of an older count (one presumed drained, or an evicted state's)
 * do not lower the current one. A flow that was never counted is left
 * alone.
 */
static __always_inline void seen_split(const struct tuple *t, __u32 flags, __u32 n)
{
	struct steer_flow_key key = flow_key(t, STAGE_SPLIT);
	struct steer_flow_state *st = bpf_map_lookup_elem(&steer_flows, &key);

	if (st && (st->epoch & LANES_META_EPOCH_MASK) == ((flags >> LANES_META_EPOCH_SHIFT) & LANES_META_EPOCH_MASK))
		count_out(&st->inflight, n);
}

/*
 * seen_split() for a later stage (tc), whose frames carry their count in the
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

/* Did the previous stage count this frame queued? Frames it queued without
 * counting (a stage at home, MFLOW's micro-flows) must not be counted seen:
 * they would cancel counted frames still queued behind them, and a move
 * would then overtake those (the case just after a stage leaves home).
 * No hash at all (BPF_PROG_RUN, a frame no lanes program hashed)
 * counts. */
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
