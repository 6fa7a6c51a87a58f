/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The fast path's programs (fast.h): steer_tc_fast on the underlay's tc
 * ingress or, where the underlay lives in another namespace,
 * steer_tc_fast_vx on the VXLAN device's; steer_tc_fast_learn on each
 * container's host-side veth's tc egress; steer_tc_fast_seen on each
 * container interface's tc ingress. Each hands on whatever it does not
 * take (TC_ACT_UNSPEC: the next program of the hook, then the kernel).
 */
#include "fast.h"

/* The outer UDP checksum of an skb whose datagram is linear and whole
 * (outer_udp_csum_ok). A global function: the verifier checks its
 * branches once. */
__noinline int fast_udp_csum_ok(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	return data_end - data == skb->len && outer_udp_csum_ok(data, data_end);
}

/*
 * udp_rcv's checksum verdict on the outer datagram: none (0), or one the
 * skb says was verified (CHECKSUM_UNNECESSARY: the NIC or GRO checked the
 * outermost checksum), or computed here over the datagram, pulled whole.
 * A CHECKSUM_PARTIAL skb (sent by this host, never through a wire) is
 * computed too, and its unfinished checksum refuses it: the kernel's path
 * takes it.
 */
static __always_inline int fast_udp_ok(struct __sk_buff *skb, const struct outer_hdrs *o)
{
	if (!o->uh->check || bpf_csum_level(skb, BPF_CSUM_LEVEL_QUERY) >= 0)
		return 1;
	if (skb->len > OUTER_CSUM_CHUNK * OUTER_CSUM_CHUNKS || bpf_skb_pull_data(skb, skb->len) < 0)
		return 0;
	return fast_udp_csum_ok(skb);
}

/*
 * Why a frame of a flow (key k, entry e, in flight fl) takes the kernel's
 * path: the counter that says so, or 0 when it may take the fast path
 * (*ecn then says what decapsulation does to its ECN field). A frame of a
 * flow without a valid entry is noted for learning; an entry that can
 * never hold again is deleted.
 */
static __always_inline __u32 fast_why_not(struct __sk_buff *skb, const struct steer_cfg *cfg, const struct fast_key *k,
					  struct fast_entry *e, const struct outer_hdrs *o, struct fast_flight *fl,
					  __u64 now, __u32 *ecn)
{
	__u32 why = e ? fast_void(k, e, now) : CNT_FAST_NO_ENTRY;

	if (why) {
		if (why != CNT_FAST_LEASE && fast_leased(now, path_changes()))
			fast_note(skb, k, o, now);
		return why;
	}
	if (!fast_dev_holds(e)) {
		bpf_map_delete_elem(&steer_fast, k);
		return CNT_FAST_STALE;
	}
	if (tcp_flags(o->iip, (void *)(long)skb->data_end) & TCP_FIN_RST) {
		bpf_map_delete_elem(&steer_fast, k);
		return CNT_FAST_ENDED;
	}
	if (skb->gso_segs > 1 || skb->gso_size)
		return CNT_FAST_GSO;
	if (!fast_same_outer(skb, e, o))
		return CNT_FAST_OTHER;
	if (!fast_checks(e, o, skb->len, ecn) || !fast_udp_ok(skb, o))
		return CNT_FAST_REFUSED;
	if (!fast_in_order(cfg, fl, now) || !fast_frags_in_order(cfg, k, now))
		return CNT_FAST_BEHIND;
	return 0;
}

