/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * PRISM's priority classification: whether a flow is high priority (a
 * rule of steer_prio matches it), high=auto's per-rule switch into the
 * NIC poll, stepping aside, the quiet clocks (no high-priority frame, no bulk frame, bulk
 * beside busy marked flows) that keep a class in the NIC poll while
 * queuing it would buy nothing, and the mark of the per-class container
 * queue's frames (veth.c).
 */
#pragma once

#include "order.h"

static __always_inline __u32 prio_shapes(void)
{
	__u32 zero = 0;
	__u32 *v = bpf_map_lookup_elem(&steer_prio_shapes, &zero);

	return v ? *v : 0;
}

/*
 * Does rule r's switch run its flows in the NIC poll (steer_high_inline's
 * deadline not passed)? Counts the frame for the agent's rate. The coarse
 * clock lags by up to a tick, which only stretches the agent's deadline.
 */
static __always_inline int high_inline(const struct steer_cfg *cfg, const struct prio_rule *r)
{
	__u64 one = 1, *n, *until;

	if (!steer_mode.high_auto_pps)
		return 0;
	n = bpf_map_lookup_elem(&steer_high_frames, r);
	if (n)
		*n += 1; /* this core's slot: no other writer */
	else
		bpf_map_update_elem(&steer_high_frames, r, &one, BPF_NOEXIST);
	until = bpf_map_lookup_elem(&steer_high_inline, r);
	return until && *until && (__s64)(*until - bpf_ktime_get_coarse_ns()) > 0;
}

/*
 * Does PRISM stand aside (steer_aside's deadline not passed)? Then both
 * classes run in the NIC poll: the receive core is too lightly loaded for
 * a queue to save a marked frame the wait its hop costs. The coarse clock
 * lags by up to a tick, which only stretches the agent's deadline.
 */
static __always_inline int stepped_aside(void)
{
	__u32 zero = 0;
	__u64 *until;

	if (!steer_mode.aside_pct)
		return 0;
	until = bpf_map_lookup_elem(&steer_aside, &zero);
	return until && *until && (__s64)(*until - bpf_ktime_get_coarse_ns()) > 0;
}

/*
 * The aside pass: stood aside, every frame runs in the NIC poll, so while
 * nothing of any flow is queued there is nothing for the full path to
 * keep in order, and steer_xdp passes the frame at once: the cost of the
 * hook alone, not of parsing, classifying and tracking it (stood aside is
 * where there is no queueing to remove, so that cost was all PRISM added).
 * Only where stood aside means every flow in the NIC poll: the split stage
 * on inline_cpu alone (no Falcon spreading, no micro-flows) and every
 * frame polled there.
 *
 * On: at a frame on inline_cpu once its queues' accounting tells them
 * empty (queue_empty_now; never while untracked) and no frame was counted
 * in for a flowlet gap (marked_at). Empty, every frame a queue took was
 * seen past its GRO; the gap is place()'s rule for the rest of the way,
 * the shared VXLAN GRO cell above all, where a marked frame held would be
 * overtaken by a passed, unmarked one ending a segment (mark_inline). So a
 * frame passed then comes behind every earlier frame of its flow. Off: at
 * the first frame that takes the full path (the deadline lapsed: the
 * agent's return, a new config, an agent gone; or a config or mode where
 * it cannot be on), in place() (pass_return), which takes every flow state stamped before
 * as if its last frame went through the NIC poll at the pass's end
 * (pass_return), so a flow that had frames passed leaves for a queue by
 * the usual rules: an idle gap, or the fast move after a counted frame.
 * *aside says whether PRISM stands aside, where it was looked up (left as
 * it was otherwise).
 */
static __always_inline struct aside_pass *pass_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&steer_aside_pass, &zero);
}

static __always_inline void pass_end(struct aside_pass *p)
{
	p->end_ns = bpf_ktime_get_ns() | NS_PRECISE;
	p->gen++;
	p->on = 0;
}

static __always_inline int aside_pass(const struct steer_cfg *cfg, int *aside)
{
	struct aside_pass *p;
	struct steer_queue *q;
	__u32 core = steer_mode.inline_cpu;

	if (!mode_aside_pass())
		return 0;
	*aside = stepped_aside();
	/* Not now: the full path, whose place() ends a pass left on. */
	if (!*aside || cfg->ncpus != 1 || cfg->cpus[0] != core)
		return 0;
	p = pass_state();
	if (!p)
		return 0;
	if (p->on)
		return 1;
	if (bpf_get_smp_processor_id() != core)
		return 0;
	q = core_queue(core);
	/* marked_at 0: no frame was ever counted in, however short the uptime. */
	if (!queue_tracked(q) || (q->marked_at && idle_since(cfg, q->marked_at, bpf_ktime_get_ns()) < cfg->flowlet_ns) ||
	    !queue_empty_now(q, core))
		return 0;
	p->gen++;
	p->on = 1;
	return 1;
}

