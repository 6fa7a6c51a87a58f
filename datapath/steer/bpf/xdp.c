/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * steer_xdp, the split stage on the underlay's XDP hook: pass at once while
 * PRISM stands aside with nothing queued (aside_pass), classify (prio.h),
 * take PRISM-sync's shortcut (sync.h), cut micro-flows (mflow.h), or place
 * the frame's first stage on a core's cpumap queue (place.h), counted in
 * flight (order.h).
 */
#include "sync.h"
#include "mflow.h"

SEC("xdp")
int steer_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct cursor c = { .pos = data, .end = data_end, .left = data_end - data };
	struct steer_cfg *cfg = get_cfg();
	struct tuple t = {};
	struct steer_flow_state *st = NULL;
	struct overlay ov = {};
	struct prio_rule rule = {};
	struct sync_src *src = NULL;
	__u32 idx, core, dest = 0, opts = 0, ecn = OUTER_ECN_KEEP;
	__u64 cpu;
	long ret;
	int hi, busy = 0, beside = 0, aside = -1; /* -1: not looked up */

	if (!cfg || !(cfg->flags & CFG_ENABLED)) {
		count(STAGE_SPLIT, CNT_DISABLED);
		return XDP_PASS;
	}
	if (aside_pass(cfg, &aside)) {
		count(STAGE_SPLIT, CNT_ASIDE);
		return XDP_PASS;
	}
	if ((cfg->flags & CFG_HOME(STAGE_SPLIT)) && !mode(MODE_PRIO | MODE_MFLOW)) {
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
	hi = mode(MODE_PRIO) && high_prio(cfg, &t, &rule);
	if (hi) {
		count(STAGE_SPLIT, CNT_HIGH);
		/* Stepped aside, marked frames take vanilla's path as bulk
		 * does: PRISM stands aside where the receive core has no queue
		 * to take them out of, so the shortcut has nothing to save
		 * them, and stepping aside is to be vanilla. Leaving the
		 * shortcut needs no wait (place()). */
		if (mode(MODE_SYNC)) {
			if (aside < 0)
				aside = stepped_aside();
			if (!aside)
				dest = sync_dest(ctx, &ov, &src, &ecn);
		}
	}
	if (mode(MODE_PRIO_IDLE_INLINE)) {
		if (hi) {
			busy = high_inline(cfg, &rule); /* counts the rule's frame too */
			seen_high(cfg);
			if (busy || bulk_quiet(cfg) || (aside < 0 ? stepped_aside() : aside))
				opts |= PLACE_STAY;
		} else {
			seen_bulk(cfg);
			if (!prio_shapes() || prio_quiet(cfg) || (aside < 0 ? stepped_aside() : aside)) {
				opts |= PLACE_STAY;
			} else if (bulk_beside_busy(cfg)) {
				opts |= PLACE_STAY;
				beside = 1;
			}
		}
		/* The fast move needs every frame counted, inline ones too. */
		if (mode(MODE_COUNT_SPLIT) && bpf_get_smp_processor_id() == steer_mode.inline_cpu)
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
		return sync_redirect(ctx, &ov, dest, src, ecn);
	/* High-priority flows are PRISM's: never split. */
	if (mode(MODE_MFLOW) && st && !hi) {
		__u32 mf = microflow(cfg, st, 1, STAGE_SPLIT, t.seg_end);

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
	if (!mode(MODE_COUNT_SPLIT))
		queue_untrack(core_queue(core));
	else if (!mark_counted(ctx, cfg, st, core, 1) && (opts & PLACE_LOCAL))
		uncounted(st);
	return ret;
}
