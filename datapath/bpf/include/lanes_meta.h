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

struct lanes_meta {
	__u32 magic; /* LANES_META_MAGIC: anything else is not ours */
	__u32 flags;
};
