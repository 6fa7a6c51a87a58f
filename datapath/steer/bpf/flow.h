/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Flow state and epochs: the flow hash every stage agrees on, the table
 * bucket and the steer_flows key of a flow's stage, the count epochs a
 * state takes when it starts counting afresh, the clocks its stamps come
 * from, and the hash a later stage's frame carries to the next device's
 * RPS: its core, its flow's bits, and the epoch of the count it went into.
 */
#pragma once

#include "maps.h"
#include "parse.h"

/* Low bit of the skb hash the tc programs set: the frame was counted into
 * its flow's in-flight count (see hash_counted). */
#define HASH_COUNTED 1u
/* Counts a flow's later-stage frames can belong to (steer_flow_state.epoch),
 * in bits 1-3 of the hash. */
#define HASH_EPOCHS 8

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

/* A flow stage's slot of steer_epochs (struct flow_slot), or NULL. */
static __always_inline struct flow_slot *flow_slot(__u32 stage, __u32 fh)
{
	__u32 key = stage * EPOCH_SLOTS + (fh % EPOCH_SLOTS);

	return bpf_map_lookup_elem(&steer_epochs, &key);
}

/* The slot's next count epoch; a random one without the slot. */
static __always_inline __u32 slot_epoch(struct flow_slot *s)
{
	if (!s)
		return bpf_get_prandom_u32() % HASH_EPOCHS;
	/* Not atomic: two cores handing out the same epoch at once do so for
	 * two flows (one flow's states are made one at a time), which is no
	 * reuse. */
	s->n += 1;
	return (__u16)(s->n - 1) % HASH_EPOCHS;
}

/* The slot's next count epoch other than cur. */
static __always_inline __u32 slot_epoch_after(struct flow_slot *s, __u32 cur)
{
	__u32 e = slot_epoch(s);

	return e != cur ? e : slot_epoch(s);
}

/* A state's next count epoch when it starts counting afresh: the slot's
 * next, never the one it counts in now. */
static __always_inline __u32 next_epoch_after(__u32 stage, __u32 fh, __u32 cur)
{
	return slot_epoch_after(flow_slot(stage, fh), cur);
}

/*
 * Clock. The precise clock (bpf_ktime_get_ns: a TSC read and its
 * conversion, paid per packet on the IRQ core; docs/decisions/README.md) is
 * only needed by the flowlet test, which runs
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

static __always_inline void stamp_at(__u64 *last)
{
	__u64 now = bpf_ktime_get_coarse_ns();

	if (*last != now)
		*last = now;
}

/* The flow bits of a later stage's hash: the stages hash apart, so a
 * frame's hash tells which stage's count it is in (steer_drops_skb). */
static __always_inline __u32 stage_fh(__u32 fh, __u32 stage)
{
	return stage == STAGE_CONTAINER ? fmix32(fh ^ 0x9e3779b9u) : fh;
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
