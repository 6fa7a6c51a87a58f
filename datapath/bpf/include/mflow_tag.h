/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The micro-flow tag: what MFLOW's reassembler (datapath/reorder, a BPF
 * qdisc at the root of a container's host-side veth) needs to know of a
 * frame of a split flow, carried in skb->priority from the underlay's tc
 * ingress, where the XDP metadata that brought the micro-flow's sequence
 * number is still readable, to the veth's qdisc.
 *
 * Why skb->priority: XDP metadata (skb data_meta) does not survive VXLAN
 * decapsulation (the data pointer moves past the outer headers); skb->mark
 * is cleared by skb_scrub_packet when the VXLAN device lives in another
 * namespace than its socket (Docker's overlay namespace); skb->hash is the
 * RPS hash lanes' split and stage placement write. Nothing on the way from
 * the underlay to a bridge port's qdisc writes skb->priority: VXLAN decap
 * (__iptunnel_pull_header, skb_scrub_packet), the GRO cell and the bridge
 * keep it. IPv4 forwarding does overwrite it (ip_forward sets it from the
 * TOS while net.ipv4.ip_forward_update_priority is 1, the default), so a
 * routed overlay needs that sysctl at 0 for the tag to arrive.
 *
 *   bits 29-31  MFLOW_TAG_MAGIC (0b101): a priority lanes wrote. Ordinary
 *               priorities (TC_PRIO_*, 0-15, or a class id major:minor
 *               with a major below 0xa000) never carry it.
 *   bits 27-28  generation: the low bits of the splitting datapath's
 *               metadata generation, so the flow of a reloaded datapath,
 *               whose sequences restart at 0, is a new one.
 *   bits 16-26  flow: 11 bits of the inner flow's hash (steer's
 *               flow_hash). Two split flows to one container share them
 *               with probability 1/2048, and then one sequence space,
 *               which the reassembler sees as late or skipped frames.
 *   bits 0-15   the micro-flow's sequence number within its flow, in
 *               serial-number order (it wraps).
 *
 * The tag is constant within a micro-flow, like the metadata it is copied
 * from, so GRO merging within a micro-flow keeps it right.
 */
#pragma once

#include <linux/types.h>

#define MFLOW_TAG_MAGIC 0xa0000000u
#define MFLOW_TAG_MAGIC_MASK 0xe0000000u
#define MFLOW_TAG_GEN_SHIFT 27
#define MFLOW_TAG_GEN_MASK 0x3u
#define MFLOW_TAG_FLOW_SHIFT 16
#define MFLOW_TAG_FLOW_MASK 0x7ffu
#define MFLOW_TAG_SEQ_MASK 0xffffu
/* The flow and generation bits: what tells two tagged flows apart. */
#define MFLOW_TAG_ID_MASK 0x1fff0000u

/* The tag of micro-flow seq of the flow whose hash is fh, split by a
 * datapath of metadata generation gen. */
static __always_inline __u32 mflow_tag(__u32 fh, __u32 gen, __u32 seq)
{
	return MFLOW_TAG_MAGIC | ((gen & MFLOW_TAG_GEN_MASK) << MFLOW_TAG_GEN_SHIFT) |
	       ((fh & MFLOW_TAG_FLOW_MASK) << MFLOW_TAG_FLOW_SHIFT) | (seq & MFLOW_TAG_SEQ_MASK);
}

/* Whether a priority is a micro-flow tag. */
static __always_inline int mflow_tagged(__u32 prio)
{
	return (prio & MFLOW_TAG_MAGIC_MASK) == MFLOW_TAG_MAGIC;
}

static __always_inline __u32 mflow_tag_id(__u32 tag)
{
	return tag & MFLOW_TAG_ID_MASK;
}

static __always_inline __u16 mflow_tag_seq(__u32 tag)
{
	return tag & MFLOW_TAG_SEQ_MASK;
}

#ifdef MFLOW_TAG_SKB
/*
 * Tag an skb of micro-flow seq (tc programs: struct __sk_buff). A priority
 * someone else set is overwritten only on frames lanes split, whose
 * priority nothing before the qdisc reads.
 */
static __always_inline void mflow_tag_skb(struct __sk_buff *skb, __u32 fh, __u32 gen, __u32 seq)
{
	skb->priority = mflow_tag(fh, gen, seq);
}
#endif
