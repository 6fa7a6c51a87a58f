/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/* PRISM's per-class queues at the container veth. */
#include "order.h"
#include "prio.h"

/*
 * PRISM's second stage per class (MODE_VETH_CLASS), on tc egress of a
 * container's host-side veth: high-priority frames take receive queue 1 of
 * the container-side veth, every other frame queue 0, each polled by its
 * own threaded NAPI (the high one real-time), so a high-priority frame
 * never waits behind bulk frames in the container's queue.
 *
 * A veth hands a frame to the peer's receive queue of the number of the
 * transmit queue the kernel picks for it (veth_xmit). The kernel picks
 * that after tc egress, and a program cannot pin it (only an skbedit
 * action sets netdev_xmit_skip_txqueue); but for a forwarded skb (no
 * socket) on a device without XPS maps or traffic classes it takes the
 * receive queue the skb recorded (skb_tx_hash: queue_mapping - 1, modulo
 * the transmit queues). So the program records "received on queue q"
 * (queue_mapping = q + 1); the planner checks that the host-side veth has
 * two transmit queues, no XPS and no qdisc. An skb with a full socket
 * (sent by the host's own sockets; a local container's frames arrive
 * without theirs) keeps the queue its socket cached, so it is left alone
 * and not counted. A frame lanes does
 * not understand takes queue 0, its bytes untouched.
 *
 * The frames a flow hands to its queue are counted in flight until
 * steer_tc_veth_seen sees them on the container side, and only frames
 * this program counted are counted out there, and only against the count
 * they went into: it gives them the hash veth_mark() (their flow's own, so
 * RPS or GRO on the container side group them as before, with the count's
 * epoch in three of its bits). A flow whose class changes moves to the other queue
 * only once none of its frames is left in the old one, or once it was
 * idle for drain_ns (the veth drops what its 256-frame ring cannot take,
 * unreported per flow); then counting starts afresh. A flow without state
 * takes its class's queue at once: a new flow has no frame anywhere, and
 * one evicted from the LRU map while busy (131072 entries) left its frames
 * in that queue unless its class changed in the same moment.
 */

SEC("tc")
int steer_tc_veth_class(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct veth_class_state *st, init = {};
	struct bpf_sock *sk;
	struct steer_flow_key key;
	struct tuple t = {};
	__u32 n = skb_frames(skb), want, fh, epoch;
	__u64 now;

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !mode(MODE_VETH_CLASS))
		return TC_ACT_UNSPEC;
	/* BPF_PROG_RUN's skbs carry a dummy socket made without a struct
	 * socket (type 0), which no real sender has. */
	sk = skb->sk;
	if (sk)
		sk = bpf_sk_fullsock(sk);
	if (sk && sk->type != 0) {
		count(STAGE_CONTAINER, CNT_PASSED);
		return TC_ACT_UNSPEC;
	}
	if (skb_inner_tuple(skb, &t) < 0)
		goto bulk;
	want = mode(MODE_PRIO) && high_prio(cfg, &t, NULL);
	key = flow_key(&t, STAGE_CONTAINER);
	fh = flow_hash(&t);
	now = bpf_ktime_get_ns();
	st = bpf_map_lookup_elem(&steer_veth_class, &key);
	if (!st) {
		init.last_ns = now;
		init.queue = want;
		/* Unknown to frames of an evicted state, 7 times in 8. */
		init.epoch = bpf_get_prandom_u32() % VETH_EPOCHS;
		bpf_map_update_elem(&steer_veth_class, &key, &init, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&steer_veth_class, &key);
		if (!st)
			goto bulk;
	}
	if (st->queue != want) {
		if (st->inflight <= 0) {
			st->queue = want;
			count(STAGE_CONTAINER, CNT_SETTLED);
		} else if (cfg->drain_ns == 0 || now - st->last_ns >= cfg->drain_ns) {
			/* Presumed dropped: count afresh, in a new epoch. */
			st->queue = want;
			st->inflight = 0;
			st->epoch = (st->epoch + 1) % VETH_EPOCHS;
			count(STAGE_CONTAINER, CNT_UNDRAINED);
		} else {
			count(STAGE_CONTAINER, CNT_HELD);
		}
	}
	st->last_ns = now;
	/* The epoch before the count: a drain-time move on another core in
	 * between must not leave this frame marked for a count it is not in. */
	epoch = st->epoch;
	__sync_fetch_and_add(&st->inflight, n);
	bpf_set_hash(skb, veth_mark(fh, epoch));
	skb->queue_mapping = st->queue + 1;
	count(STAGE_CONTAINER, st->queue ? CNT_HIGH : CNT_STAYED);
	return TC_ACT_UNSPEC;
bulk:
	skb->queue_mapping = 1;
	count(STAGE_CONTAINER, CNT_PASSED);
	return TC_ACT_UNSPEC;
}

/*
 * tc ingress on the container-side veth, the end of steer_tc_veth_class's
 * queues: counts a flow's frames seen, only those it counted in (their
 * hash is veth_mark of the flow's and its count's epoch; no hash at all, as under BPF_PROG_RUN,
 * counts too, as in hash_counted), and never below zero.
 */
SEC("tc")
int steer_tc_veth_seen(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct veth_class_state *st;
	struct steer_flow_key key;
	struct tuple t = {};
	__s64 n = skb_frames(skb);

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !mode(MODE_VETH_CLASS))
		return TC_ACT_UNSPEC;
	if (skb_inner_tuple(skb, &t) < 0)
		return TC_ACT_UNSPEC;
	key = flow_key(&t, STAGE_CONTAINER);
	st = bpf_map_lookup_elem(&steer_veth_class, &key);
	if (!st)
		return TC_ACT_UNSPEC;
	if (skb->hash != 0 && skb->hash != veth_mark(flow_hash(&t), st->epoch))
		return TC_ACT_UNSPEC;
	count_out(&st->inflight, n);
	/* Out of the count: a drop further on is not its. */
	unmark(skb);
	return TC_ACT_UNSPEC;
}