SEC("tc")
int steer_tc_fast(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct fast_key k = {}, fk = {};
	struct overlay ov = {};
	struct fast_flight *fl;
	struct tuple t = {};
	struct outer_hdrs o;
	struct fast_entry *e;
	struct cursor c;
	__u32 why, ecn = OUTER_ECN_KEEP, seq = 0, flags, n = skb_frames(skb);
	__u64 now;
	int ret;

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !mode(MODE_FAST))
		return TC_ACT_UNSPEC;
	/* Read before pulling, which may move the data; only beside a mode
	 * whose first stage queues. No micro-flow's (Config refuses the fast
	 * path with MFLOW's split). */
	flags = mode(MODE_FAST_BESIDE) ? meta_ours(cfg, meta_flags(skb, &seq)) : 0;
	if (pull(skb, MAX_OUTER_HDRS) < 0)
		goto passed;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	c.left = skb->len;
	/* A VLAN tag the kernel took off before tc: the kernel's path hands
	 * the frame to a VLAN device, or drops it. */
	if (skb->vlan_present)
		goto passed;
	ret = parse_outer(&c, cfg, &t, &ov);
	if (ret == PARSE_INNER_UNKNOWN)
		fast_frag_in(skb, ov.inner_off);
	if (ret < 0 || ov.inner_off != OUTER_LEN || !outer_at((void *)(long)skb->data, (void *)(long)skb->data_end, &o))
		goto passed;
	fast_key_of(&k, ov.vni, &t);
	fast_key_of(&fk, 0, &t);
	now = bpf_ktime_get_ns();
	fl = bpf_map_lookup_elem(&steer_fast_flight, &fk);
	e = bpf_map_lookup_elem(&steer_fast, &k);
	why = fast_why_not(skb, cfg, &k, e, &o, fl, now, &ecn);
	fast_handed(&fk, fl, now);
	if (why) {
		count(STAGE_SPLIT, why);
		return TC_ACT_UNSPEC;
	}
	ret = fast_deliver(skb, e, ecn, &t, now);
	if (ret != TC_ACT_UNSPEC)
		fast_dequeued(&t, flags, n);
	return ret;
passed:
	count(STAGE_SPLIT, CNT_PASSED);
	return TC_ACT_UNSPEC;
}

/*
 * Where a frame leaves the overlay into a container: on the host-side
 * veth's egress, a frame the VXLAN device received (its ingress_ifindex)
 * for the container behind a veth lanes agent vouches for, that is the
 * packet a note describes (same flow, IP id and total length, within
 * FAST_NOTE_NS, under the same change count, and a TTL the path took 0 or
 * 1 off), makes the flow's entry. Broadcast and flooded frames (another
 * MAC than the container's) and TCP FIN or RST make none.
 */
SEC("tc")
int steer_tc_fast_learn(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	__u32 in = skb->ingress_ifindex, out = skb->ifindex;
	struct fast_key k = {};
	struct tuple t = {};
	struct fast_note *n;
	struct fast_dev *dev;
	struct ethhdr *eth;
	struct iphdr *ip;
	void *data_end;
	__u64 now, changes;
	__u32 *vni;

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !mode(MODE_FAST))
		return TC_ACT_UNSPEC;
	vni = bpf_map_lookup_elem(&steer_fast_vxlan, &in);
	dev = bpf_map_lookup_elem(&steer_fast_dev, &out);
	if (!vni || !dev)
		return TC_ACT_UNSPEC;
	now = bpf_ktime_get_ns();
	changes = path_changes();
	if (!fast_leased(now, changes) || skb_inner_tuple(skb, &t) < 0)
		return TC_ACT_UNSPEC;
	eth = (void *)(long)skb->data;
	ip = (void *)(eth + 1);
	data_end = (void *)(long)skb->data_end;
	if ((void *)(ip + 1) > data_end)
		return TC_ACT_UNSPEC;
	fast_key_of(&k, *vni, &t);
	n = bpf_map_lookup_elem(&steer_fast_notes, &k);
	if (!n || n->id != ip->id || n->tot_len != ip->tot_len || now > n->at + FAST_NOTE_NS || now < n->unsure_until ||
	    n->ttl < ip->ttl ||
	    n->ttl - ip->ttl > 1 || n->changes != changes || ip->ihl != 5 || !mac_eq(eth->h_dest, dev->mac) ||
	    (tcp_flags(ip, data_end) & TCP_FIN_RST)) {
		count(STAGE_SPLIT, CNT_FAST_UNLEARNED);
		return TC_ACT_UNSPEC;
	}
	fast_admit(&k, n, dev, out, eth, ip->ttl, now);
	return TC_ACT_UNSPEC;
}

/*
 * Where a frame of the overlay reaches its container: on the container
 * interface's tc ingress, which both paths pass (bpf_redirect_peer runs
 * it at once), a frame of a flow the fast path counted is no longer in
 * flight (steer_fast_flight).
 */
SEC("tc")
int steer_tc_fast_seen(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct fast_flight *fl;
	struct fast_key fk = {};
	struct tuple t = {};

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !mode(MODE_FAST))
		return TC_ACT_UNSPEC;
	if (skb_inner_tuple(skb, &t) < 0) {
		fast_frag_seen(skb, 0);
		return TC_ACT_UNSPEC;
	}
	fast_key_of(&fk, 0, &t);
	fl = bpf_map_lookup_elem(&steer_fast_flight, &fk);
	if (fl && fl->n)
		__sync_fetch_and_add(&fl->n, -1); /* XADD: -mcpu=v1 has no atomic sub */
	return TC_ACT_UNSPEC;
}

