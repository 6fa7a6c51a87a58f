/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The fast path into the container (MODE_FAST): once the kernel's own path
 * has delivered a flow of the overlay to a container, its later frames go
 * from the underlay's tc ingress straight into the container's namespace
 * (bpf_redirect_peer), skipping outer IP/UDP, the VXLAN device and its
 * GRO cell, the bridge or the routing, and the veth's transmit.
 *
 * Learning: a frame of a flow without an entry leaves a note at the
 * underlay's ingress (fast_note: the outer facts the kernel then accepts
 * it with, its inner IP id, total length and TTL, the change count). Where
 * the same packet leaves the overlay, at the host-side veth's egress
 * (fast_learn), it makes the flow's entry: the veth, the MACs and TTL the
 * kernel's path left it with, the outer facts of the note. Only a packet
 * the whole path delivered teaches anything, never one packet alone: no
 * note, no entry.
 *
 * Use (fast_ingress): a frame with the entry's outer facts that passes
 * every check the kernel's path makes on the way (outer.h's, the inner
 * header's checksum and length, TTL, MTU) loses its outer headers, gets
 * the inner Ethernet header and TTL the kernel's path would have given it,
 * and goes to the container. Anything else takes the kernel's path,
 * untouched, counted by reason. Entries end on TCP FIN or RST, idle time,
 * any change counted on the path (steer_changes), and lanes agent's flush;
 * nothing is admitted or used past the agent's lease (steer_fast_lease).
 *
 * GSO frames (GRO'd TCP) take the kernel's path: on kernels without
 * BPF_F_ADJ_ROOM_DECAP_L4_UDP a decapsulated GSO skb keeps its tunnel GSO
 * state.
 *
 * From the VXLAN device (fast_vx): where the underlay lives in another
 * namespace than the containers' veths (dockerd's overlay namespace),
 * bpf_redirect_peer from the underlay cannot reach them. The fast path
 * then starts at the VXLAN device's tc ingress: the kernel's path has
 * received and decapsulated the frame (outer IP and UDP with their
 * netfilter hooks, the VXLAN device and its GRO cell); what it skips is
 * the bridge, the veth's transmit and the backlog queue. Frames there
 * are inner frames, GRO'd TCP plain TCP GSO, which it takes too. Notes,
 * entries and the order keeping are the same, the note's outer facts
 * none (the kernel checked the outer frame).
 */
#pragma once

#include "order.h"
#include "outer.h"

/* skb->pkt_type of a frame addressed to this host (linux/if_packet.h). */
#define PACKET_HOST 0

/* A note older than this teaches nothing: the same packet crosses the
 * host far sooner, and an IP id repeats. */
#define FAST_NOTE_NS (1000ULL * 1000 * 1000)
/* An entry's last use is stamped at most this often, so a busy flow does
 * not write its entry on every frame from every core. */
#define FAST_STAMP_NS (1000ULL * 1000)

/* TCP flags that end a flow's entry: FIN, RST. */
#define TCP_FIN_RST 0x05

static __always_inline void fast_key_of(struct fast_key *k, __u32 vni, const struct tuple *t)
{
	k->vni = vni;
	k->saddr = t->saddr;
	k->daddr = t->daddr;
	k->sport = t->sport;
	k->dport = t->dport;
	k->proto = t->proto;
}

/* The change count now (~0 if unreadable: matches no entry's). */
static __always_inline __u64 path_changes(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&steer_changes, &zero);

	return n ? *(volatile __u64 *)n : ~0ULL;
}

/* Does lanes agent vouch for the path at now, under the change count
 * changes? */
static __always_inline int fast_leased(__u64 now, __u64 changes)
{
	__u32 zero = 0;
	struct fast_lease *l = bpf_map_lookup_elem(&steer_fast_lease, &zero);

	return l && now < l->deadline && l->changes == changes;
}

/* The TCP flags of an inner IPv4 packet without options at ip, or 0. */
static __always_inline __u8 tcp_flags(const struct iphdr *ip, void *data_end)
{
	const __u8 *flags = (const void *)(ip + 1) + 13;

	if (ip->protocol != IPPROTO_TCP || (void *)(flags + 1) > data_end)
		return 0;
	return *flags;
}

/* Do two notes of a flow carry the same facts for its entry? */
static __always_inline int fast_same_facts(const struct fast_note *a, const struct fast_note *b)
{
	return a->vtep_src == b->vtep_src && a->vtep_dst == b->vtep_dst && a->ttl == b->ttl &&
	       a->underlay == b->underlay && mac_eq(a->outer_dmac, b->outer_dmac) && mac_eq(a->in_dmac, b->in_dmac) &&
	       mac_eq(a->in_smac, b->in_smac);
}

