/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The fast path out of the container's programs (fastout.h):
 * steer_tc_out on each container's host-side veth's tc ingress,
 * steer_tc_out_learn on the underlay's tc egress. Both hand on
 * whatever they do not take (TC_ACT_UNSPEC: the next program of the hook,
 * then the kernel).
 */
#include "fastout.h"

SEC("tc")
int steer_tc_out(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct fastout_key k = {};
	struct fastout_entry *e;
	struct tuple t = {};
	struct ethhdr *eth;
	struct iphdr *ip;
	void *data_end;
	__u32 why, hash, mtu = 0, veth = skb->ifindex;
	__u64 now;

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !mode(MODE_FAST) || !fastout_dev_is(veth, FASTOUT_VETH))
		return TC_ACT_UNSPEC;
	if (skb_inner_tuple(skb, &t) < 0) {
		count(STAGE_SPLIT, CNT_PASSED);
		return TC_ACT_UNSPEC;
	}
	fastout_key_of(&k, veth, &t);
	now = bpf_ktime_get_ns();
	e = bpf_map_lookup_elem(&steer_fastout, &k);
	if (!e) {
		fastout_note(skb, &t, veth, now);
		count(STAGE_SPLIT, CNT_FASTOUT_NO_ENTRY);
		return TC_ACT_UNSPEC;
	}
	why = fast_void_in(&steer_fastout, &k, e->changes, e->last, now, CNT_FASTOUT_STALE);
	if (why) {
		if (why != CNT_FASTOUT_LEASE)
			fastout_note(skb, &t, veth, now);
		count(STAGE_SPLIT, why);
		return TC_ACT_UNSPEC;
	}
	eth = (void *)(long)skb->data;
	ip = (void *)(eth + 1);
	data_end = (void *)(long)skb->data_end;
	if ((void *)(ip + 1) > data_end) {
		count(STAGE_SPLIT, CNT_PASSED);
		return TC_ACT_UNSPEC;
	}
	if (tcp_flags(ip, data_end) & TCP_FIN_RST) {
		bpf_map_delete_elem(&steer_fastout, &k);
		count(STAGE_SPLIT, CNT_FASTOUT_ENDED);
		return TC_ACT_UNSPEC;
	}
	if (!fastout_same(e, eth, ip)) {
		count(STAGE_SPLIT, CNT_FASTOUT_OTHER);
		return TC_ACT_UNSPEC;
	}
	if (!fastout_checks(skb, e, ip, data_end)) {
		count(STAGE_SPLIT, CNT_FASTOUT_REFUSED);
		return TC_ACT_UNSPEC;
	}
	hash = bpf_get_hash_recalc(skb);
	if (!hash || (!skb->gso_size && bpf_check_mtu(skb, e->underlay, &mtu, OUTER_LEN, 0))) {
		count(STAGE_SPLIT, CNT_FASTOUT_REFUSED);
		return TC_ACT_UNSPEC;
	}
	return fastout_send(skb, e, hash, now);
}

/*
 * Where a packet leaves the host: on the underlay's egress, an overlay
 * frame of a VXLAN device lanes agent vouches for, that is the packet a
 * note describes (same flow, inner IP id and total length, within
 * FAST_NOTE_NS, under the same change count, an inner TTL the path took 0
 * or 1 off), with the UDP source port fastout_port gives the note's hash,
 * a unicast inner destination MAC, no outer or inner IP options and a
 * VXLAN header of the VNI alone (no per-packet bits: remote checksum
 * offload's), makes the flow's entry. A TCP FIN or RST makes none; a
 * second copy of the same packet leaving (flooded) voids the entry it
 * made.
 */
SEC("tc")
int steer_tc_out_learn(struct __sk_buff *skb)
{
	struct steer_cfg *cfg = get_cfg();
	struct fastout_key k = {};
	struct fastout_note *n;
	struct fastout_vxlan *vx;
	struct overlay ov = {};
	struct tuple t = {};
	struct outer_hdrs o;
	struct cursor c;
	void *data, *data_end;
	__u64 now, changes;

	if (!cfg || !(cfg->flags & CFG_ENABLED) || !mode(MODE_FAST) ||
	    !fastout_dev_is(skb->ifindex, FASTOUT_UNDERLAY))
		return TC_ACT_UNSPEC;
	now = bpf_ktime_get_ns();
	changes = path_changes();
	if (!fast_leased(now, changes) || pull(skb, MAX_OUTER_HDRS) < 0)
		return TC_ACT_UNSPEC;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	c.pos = data;
	c.end = data_end;
	c.left = skb->len;
	if (parse_outer(&c, cfg, &t, &ov) < 0 || ov.inner_off != OUTER_LEN || !outer_at(data, data_end, &o))
		return TC_ACT_UNSPEC;
	fastout_key_of(&k, 0, &t);
	n = bpf_map_lookup_elem(&steer_fastout_notes, &k);
	vx = bpf_map_lookup_elem(&steer_fastout_vxlan, &ov.vni);
	if (!n || !vx)
		return TC_ACT_UNSPEC;
	switch (fastout_seen(&k, n, o.ip, o.iip)) {
	case FASTOUT_FLOODED:
		count(STAGE_SPLIT, CNT_FASTOUT_UNLEARNED);
		return TC_ACT_UNSPEC;
	case FASTOUT_AGAIN:
		return TC_ACT_UNSPEC;
	}
	if (n->id != o.iip->id || n->tot_len != o.iip->tot_len || now > n->at + FAST_NOTE_NS ||
	    n->changes != changes || n->ttl < o.iip->ttl || n->ttl - o.iip->ttl > 1 || o.ip->ihl != 5 ||
	    o.iip->ihl != 5 || (o.ieth->h_dest[0] & 1) || (o.eth->h_dest[0] & 1) ||
	    o.vx->vx_flags != bpf_htonl(VXLAN_FLAG_VNI) || (o.vx->vx_vni & bpf_htonl(0xff)) ||
	    o.uh->source != fastout_port(n->hash, vx->port_min, vx->port_range) ||
	    (tcp_flags(o.iip, data_end) & TCP_FIN_RST)) {
		count(STAGE_SPLIT, CNT_FASTOUT_UNLEARNED);
		return TC_ACT_UNSPEC;
	}
	fastout_admit(&k, n, vx, skb->ifindex, data, &o, now);
	return TC_ACT_UNSPEC;
}
