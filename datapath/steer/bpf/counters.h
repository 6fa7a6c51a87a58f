/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * What steer counts, per stage (steer_stats, a per-CPU array indexed by
 * stage * NUM_COUNTERS + counter; count() in maps.h adds to it). The Go
 * side reads them as steer.Counters, in this order.
 */
#pragma once

enum counter {
	CNT_STEERED,  /* next stage sent to a chosen core */
	CNT_STAYED,   /* vanilla placement (table says STAY, or the core has no cpumap entry) */
	CNT_PASSED,   /* frame not understood: passed untouched */
	CNT_HELD,     /* a move deferred to keep the flow in order (not idle for a flowlet gap, frames in flight; a container stage holding its core) */
	CNT_MOVED,    /* a flow moved at a flowlet boundary */
	CNT_DISABLED, /* cfg not enabled */
	CNT_UNDRAINED, /* a move after drain_ns although frames were still counted in flight */
	CNT_HIGH,     /* frame of a high-priority flow (MODE_PRIO) */
	CNT_MF_FRAMES,   /* frames of elephants sent to their micro-flow's core */
	CNT_MF_STARTED,  /* micro-flows started */
	CNT_MF_ELEPHANT, /* a flow became an elephant */
	CNT_MF_ENDED,    /* an elephant fell below the threshold */
	CNT_MF_ARRIVED,  /* micro-flow frames whose metadata a tc program read back (per core: where they ran) */
	CNT_MF_LATE,     /* of those, frames of a micro-flow older than one already seen: batch-level reordering */
	CNT_SYNC,        /* high-priority frames decapsulated and handed to their container's veth */
	CNT_SYNC_MISS,   /* high-priority frames (MODE_SYNC) with no vouched-for destination, or too long: batch path */
	CNT_HOME,        /* frames that took the at-home fast path (CFG_HOME): vanilla placement, no flow state */
	CNT_SETTLED,     /* a wait ended: the flow's frames counted in flight were gone, its core's queues seen empty (queue_settled) */
	CNT_DROPPED,     /* later stages: frames counted in flight that the kernel reported dropped (steer_drops_skb) */
	CNT_DIRECT,      /* bridge stage: frames that stayed without a pass through the RPS backlog (stay_direct) */
	CNT_BULK_BESIDE, /* bulk frames bulk=auto kept in the NIC poll beside busy marked flows (bulk_beside_busy) */
	CNT_UNMARKED,    /* frames sent to a core's queue without lanes' metadata (no room left): that queue's counts no longer balance */
	CNT_SYNC_REFUSED, /* high-priority frames with a destination that the kernel's own path would not deliver (sync_accept): batch path, where the kernel decides */
	CNT_SYNC_EXPIRED, /* high-priority frames whose destination was void (its deadline passed: no agent renewed it; or a change on its path was announced since its facts were read): batch path */
	CNT_SYNC_DROPPED, /* frames the shortcut redirected that the devmap or the veth then dropped (a full ring, a device going away) */
	CNT_ASIDE,        /* frames PRISM's aside pass let through untouched: not parsed, classified or tracked (aside_pass) */
	CNT_REMADE,       /* flow states made anew where their slot's note was their flow's: they start where the old state's frames went (remake) */
	/* The fast path (MODE_FAST), counted at the split stage: */
	CNT_FAST,           /* frames decapsulated and handed to their container's namespace */
	CNT_FAST_NO_ENTRY,  /* miss: no entry for the flow (its frame noted for learning) */
	CNT_FAST_OTHER,     /* miss: another device, VTEP or MAC than the entry's outer facts */
	CNT_FAST_REFUSED,   /* miss: a check of the kernel's path fails (checksums, lengths, options, flags, ECN, TTL, MTU) */
	CNT_FAST_GSO,       /* miss: a GSO frame (not taken by this fast path) */
	CNT_FAST_STALE,     /* miss: a change on the path since admission: entry deleted */
	CNT_FAST_LEASE,     /* miss: the agent's lease is past (or was never given) */
	CNT_FAST_IDLE,      /* miss: the entry was idle past the timeout: deleted */
	CNT_FAST_ENDED,     /* TCP FIN or RST: entry deleted, the frame takes the normal path */
	CNT_FAST_DROPPED,   /* frames lost after decapsulation began (cannot happen for a frame whose headers were linear) */
	CNT_FAST_ADMITTED,  /* entries made where a noted frame left the overlay */
	CNT_FAST_UNLEARNED, /* overlay frames leaving to a served veth that admitted nothing (no matching note, another MAC, options, FIN/RST) */
	CNT_FAST_BEHIND,    /* miss: a frame of the flow was still on the kernel's path (it would have been overtaken) */
	/* The fast path out of the container (fastout.h), counted at the split stage: */
	CNT_FASTOUT,           /* frames encapsulated at the host-side veth's ingress and sent out the underlay */
	CNT_FASTOUT_NO_ENTRY,  /* miss: no entry for the flow (its frame noted for learning) */
	CNT_FASTOUT_OTHER,     /* miss: another MAC, TTL, TOS or DF than the noted packet's */
	CNT_FASTOUT_REFUSED,   /* miss: a check of the kernel's path fails (checksum, lengths, options, TTL, MTU, no hash) */
	CNT_FASTOUT_STALE,     /* miss: a change on the path since admission: entry deleted */
	CNT_FASTOUT_LEASE,     /* miss: the agent's lease is past (or was never given) */
	CNT_FASTOUT_IDLE,      /* miss: the entry was idle past the timeout: deleted */
	CNT_FASTOUT_ENDED,     /* TCP FIN or RST: entry deleted, the frame takes the normal path */
	CNT_FASTOUT_DROPPED,   /* frames lost after encapsulation began (cannot happen for a frame whose headers were linear) */
	CNT_FASTOUT_ADMITTED,  /* entries made where a noted packet left the underlay */
	CNT_FASTOUT_UNLEARNED, /* noted packets that left the underlay and admitted nothing (another packet, port, TTL, MAC, FIN/RST) */
	NUM_COUNTERS,
};
