/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * XDP metadata lanes' XDP programs put in front of a frame they hand to a
 * cpumap, so the skb built from it carries the note to later tc programs
 * (skb data_meta). GRO only merges skbs whose metadata is equal, so the
 * fields must stay constant within a flow unless splitting it is intended.
 */
#pragma once

#include <linux/types.h>

#define LANES_META_MAGIC 0x4c4e5331 /* "LNS1" */

/* lanes_meta.flags */
#define LANES_META_QUEUED 0x1 /* counted in its (flow, stage)'s in-flight frames */
#define LANES_META_MFLOW 0x2  /* part of a micro-flow: the metadata is a struct lanes_meta_mflow */
/* Bits 2-4: the count epoch of the flow's split-stage state the frame was
 * counted in (steer_flow_state.epoch), so a frame of an older count (one
 * presumed drained, or that of a state the LRU evicted) is not counted out
 * of the current one. Constant while the state counts, so GRO still
 * merges the flow's frames. */
#define LANES_META_EPOCH_SHIFT 2
#define LANES_META_EPOCH_MASK 0x7
/*
 * Bits 8-15: the core whose split-stage queue accounting counted the frame
 * in (its cpumap entries of both classes, or its NIC poll), plus one (0:
 * none), so the skb side can count it out there (steer's struct
 * steer_queue). The same for every path on one core, so GRO still merges
 * a flow's frames when it changes class or returns to the NIC poll.
 */
#define LANES_META_QID_SHIFT 8
#define LANES_META_QID_MASK 0xff
/* Bits 16-31: the marking datapath's generation (steer_cfg.meta_gen), so
 * a frame marked by a datapath since replaced is not counted out of the
 * new one's queues. */
#define LANES_META_GEN_SHIFT 16
#define LANES_META_GEN_MASK 0xffff

struct lanes_meta {
	__u32 magic; /* LANES_META_MAGIC: anything else is not ours */
	__u32 flags;
};

/*
 * The metadata of a micro-flow's frame (MFLOW): struct lanes_meta, then the
 * micro-flow's sequence number within its flow, which a reassembler after
 * the parallel stages would merge by. It is one word longer than struct
 * lanes_meta rather than a field of it so that the metadata of every other
 * frame keeps its 8 bytes: readers check the header first, and the
 * sequence only when LANES_META_MFLOW says it is there. The sequence is
 * constant within a micro-flow, so GRO still merges inside a batch and
 * never across two (MFLOW's own batching); no per-packet value may ever go
 * here.
 */
struct lanes_meta_mflow {
	struct lanes_meta hdr;
	__u32 seq;
};