/*
 * Why a frame at the VXLAN device's ingress (fast_vx; the flow k, entry
 * e, in flight fl, received on ifindex) takes the kernel's path: the
 * counter that says so, or 0 when it may take the fast path. As
 * fast_why_not, on the inner frame: the entry's device and MACs, the
 * checks of the bridge and the veth, GSO frames taken.
 */
static __always_inline __u32 fast_vx_why_not(struct __sk_buff *skb, const struct steer_cfg *cfg,
					     const struct fast_key *k, struct fast_entry *e, const struct ethhdr *eth,
					     const struct iphdr *iip, struct fast_flight *fl, __u32 ifindex, __u64 now)
{
	__u32 why = e ? fast_void(k, e, now) : CNT_FAST_NO_ENTRY;

	if (why) {
		if (why != CNT_FAST_LEASE && fast_leased(now, path_changes()))
			fast_vx_note(skb, k, eth, iip, ifindex, now);
		return why;
	}
	if (!fast_dev_holds(e)) {
		bpf_map_delete_elem(&steer_fast, k);
		return CNT_FAST_STALE;
	}
	if (tcp_flags(iip, (void *)(long)skb->data_end) & TCP_FIN_RST) {
		bpf_map_delete_elem(&steer_fast, k);
		return CNT_FAST_ENDED;
	}
	if (ifindex != e->underlay || !mac_eq(eth->h_dest, e->in_dmac) || !mac_eq(eth->h_source, e->in_smac))
		return CNT_FAST_OTHER;
	if ((skb->gso_segs > 1 || skb->gso_size) && mode(MODE_FAST_NO_GSO))
		return CNT_FAST_GSO;
	if (!fast_vx_checks(e, iip, skb->len, skb->gso_segs > 1 || skb->gso_size))
		return CNT_FAST_REFUSED;
	if (!fast_in_order(cfg, fl, now) || !fast_frags_in_order(cfg, k, now))
		return CNT_FAST_BEHIND;
	return 0;
}

/*
 * The fast path from the VXLAN device (fast.h), on its tc ingress: a
 * frame of a flow with an entry that passes the checks goes to its
 * container, marked for the host as the veth's eth_type_trans would mark
 * it (the VXLAN device's marked it for another host: the container's
 * MAC is not its own).
 */
SEC("tc")
int steer_tc_fast_vx(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	__u32 in = skb->ingress_ifindex, why;
	struct fast_key k = {}, fk = {};
	struct fast_flight *fl;
	struct fast_entry *e;
	struct tuple t = {};
	struct ethhdr *eth;
	struct iphdr *iip;
	__u32 *vni;
	__u64 now;

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !mode(MODE_FAST))
		return TC_ACT_UNSPEC;
	vni = bpf_map_lookup_elem(&steer_fast_vxlan, &in);
	if (!vni || skb->vlan_present)
		goto passed;
	if (skb_inner_tuple(skb, &t) < 0) {
		fast_frag_in(skb, 0);
		goto passed;
	}
	eth = (void *)(long)skb->data;
	iip = (void *)(eth + 1);
	if ((void *)(iip + 1) > (void *)(long)skb->data_end)
		goto passed;
	fast_key_of(&k, *vni, &t);
	fast_key_of(&fk, 0, &t);
	now = bpf_ktime_get_ns();
	fl = bpf_map_lookup_elem(&steer_fast_flight, &fk);
	e = bpf_map_lookup_elem(&steer_fast, &k);
	why = fast_vx_why_not(skb, cfg, &k, e, eth, iip, fl, in, now);
	fast_handed(&fk, fl, now);
	if (why) {
		count(STAGE_SPLIT, why);
		return TC_ACT_UNSPEC;
	}
	if (bpf_skb_change_type(skb, PACKET_HOST)) {
		count(STAGE_SPLIT, CNT_FAST_REFUSED);
		return TC_ACT_UNSPEC;
	}
	return fast_hand_in(skb, e, eth, iip, &t, now);
passed:
	count(STAGE_SPLIT, CNT_PASSED);
	return TC_ACT_UNSPEC;
}
