/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The tracepoint programs: frames the kernel dropped on the way through a
 * counted queue (order.h), and PRISM-sync's redirects that did not reach
 * their container (sync.h).
 */
#include "order.h"
#include "prio.h"

/* A bulk queue's flush to the ring (bq_flush_to_queue, on the producing
 * core): frames the full ring refused.
 * TP_PROTO(int map_id, unsigned int processed, unsigned int drops, int to_cpu) */
SEC("raw_tracepoint/xdp_cpumap_enqueue")
int steer_drops_ring(struct bpf_raw_tracepoint_args *ctx)
{
	queue_dropped((__u32)ctx->args[0], (__u32)ctx->args[3], (__u32)ctx->args[2], 1);
	return 0;
}

/* One batch of the queue's kthread (bound to the queue's core): frames
 * dropped before an skb existed (kmem_alloc_drops; since 5.x the kthread
 * hands skbs on as a list and counts no later drop here).
 * TP_PROTO(int map_id, unsigned int processed, unsigned int drops, int sched,
 *          struct xdp_cpumap_stats *xdp_stats) */
SEC("raw_tracepoint/xdp_cpumap_kthread")
int steer_drops_kthread(struct bpf_raw_tracepoint_args *ctx)
{
	queue_dropped((__u32)ctx->args[0], bpf_get_smp_processor_id(), (__u32)ctx->args[2], 0);
	return 0;
}

/* TP_PROTO(struct sk_buff *skb, void *location, enum skb_drop_reason reason,
 *          struct sock *rx_sk) (6.12+; without rx_sk before) */
SEC("raw_tracepoint/kfree_skb")
int steer_drops_skb(struct bpf_raw_tracepoint_args *ctx)
{
	struct sk_buff___lanes *skb = (void *)ctx->args[0];
	struct steer_cfg *cfg;
	struct steer_flow_key key;
	struct steer_flow_state *st;
	struct veth_class_state *vst;
	struct skb_shared_info___lanes *sh;
	struct tuple t = {};
	__u32 hash, fh, epoch = 0, epoch2 = 0, stage, n = 1;
	unsigned short segs = 0;
	int bridge;

	/* Most drops are not ours: one read, then out. A zero hash marked
	 * L4 is one the bridge stage gave a frame it ran on (run_on): that
	 * frame was counted too, without an epoch. */
	hash = BPF_CORE_READ(skb, hash);
	if (!(hash & HASH_COUNTED) && (hash || !BPF_CORE_READ_BITFIELD_PROBED(skb, l4_hash)))
		return 0;
	/* A clone shares its original's hash: one of the two may have been
	 * counted out already (a promiscuous bridge passes the original up,
	 * where it is dropped as another host's, and forwards the clone), so
	 * a clone's drop is not reported; its flow waits for the drain time. */
	if (BPF_CORE_READ_BITFIELD_PROBED(skb, cloned))
		return 0;
	/* The same, for an original whose clone flag a write to it cleared
	 * (pskb_expand_head): a promiscuous bridge's original is dropped as
	 * another host's after its clone was forwarded and counted out. */
	if (bpf_core_enum_value_exists(enum skb_drop_reason, SKB_DROP_REASON_OTHERHOST) &&
	    ctx->args[2] == bpf_core_enum_value(enum skb_drop_reason, SKB_DROP_REASON_OTHERHOST))
		return 0;
	cfg = get_cfg();
	if (!cfg || !(cfg->flags & CFG_ENABLED) || drop_tuple(skb, &t) < 0)
		return 0;
	sh = (void *)(BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, end));
	if (!bpf_probe_read_kernel(&segs, sizeof(segs), &sh->gso_segs) && segs > 1)
		n = segs;
	if (!hash) {
		/* As seen_hashed counts such a frame out: only from a flow
		 * running on, and not at home, where nothing is counted. */
		if (cfg->flags & CFG_HOME(STAGE_BRIDGE))
			return 0;
		key = flow_key(&t, STAGE_BRIDGE);
		st = bpf_map_lookup_elem(&steer_flows, &key);
		if (st && (st->stay & STAY_RAN_ON)) {
			count_out(&st->inflight, n);
			count_n(STAGE_BRIDGE, CNT_DROPPED, n);
		}
		return 0;
	}
	fh = flow_hash(&t);
	if (mode(MODE_VETH_CLASS)) {
		key = flow_key(&t, STAGE_CONTAINER);
		vst = bpf_map_lookup_elem(&steer_veth_class, &key);
		if (vst && hash == veth_mark(fh, vst->epoch)) {
			count_out(&vst->inflight, n);
			count_n(STAGE_CONTAINER, CNT_DROPPED, n);
			return 0;
		}
	}
	/* The stage whose hash it is; both (one flow in about 2^32 / (16 *
	 * cores) has equal hashes at the two stages on a core): neither, as
	 * the frame cannot be told. */
	bridge = hash_of_count(cfg, hash, fh, STAGE_BRIDGE, &epoch);
	if (hash_of_count(cfg, hash, fh, STAGE_CONTAINER, &epoch2)) {
		if (bridge)
			return 0;
		stage = STAGE_CONTAINER;
		epoch = epoch2;
	} else if (bridge) {
		stage = STAGE_BRIDGE;
	} else {
		return 0;
	}
	if (cfg->flags & CFG_HOME(stage))
		return 0;
	key = flow_key(&t, stage);
	st = bpf_map_lookup_elem(&steer_flows, &key);
	if (st && epoch == st->epoch) {
		count_out(&st->inflight, n);
		count_n(stage, CNT_DROPPED, n);
	}
	return 0;
}

/*
 * PRISM-sync's redirects that did not reach their container: the devmap
 * flush hands the frames to the veth (veth_xdp_xmit), which drops what its
 * peer's ring cannot take (or everything, while the peer polls without
 * NAPI); a redirect that fails before (the device down, too long a frame)
 * is reported as a redirect error. Only frames for a device of
 * steer_sync_dev count: lanes' shortcut is the one writer of that map.
 */
struct net_device___lanes {
	int ifindex;
} __attribute__((preserve_access_index));

/* TP_PROTO(const struct net_device *from_dev, const struct net_device *to_dev,
 *          int sent, int drops, int err) */
SEC("raw_tracepoint/xdp_devmap_xmit")
int steer_sync_xmit(struct bpf_raw_tracepoint_args *ctx)
{
	struct net_device___lanes *to = (void *)ctx->args[1];
	int drops = (int)ctx->args[3];
	__u32 ifindex;

	if (drops <= 0)
		return 0;
	ifindex = BPF_CORE_READ(to, ifindex);
	if (bpf_map_lookup_elem(&steer_sync_dev, &ifindex))
		count_n(STAGE_SPLIT, CNT_SYNC_DROPPED, drops);
	return 0;
}

/* TP_PROTO(const struct net_device *dev, const struct bpf_prog *xdp,
 *          const void *tgt, int err, enum bpf_map_type map_type,
 *          u32 map_id, u32 index) */
SEC("raw_tracepoint/xdp_redirect_err")
int steer_sync_redirect_err(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 index = (__u32)ctx->args[6];

	if ((__u32)ctx->args[4] == BPF_MAP_TYPE_DEVMAP_HASH && bpf_map_lookup_elem(&steer_sync_dev, &index))
		count(STAGE_SPLIT, CNT_SYNC_DROPPED);
	return 0;
}