/*
 * Keep the note n of a frame of the flow k, for its packet's way out. A
 * frame the kernel drops anyway could still replace the note of a packet
 * on its way; so a note whose facts differ from a fresh one's teaches
 * nothing for FAST_NOTE_NS (unsure_until): the packet that then leaves
 * the overlay may be either. The caller notes only a frame the kernel's
 * path may deliver.
 */
static __always_inline void fast_note_keep(const struct fast_key *k, struct fast_note *n, __u64 now)
{
	struct fast_note *old = bpf_map_lookup_elem(&steer_fast_notes, k);

	if (old) {
		n->unsure_until = old->unsure_until;
		if (now < old->at + FAST_NOTE_NS && !fast_same_facts(old, n))
			n->unsure_until = now + FAST_NOTE_NS;
	}
	bpf_map_update_elem(&steer_fast_notes, k, n, BPF_ANY);
}

/* The inner facts of a note: the inner Ethernet header and IPv4 header
 * as they arrived, the change count, the time. */
static __always_inline void fast_note_inner(struct fast_note *n, const struct ethhdr *ieth, const struct iphdr *iip,
					    __u64 now)
{
	__builtin_memcpy(n->in_dmac, ieth->h_dest, sizeof(n->in_dmac));
	__builtin_memcpy(n->in_smac, ieth->h_source, sizeof(n->in_smac));
	n->ttl = iip->ttl;
	n->id = iip->id;
	n->tot_len = iip->tot_len;
	n->changes = path_changes();
	n->at = now;
}

/*
 * Note a frame of a flow without an entry at the underlay's ingress. Only
 * a frame the kernel's path may deliver is noted: addressed to this host
 * (pkt_type), untagged, its outer headers and its inner IPv4 header as
 * the kernel's checks want them (outer_ok).
 */
static __always_inline void fast_note(struct __sk_buff *skb, const struct fast_key *k, const struct outer_hdrs *o,
				      __u64 now)
{
	struct fast_note n = {
		.vtep_src = o->ip->saddr,
		.vtep_dst = o->ip->daddr,
		.underlay = skb->ingress_ifindex,
	};

	if (skb->pkt_type != PACKET_HOST || !outer_ok(o, skb->len) || o->iip->ihl != 5 || !ipv4_csum_ok(o->iip) ||
	    bpf_ntohs(o->iip->tot_len) != skb->len - OUTER_LEN - ETH_HLEN)
		return;
	__builtin_memcpy(n.outer_dmac, o->eth->h_dest, sizeof(n.outer_dmac));
	fast_note_inner(&n, o->ieth, o->iip, now);
	fast_note_keep(k, &n, now);
}

/* Is an entry of map (key k, admitted under the change count changes,
 * last used at last) void at now? 0 if not, else the counter saying why:
 * stale, the first of three consecutive counters, then lease and idle.
 * An entry that can never hold again (a change on the path, idle) is
 * deleted. */
static __always_inline __u32 fast_void_in(void *map, const void *k, __u64 changes, __u64 last, __u64 now,
					  __u32 stale)
{
	__u64 now_changes = path_changes();

	if (changes != now_changes) {
		bpf_map_delete_elem(map, k);
		return stale;
	}
	if (!fast_leased(now, now_changes))
		return stale + 1;
	if (now > last && now - last > (__u64)steer_mode.fast_idle_ms * 1000000) {
		bpf_map_delete_elem(map, k);
		return stale + 2;
	}
	return 0;
}

/* A frame of the flow fk is handed on (either path) at now: one more in
 * flight until its container's ingress sees it. */
static __always_inline void fast_handed(const struct fast_key *fk, struct fast_flight *fl, __u64 now)
{
	struct fast_flight first = { .n = 1, .at = now };

	if (!fl) {
		if (bpf_map_update_elem(&steer_fast_flight, fk, &first, BPF_NOEXIST) == 0)
			return;
		fl = bpf_map_lookup_elem(&steer_fast_flight, fk);
		if (!fl)
			return;
	}
	__sync_fetch_and_add(&fl->n, 1);
	fl->at = now;
}

/* May a frame of the flow take the fast path at now, or would it overtake
 * one on the kernel's path? A count left by frames that path dropped
 * ends once the flow was idle for the drain time. */