/*
 * Does a rule in steer_prio match the flow? A rule has one of eight shapes:
 * a side (dir), and port and protocol each given or "any" (i: 0 both, 1
 * port only, 2 protocol only, 3 neither). Only shapes the control plane
 * says exist are looked up (steer_prio_shapes), so a bulk flow costs one
 * lookup per shape in use, not eight.
 */
static __always_inline int high_prio(const struct steer_cfg *cfg, const struct tuple *t, struct prio_rule *hit)
{
	struct prio_rule r = {};
	__u32 shapes = prio_shapes();

#pragma unroll
	for (int dir = 0; dir < 2; dir++) {
		r.dir = dir;
		r.addr = dir ? t->saddr : t->daddr;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if (!(shapes & (1u << (dir * 4 + i))))
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

static __always_inline void stamp_tick(void *seen)
{
	__u32 zero = 0;
	__u64 *last = bpf_map_lookup_elem(seen, &zero);

	if (last)
		stamp_at(last);
}

/*
 * Is the high class quiet (steer_mode.prio_quiet_ms set and no high-priority
 * frame for that long)? Then bulk keeps the NIC poll as while no rule
 * exists: the bulk queue's hop only pays off when there is something to
 * preempt for. A high-priority frame ends the quiet at once (seen_high), and
 * the bulk flows then move to their queue as after a rule's arrival. The
 * price: that first frame finds bulk still in the NIC poll, as in vanilla.
 */
static __always_inline int prio_quiet(const struct steer_cfg *cfg)
{
	return quiet_for(cfg, &steer_prio_seen, steer_mode.prio_quiet_ms);
}

/*
 * Is bulk quiet (steer_mode.bulk_quiet_ms set and no bulk frame for that long)?
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
	return quiet_for(cfg, &steer_bulk_seen, steer_mode.bulk_quiet_ms);
}

/*
 * Does bulk run in the NIC poll beside busy marked flows (bulk=auto)? Yes
 * while high-priority frames came in the last bulk_auto_ms and every one
 * of them ran in the NIC poll as a busy rule's. The bulk queue exists so
 * that a queued high-priority frame waits behind no bulk frame's full
 * receive work; when no marked frame takes a queue, its hop (a redirect
 * and a second skb build for every bulk frame) buys nothing and costs the
 * core that the busy marked service runs on (docs/decisions/README.md,
 * `bulk=auto`: a marked memcached lost request rate with bulk queued). One queued high-priority frame
 * (a light rule's) ends it at once, and bulk flows go back to their queue
 * in order, as after a rule's arrival; that frame, and those right behind
 * it, find bulk still in the NIC poll.
 */
static __always_inline int bulk_beside_busy(const struct steer_cfg *cfg)
{
	__u32 zero = 0, ms = steer_mode.bulk_auto_ms;
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

	if (!steer_mode.bulk_auto_ms)
		return;
	seen = bpf_map_lookup_elem(&steer_high_seen, &zero);
	if (seen)
		stamp_at(busy_inline ? &seen->busy : &seen->queued);
}

/* Only while a rule exists: without one no frame is high priority, and
 * the bulk path, the busy one, need not read the clock for nobody. */
static __always_inline void seen_bulk(const struct steer_cfg *cfg)
{
	if (steer_mode.bulk_quiet_ms && prio_shapes())
		stamp_tick(&steer_bulk_seen);
}

/* Frames steer_xdp passes without steering them, per core, in the current
 * coarse tick: for bulk quiet, they count as bulk once PASSED_AS_BULK of
 * them came within one tick on one core (2000 frames/s at HZ=250, 8000
 * at HZ=1000), so a flood of
 * traffic it does not steer (another overlay, inner fragments) ends the
 * quiet, and the odd ARP or neighbour solicitation does not. */
#define PASSED_AS_BULK 8

static __always_inline void seen_passed(const struct steer_cfg *cfg)
{
	struct passed_tick *p;
	__u32 zero = 0;
	__u64 now;

	if (!steer_mode.bulk_quiet_ms || !prio_shapes())
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
	if (steer_mode.prio_quiet_ms)
		stamp_tick(&steer_prio_seen);
}

#define VETH_EPOCHS 8

static __always_inline __u32 veth_mark(__u32 fh, __u32 epoch)
{
	return (fh & ~((VETH_EPOCHS - 1) << 1)) | ((epoch & (VETH_EPOCHS - 1)) << 1) | 1;
}
