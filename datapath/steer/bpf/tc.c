/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The later stages' tc programs: steer_tc_ingress (bridge stage, on the
 * underlay), steer_tc_egress (container stage, on a host-side veth), and
 * the ends of their queues, steer_tc_seen (container-side veth) and
 * steer_tc_split_seen (the split stage's, on the underlay where
 * steer_tc_ingress is not attached).
 */
#include "mflow.h"

/* *qid: the core whose queue accounting counted the frames (meta's
 * LANES_META_QID), for the caller's queue_seen once this returns. */
static __always_inline int steer_tc(struct __sk_buff *skb, __u32 stage, int outer, __u32 *qid)
{
	struct steer_cfg *cfg = get_cfg();
	struct steer_flow_state *st = NULL;
	struct tuple t = {};
	struct cursor c;
	__u32 fh, flags = 0, seq = 0, v, in_hash = skb->hash, in_ifindex = skb->ingress_ifindex;
	int counted, ret, bridge_out = 0;
	__u64 idx; /* 64-bit so the bounds check and the array index are one register */

	/* Read before pulling, which may move the data. */
	if (outer) {
		flags = meta_ours(cfg, meta_flags(skb, &seq));
		*qid = meta_qid(flags);
	}
	if (!cfg || !(cfg->flags & CFG_ENABLED)) {
		count(stage, CNT_DISABLED);
		return TC_ACT_UNSPEC;
	}

	if (pull(skb, outer ? MAX_OUTER_HDRS : MAX_INNER_HDRS) < 0) {
		count(stage, CNT_PASSED);
		return TC_ACT_UNSPEC;
	}

	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	c.left = skb->len;
	ret = outer ? parse_outer(&c, cfg, &t, NULL) : parse_inner(&c, &t);
	if (ret < 0) {
		count(stage, CNT_PASSED);
		/* A frame of the overlay whose inner frame lanes does not parse
		 * (inner IPv6, ARP, an IPv4 fragment, ICMP) goes on through the
		 * next device's RPS map, which is lanes' (the VXLAN device's,
		 * the container veth's): left alone, RPS would spread it by its
		 * own hash, a placement nobody planned that changes whenever
		 * lanes rewrites the maps (parking), reordering such a flow
		 * then. The zero L4 hash keeps it on the core it is on, where
		 * vanilla runs it, whatever the maps say. Frames that are not
		 * the overlay's (other ports and VNIs, the host's own traffic)
		 * meet no map of lanes' and stay untouched, hash included. */
		if (!outer || ret == PARSE_INNER_UNKNOWN)
			return run_on(skb);
		return TC_ACT_UNSPEC;
	}

	/* The previous stage's queue handed these frames on (a stage at home
	 * counted none). The bridge stage's frames are counted out only once
	 * this stage has counted them in (out:), so that a bridge-stage move,
	 * which waits for that count, never finds the frame in neither count:
	 * the container stage then holds its core for it (stay_core). */
	if (flags & LANES_META_QUEUED)
		seen_split(&t, flags, skb_frames(skb));
	else if (!outer && !(cfg->flags & CFG_HOME(STAGE_BRIDGE)) && hash_counted(skb))
		bridge_out = 1;

	fh = flow_hash(&t);
	if (flags & LANES_META_MFLOW) {
		/* A micro-flow split at the NIC poll keeps its core for the
		 * rest of the path (MFLOW's full-path parallelism), outside
		 * the table and the in-flight counts, like at the split. */
		arrived(&t, seq, skb_frames(skb));
		/* The sequence number leaves the metadata for skb->priority,
		 * which reaches the container's veth (mflow_tag.h). */
		mflow_tag_skb(skb, fh, cfg->meta_gen, seq);
		count(stage, CNT_STAYED);
		return rps_to(skb, cfg, this_cpu_index(cfg), fh, stage, 0, 0);
	}
	if ((cfg->flags & CFG_HOME(stage)) && !(outer && mode(MODE_MFLOW_BRIDGE))) {
		count(stage, CNT_HOME);
		/* At home the bridge stage runs on as in vanilla. The agent
		 * comes home only when every active flow runs on already
		 * (Activity.Away), and a flow whose state says it queues
		 * (one that started between that read and the switch) keeps
		 * queuing, uncounted, until the stage leaves home: no frame
		 * runs on past one of its flow still queued. */
		if (outer && direct_ok(cfg)) {
			struct steer_flow_key key;

			/* On the bare path no flow would queue (lanes agent's
			 * word, CFG_HOME_BARE): no lookup. Not for frames a
			 * queue of the split stage marked. */
			if ((cfg->flags & CFG_HOME_BARE) && !flags && !mode(MODE_PRIO)) {
				count(stage, CNT_DIRECT);
				return run_on(skb);
			}
			key = flow_key(&t, STAGE_BRIDGE);
			st = bpf_map_lookup_elem(&steer_flows, &key);
			if (!st || (st->cpu_idx == STAY && (st->stay & STAY_MODE) == STAY_DIRECT && st->stay_cpu == bpf_get_smp_processor_id()) ||
			    home_idle(cfg, st)) {
				count(stage, CNT_DIRECT);
				return run_on(skb);
			}
		}
		ret = rps_to(skb, cfg, this_cpu_index(cfg), fh, stage, 0, 0);
		goto out;
	}
	idx = place(cfg, &t, fh, stage, skb->ifindex, skb->len, 0, 0, 0, &st);
	if (outer && mode(MODE_MFLOW_BRIDGE) && st && split_bridge(skb, cfg, st, fh))
		return TC_ACT_UNSPEC;
	/* RPS on the next device queues every skb, even to the core it runs
	 * on and whether or not we set the hash: count it before any return.
	 * A frame that cannot carry the mark (no hash for that core) goes on
	 * uncounted, which leaves the flow on the drain time. */
	counted = st && !(outer && mode(MODE_NO_BRIDGE_COUNT));
	if (idx == STAY) {
		/* Vanilla placement for a tc stage is the core we run on. */
		count(stage, CNT_STAYED);
		/* At the bridge stage, without the RPS pass once the flow's
		 * queued frames are out. A frame queued otherwise (no flow
		 * state aside) starts the flow over. */
		if (outer && counted && direct_ok(cfg)) {
			if (stay_direct(st)) {
				count(stage, CNT_DIRECT);
				queued(st, skb_frames(skb));
				return run_on(skb);
			}
		} else if (outer && st) {
			st->stay = STAY_FRESH | (st->stay & STAY_RAN_ON);
		}
		idx = this_cpu_index(cfg);
	} else {
		count(stage, CNT_STEERED);
	}
	v = rps_hash(cfg, idx, fh, stage, st ? st->epoch : 0, counted);
	if (counted && !v) {
		uncounted(st);
		counted = 0;
	}
	if (counted)
		queued(st, skb_frames(skb));
	ret = set_rps_hash(skb, v);
out:
	if (bridge_out)
		seen_hashed(cfg, &t, STAGE_BRIDGE, skb_frames(skb), in_hash, in_ifindex);
	return ret;
}