static __always_inline int fast_in_order(const struct steer_cfg *cfg, struct fast_flight *fl, __u64 now)
{
	if (!fl || !fl->n)
		return 1;
	if (now - fl->at < cfg->drain_ns)
		return 0;
	fl->n = 0;
	return 1;
}

/*
 * Inner IPv4 fragments. Past the first a fragment carries no ports, so
 * the fast path takes none, and a later frame of its flow must not take
 * the fast path past one still on the kernel's path: fragments are
 * counted in flight by addresses and protocol (a fast_key without ports
 * or VNI), from the fast path's entry to the container's ingress, and a
 * frame of any flow between those addresses waits for them as for its own
 * flow's (fast_frags_in_order). The count of all of them
 * (steer_fast_frags) spares every frame that lookup while none is in
 * flight.
 */
static __always_inline __s64 *fast_frags(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&steer_fast_frags, &zero);
}

/* The fragments' key of the inner frame at off in skb, linear up to its
 * IPv4 header: 1 if it is an IPv4 fragment, 0 if not. */
static __always_inline int fast_frag_key(struct __sk_buff *skb, __u32 off, struct fast_key *k)
{
	__u64 at = off;
	struct ethhdr *eth;
	struct iphdr *ip;

	if (at > MAX_OUTER_HDRS)
		return 0;
	/* Bound the offset in the register the pointer is made from (the
	 * compiler compares a copy, and would drop a C mask as redundant). */
	asm volatile("%0 &= 0xff" : "+r"(at));
	eth = (void *)(long)skb->data + at;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > (void *)(long)skb->data_end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 ||
	    !(ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
		return 0;
	k->saddr = ip->saddr;
	k->daddr = ip->daddr;
	k->proto = ip->protocol;
	return 1;
}

/* The frame at off in skb, which the fast path leaves to the kernel's
 * path, is counted in flight if it is an inner IPv4 fragment. */
static __always_inline void fast_frag_in(struct __sk_buff *skb, __u32 off)
{
	struct fast_key k = {};
	__s64 *all = fast_frags();

	if (!all || !fast_frag_key(skb, off, &k))
		return;
	__sync_fetch_and_add(all, 1);
	fast_handed(&k, bpf_map_lookup_elem(&steer_fast_flight, &k), bpf_ktime_get_ns());
}

/* The container's ingress saw the frame at off in skb: one fragment fewer
 * in flight, if it is one the fast path counted. */
static __always_inline void fast_frag_seen(struct __sk_buff *skb, __u32 off)
{
	struct fast_key k = {};
	struct fast_flight *fl;
	__s64 *all = fast_frags();

	if (!all || *all <= 0 || !fast_frag_key(skb, off, &k))
		return;
	fl = bpf_map_lookup_elem(&steer_fast_flight, &k);
	if (fl && fl->n) {
		__sync_fetch_and_add(&fl->n, -1); /* XADD: -mcpu=v1 has no atomic sub */
		__sync_fetch_and_add(all, -1);
	}
}

/* May a frame of flow k take the fast path at now, with no fragment
 * between its addresses on the kernel's path? A count left by fragments
 * that path dropped ends, as fast_in_order's does, after the drain time. */
static __always_inline int fast_frags_in_order(const struct steer_cfg *cfg, const struct fast_key *k, __u64 now)
{
	struct fast_key fk = { .saddr = k->saddr, .daddr = k->daddr, .proto = k->proto };
	struct fast_flight *fl;
	__s64 *all = fast_frags();
	__u32 n;

	if (!all || *all <= 0)
		return 1;
	fl = bpf_map_lookup_elem(&steer_fast_flight, &fk);
	if (!fl || !fl->n)
		return 1;
	if (now - fl->at < cfg->drain_ns)
		return 0;
	n = fl->n;
	fl->n = 0;
	__sync_fetch_and_add(all, -(__s64)n);
	return 1;
}

/* Is the entry e of the fast path into the container void at now? */
static __always_inline __u32 fast_void(const struct fast_key *k, const struct fast_entry *e, __u64 now)
{
	return fast_void_in(&steer_fast, k, e->changes, e->last, now, CNT_FAST_STALE);
}

/* Does the frame come as the entry's did: on its device, between its
 * VTEPs, with its MACs? */
static __always_inline int fast_same_outer(const struct __sk_buff *skb, const struct fast_entry *e,
					   const struct outer_hdrs *o)
{
	return skb->ingress_ifindex == e->underlay && o->ip->saddr == e->vtep_src && o->ip->daddr == e->vtep_dst &&
	       mac_eq(o->eth->h_dest, e->outer_dmac) && mac_eq(o->ieth->h_dest, e->in_dmac) &&
	       mac_eq(o->ieth->h_source, e->in_smac);
}

/*
 * The kernel's checks on the way that the outer facts do not settle, for
 * a frame of len bytes: outer_ok's; an inner IPv4 header without options
 * (ip_forward may act on them), its checksum right (ip_rcv on a routed
 * path; the container's own otherwise) and its total length the frame's
 * (the routed path trims the rest); a TTL the routed path does not expire
 * (ip_forward); no longer than the path's MTU; RFC 6040's ECN (*ecn).
 * The outer UDP checksum is fast_ingress's.
 */
static __always_inline int fast_checks(const struct fast_entry *e, const struct outer_hdrs *o, __u32 len, __u32 *ecn)
{
	__u32 ilen = bpf_ntohs(o->iip->tot_len);

	if (!outer_ok(o, len) || o->iip->ihl != 5 || !ipv4_csum_ok(o->iip))
		return 0;
	if (ilen != len - OUTER_LEN - ETH_HLEN || ilen > e->mtu || o->iip->ttl <= e->ttl_dec)
		return 0;
	return outer_ecn(o, ecn);
}

/* Is the entry's veth still one the agent vouches for, its container's
 * MAC the one the entry delivers to and its MTU no smaller? A container
 * that changed either since admission is told at the agent's next round
 * (steer_fast_dev); bpf_redirect_peer would check neither. */
static __always_inline int fast_dev_holds(const struct fast_entry *e)
{
	struct fast_dev *dev = bpf_map_lookup_elem(&steer_fast_dev, &e->ifindex);

	return dev && mac_eq(dev->mac, e->dmac) && dev->mtu >= e->mtu;
}

/*
 * Hand a checked frame of flow t whose inner Ethernet header is eth and
 * IPv4 header iip to the entry's container as the kernel's path would
 * have delivered it: the inner Ethernet header that path leaves, the TTL
 * it takes off (as ip_decrease_ttl does). What bpf_redirect_peer's scrub
 * keeps and the veth's would not, the mark, is cleared; the receive queue
 * is the peer's own. Beside a mode that counts its later stages
 * (MODE_FAST_BESIDE), whose container stage's end (steer_tc_seen,
 * steer_tc_veth_seen) counts out a frame whose hash is zero or
 * HASH_COUNTED, the frame gets its flow's hash without that bit, which no
 * stage counted in.
 */
static __always_inline int fast_hand_in(struct __sk_buff *skb, struct fast_entry *e, struct ethhdr *eth,
					struct iphdr *iip, const struct tuple *t, __u64 now)
{
	__builtin_memcpy(eth->h_dest, e->dmac, sizeof(eth->h_dest));
	__builtin_memcpy(eth->h_source, e->smac, sizeof(eth->h_source));
	if (e->ttl_dec) {
		/* ip_decrease_ttl's update, to the byte (0x0000, not 0xffff). */
		__u32 check = (__u32)iip->check + bpf_htons(0x0100);

		iip->check = (__u16)(check + (check >= 0xffff));
		iip->ttl--;
	}
	/* Two stores the compiler must not merge into one the verifier
	 * refuses (a context field is written at its own width). */
	*(volatile __u32 *)&skb->mark = 0;
	*(volatile __u32 *)&skb->queue_mapping = 0;
	if (mode(MODE_FAST_BESIDE) && (!skb->hash || (skb->hash & HASH_COUNTED)))
		bpf_set_hash(skb, (flow_hash(t) & ~HASH_COUNTED) ?: 2);
	if (now > e->last + FAST_STAMP_NS)
		e->last = now;
	count(STAGE_SPLIT, CNT_FAST);
	return bpf_redirect_peer(e->ifindex, 0);
}

/*
 * Hand the checked frame at the underlay's ingress to the container:
 * strip the outer headers and the inner Ethernet header
 * (bpf_skb_adjust_room keeps the first ETH_HLEN bytes, which become the
 * inner Ethernet header), apply ECN, and leave the checksum state as the
 * VXLAN socket's receive leaves it (one level of CHECKSUM_UNNECESSARY
 * consumed: the outer UDP's); then fast_hand_in.
 */
static __always_inline int fast_deliver(struct __sk_buff *skb, struct fast_entry *e, __u32 ecn,
					const struct tuple *t, __u64 now)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct iphdr *iip;

	if (bpf_skb_adjust_room(skb, -(__s32)OUTER_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_NO_CSUM_RESET)) {
		count(STAGE_SPLIT, CNT_FAST_REFUSED); /* the frame is whole: the kernel's path */
		return TC_ACT_UNSPEC;
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	iip = data + ETH_HLEN;
	if ((void *)(iip + 1) > data_end) {
		count(STAGE_SPLIT, CNT_FAST_DROPPED);
		return TC_ACT_SHOT;
	}
	inner_ecn(iip, ecn);
	bpf_csum_level(skb, BPF_CSUM_LEVEL_DEC);
	return fast_hand_in(skb, e, eth, iip, t, now);
}

/*
 * A frame of flow t (n frames) the fast path took out of the first
 * stage's queue of a mode beside it (falcon's split, PRISM's classes: the
 * flags steer_xdp's metadata carried) is counted out of it as the
 * program the fast path skips (steer_tc_ingress, steer_tc_split_seen)
 * would count it, so a move waiting for that queue to drain does not
 * wait for it.
 */
static __always_inline void fast_dequeued(const struct tuple *t, __u32 flags, __u32 n)
{
	if (!mode(MODE_FAST_BESIDE))
		return;
	if (flags & LANES_META_QUEUED)
		seen_split(t, flags, n);
	queue_seen(meta_qid(flags), n);
}

/*
 * Note a frame of a flow without an entry at the VXLAN device's ingress
 * (fast_vx), received on ifindex. Only a frame the kernel's path may
 * deliver is noted: untagged, its IPv4 header without options, its
 * checksum and total length right (br_netfilter's br_validate_ipv4 drops
 * it otherwise).
 */
static __always_inline void fast_vx_note(struct __sk_buff *skb, const struct fast_key *k, const struct ethhdr *eth,
					 const struct iphdr *iip, __u32 ifindex, __u64 now)
{
	struct fast_note n = { .underlay = ifindex };

	if (iip->ihl != 5 || !ipv4_csum_ok(iip) || bpf_ntohs(iip->tot_len) != skb->len - ETH_HLEN)
		return;
	fast_note_inner(&n, eth, iip, now);
	fast_note_keep(k, &n, now);
}

/*
 * The checks of the kernel's path from the VXLAN device to the container
 * (fast_vx) for the frame at eth of len bytes: its IPv4 header without
 * options, its checksum and total length right (br_validate_ipv4 with
 * br_netfilter on; ip_rcv on a routed path), a TTL the routed path does
 * not expire; no longer than the path's MTU unless GSO (the bridge and
 * the veth forward a GSO frame of any length, is_skb_forwardable).
 */
static __always_inline int fast_vx_checks(const struct fast_entry *e, const struct iphdr *iip, __u32 len, int gso)
{
	__u32 ilen = bpf_ntohs(iip->tot_len);

	if (iip->ihl != 5 || !ipv4_csum_ok(iip) || ilen != len - ETH_HLEN || iip->ttl <= e->ttl_dec)
		return 0;
	return gso || ilen <= e->mtu;
}

/* An entry made from the packet whose note n is, as it leaves on the
 * host-side veth ifindex (MTU and container MAC dev) with the Ethernet
 * header eth and inner TTL ttl. */
static __always_inline void fast_admit(const struct fast_key *k, const struct fast_note *n, const struct fast_dev *dev,
				       __u32 ifindex, const struct ethhdr *eth, __u8 ttl, __u64 now)
{
	struct fast_entry e = {
		.ifindex = ifindex,
		.underlay = n->underlay,
		.vtep_src = n->vtep_src,
		.vtep_dst = n->vtep_dst,
		.ttl_dec = n->ttl - ttl,
		.mtu = dev->mtu,
		.changes = n->changes,
		.last = now,
	};

	__builtin_memcpy(e.outer_dmac, n->outer_dmac, sizeof(e.outer_dmac));
	__builtin_memcpy(e.in_dmac, n->in_dmac, sizeof(e.in_dmac));
	__builtin_memcpy(e.in_smac, n->in_smac, sizeof(e.in_smac));
	__builtin_memcpy(e.dmac, eth->h_dest, sizeof(e.dmac));
	__builtin_memcpy(e.smac, eth->h_source, sizeof(e.smac));
	bpf_map_delete_elem(&steer_fast_notes, k);
	if (bpf_map_update_elem(&steer_fast, k, &e, BPF_ANY) == 0)
		count(STAGE_SPLIT, CNT_FAST_ADMITTED);
}
