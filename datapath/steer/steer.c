//go:build ignore

/*
 * steer: per-stage core placement for overlay receive (Falcon on stock
 * kernels). Each program finds the inner flow of a frame, hashes it with the
 * hook device and stage into one of BUCKETS buckets, and sends the next
 * stage of the receive path to the core the control plane wrote into that
 * bucket:
 *
 *   steer_xdp         STAGE_SPLIT     underlay NIC, XDP: cpumap redirect, so
 *                                     skb allocation, GRO, outer IP/UDP and
 *                                     VXLAN decap run on the chosen core.
 *   steer_tc_ingress  STAGE_BRIDGE    underlay NIC, tc ingress (before
 *                                     decap): an L4 skb hash that RPS on the
 *                                     VXLAN device turns into the chosen
 *                                     core for bridge + veth transmit.
 *   steer_tc_egress   STAGE_CONTAINER host-side veth, tc egress: an L4 skb
 *                                     hash that RPS on the container-side
 *                                     veth turns into the chosen core for
 *                                     inner IP + TCP/UDP.
 *   steer_tc_seen     (end of CONTAINER) container-side veth, tc ingress:
 *                                     places nothing, counts frames seen.
 *   steer_tc_split_seen (end of SPLIT) underlay tc ingress where
 *                                     steer_tc_ingress is not attached.
 *
 * Each stage counts the frames it queues per flow and the next program
 * counts them seen (steer_xdp's frames are marked in XDP metadata, which
 * reaches the skb), so a flow moves only when its old queue is empty.
 *
 * MFLOW (MODE_MFLOW, MODE_MFLOW_BRIDGE): a flow above a rate threshold (an
 * elephant) is cut into micro-flows of mf_batch consecutive frames, and
 * each micro-flow goes to the next split core, round robin, so the stages
 * after the split run for several micro-flows of one flow in parallel.
 * MODE_MFLOW splits in steer_xdp, before any skb exists (MFLOW's IRQ
 * splitting: cpumap), and marks each frame with its micro-flow's sequence
 * number in XDP metadata; MODE_MFLOW_BRIDGE splits in steer_tc_ingress, by
 * the RPS hash of the VXLAN device (the stages after VXLAN's GRO cell).
 * Micro-flows overtake each other by design: a stock kernel has no
 * reassembly before TCP/UDP, so they bypass the in-flight accounting (never
 * counted, never held by the flowlet rule), and the tc side counts the
 * frames that arrive after a later micro-flow's. Mice (below the
 * threshold) take whatever path the table gives them, with their in-flight
 * counts intact. What may reorder besides micro-flows overtaking each
 * other: when a flow turns into an elephant, its first micro-flow may
 * overtake the frames its mouse path still holds (the NIC poll's GRO, or
 * Falcon's split queue when composed); when it falls back to a mouse, its
 * next frames may overtake the last micro-flow's. Neither waits for a
 * drain: an elephant is already reordering.
 *
 * PRISM-sync (MODE_SYNC, with MODE_PRIO): a high-priority frame whose
 * container the control plane vouches for (steer_sync) is decapsulated
 * here and redirected to that container's host-side veth: it reaches the
 * socket in one pass of the receive core, and only where the kernel's own
 * path would have delivered the same inner frame there. See sync_dest()
 * and sync_accept(); steer_notify voids the destinations the moment
 * a change on their path is announced.
 *
 * The fast path (MODE_FAST, fast.h): a flow the kernel's path delivered to
 * a container, learned where its packet left the overlay
 * (steer_tc_fast_learn on the host-side veth), goes from the underlay's tc
 * ingress (steer_tc_fast) straight into the container's namespace with
 * bpf_redirect_peer, where every check the kernel's path makes holds. Its
 * way out (fastout.h): a flow the kernel's path sent out, learned where
 * its packet left the underlay (steer_tc_out_learn), is encapsulated at
 * the host-side veth's tc ingress (steer_tc_out) with the outer headers
 * the kernel wrote for it and sent out the underlay with bpf_redirect.
 *
 * Nothing here rewrites a packet byte, drops or consumes a frame, with two
 * exceptions: PRISM-sync and the fast path strip the outer headers of the
 * frames they hand to a container, copy the outer ECN mark inward, and
 * write the inner Ethernet header and TTL the kernel's path would have
 * left; the fast path out writes the outer headers (and the inner
 * Ethernet header and TTL) the kernel's path would have. Whatever is not
 * understood goes on untouched (XDP_PASS, TC_ACT_UNSPEC), so the worst a
 * bug can do is place a stage on the wrong core. flowhash.go mirrors
 * the hashing so the control plane can predict every decision.
 */

/*
 * One object, assembled from the program files under bpf/: the maps are
 * shared by every program, and the control plane loads, pins and reopens
 * them as one collection. Each concern lives in its own header there
 * (parse.h, maps.h, flow.h, order.h, place.h, prio.h, mflow.h, outer.h,
 * sync.h, fast.h, fastout.h, counters.h), each program in its program
 * file.
 */

#include "bpf/xdp.c"
#include "bpf/tc.c"
#include "bpf/veth.c"
#include "bpf/trace.c"
#include "bpf/notify.c"
#include "bpf/fast.c"
#include "bpf/fastout.c"

char __license[] SEC("license") = "Dual MIT/GPL";