SEC("tc")
int steer_tc_ingress(struct __sk_buff *skb)
{
	__u32 qid = 0;
	int ret = steer_tc(skb, STAGE_BRIDGE, 1, &qid);

	/* Out of its queue, whatever steer_tc made of it. */
	queue_seen(qid, skb_frames(skb));
	return ret;
}

SEC("tc")
int steer_tc_egress(struct __sk_buff *skb)
{
	__u32 qid = 0;

	return steer_tc(skb, STAGE_CONTAINER, 0, &qid);
}

/*
 * tc ingress on the container-side veth: the end of the container stage's
 * queue (the RPS backlog). It places nothing; it only counts the frames
 * the container stage queued as seen, so that stage's moves wait for them.
 */
SEC("tc")
int steer_tc_seen(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct tuple t = {};

	/* Uncounted frames return before any parsing. */
	if (!cfg || !(cfg->flags & CFG_ENABLED) || (cfg->flags & CFG_HOME(STAGE_CONTAINER)) || !hash_counted(skb))
		return TC_ACT_UNSPEC;
	if (skb_inner_tuple(skb, &t) == 0) {
		seen_hashed(cfg, &t, STAGE_CONTAINER, skb_frames(skb), skb->hash, skb->ingress_ifindex);
		/* Out of the count (or of an older one): a drop further on
		 * is not its. */
		unmark(skb);
	}
	return TC_ACT_UNSPEC;
}

/*
 * tc ingress on the underlay when nothing else runs there (PRISM, MFLOW at
 * the NIC poll): the end of the split stage's queue (the cpumap ring, or
 * the NIC poll's own frames marked under PLACE_LOCAL), on the core that
 * took the frame off it. Like steer_tc_seen it places nothing: it counts
 * queued frames seen (per flow, then for the core's queue accounting)
 * and reads micro-flows' sequence numbers back; frames steer_xdp did not
 * mark return at once, unparsed.
 */
static __always_inline void split_seen(struct __sk_buff *skb, const struct steer_cfg *cfg, __u32 flags,
				       __u32 seq)
{
	struct tuple t = {};
	struct cursor c;

	if (!cfg || !(cfg->flags & CFG_ENABLED))
		return;
	if (!(flags & (LANES_META_QUEUED | LANES_META_MFLOW)))
		return;
	if (pull(skb, MAX_OUTER_HDRS) < 0)
		return;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	c.left = skb->len;
	if (parse_outer(&c, cfg, &t, NULL) < 0)
		return;
	if (flags & LANES_META_QUEUED)
		seen_split(&t, flags, skb_frames(skb));
	if (flags & LANES_META_MFLOW) {
		arrived(&t, seq, skb_frames(skb));
		/* The sequence number leaves the metadata for skb->priority,
		 * which reaches the container's veth (mflow_tag.h). */
		mflow_tag_skb(skb, flow_hash(&t), cfg->meta_gen, seq);
	}
}

SEC("tc")
int steer_tc_split_seen(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	__u32 seq = 0;
	/* Read before split_seen pulls, which may move the data. */
	__u32 flags = meta_ours(cfg, meta_flags(skb, &seq));

	split_seen(skb, cfg, flags, seq);
	/* Out of its queue, after its flow's seen_split(). */
	queue_seen(meta_qid(flags), skb_frames(skb));
	return TC_ACT_UNSPEC;
}
