/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The fast path out of the container (MODE_FAST, with fast.h's way in):
 * once the kernel's own path has sent a flow of a container out over the
 * overlay, its later frames are encapsulated at the host-side veth's tc
 * ingress with the outer headers the kernel's path wrote for it and sent
 * out the underlay directly (bpf_redirect), skipping the bridge or the
 * routing, the VXLAN device and outer IP/UDP.
 *
 * Learning: a frame of a flow without an entry leaves a note at the veth's
 * ingress (fastout_note: the veth, the inner IP id, total length, TTL, TOS
 * and DF, the inner MACs, the skb's hash, the change count). Where the
 * same packet leaves the host, at the underlay's tc egress
 * (steer_tc_out_learn), the frame the kernel's path wrote makes the
 * flow's entry: its outer Ethernet, IP, UDP and VXLAN headers and inner
 * Ethernet header as a template, the TTL the path took off, whether the
 * device checksums the outer UDP. Only a packet the whole path sent out
 * teaches anything, never one packet alone: no note, no entry. Its UDP
 * source port must be the one fastout_port computes from the note's hash,
 * as the VXLAN device computes it (udp_flow_src_port over the port range
 * lanes agent read): otherwise no entry.
 *
 * Use (steer_tc_out): a frame with the noted packet's MACs, TTL, TOS
 * (DSCP) and DF, which the VXLAN device's settings may copy outward, that
 * passes the checks the kernel's path makes (inner IPv4 header without
 * options, its checksum, its length the frame's, TTL, MTU), gets the
 * template with the fields the device writes per packet: lengths, the
 * outer IP id (random: the device's counter is its own), ECN as
 * INET_ECN_encapsulate copies it, the UDP source port from the skb's hash
 * (a TCP socket's hash changes on retransmits: never cached), the outer
 * UDP checksum where the device writes one (0 for GSO frames: BPF makes
 * them SKB_GSO_UDP_TUNNEL, whose segments keep the outer checksum 0), the
 * inner TTL a routed path leaves. Entries end as fast.h's do: TCP FIN or
 * RST, idle time, a change counted on the path, the agent's flush, the
 * lease.
 *
 * The outer UDP checksum of a frame that is not GSO is computed from its
 * headers alone: a TCP or UDP packet whose own checksum is right, or left
 * for the device to fill (CHECKSUM_PARTIAL: it holds the pseudo-header's
 * sum), sums to the complement of its pseudo-header's sum, as the kernel's
 * lco_csum takes it. A UDP packet without a checksum takes the kernel's
 * path.
 */
#pragma once

#include "fast.h"

/* The outer headers and the inner Ethernet header: what an entry's
 * template holds. */
#define FASTOUT_HDR_LEN (OUTER_LEN + ETH_HLEN)

#define FASTOUT_IP_DF 0x4000

/* A flow leaving a container, by the host-side veth it comes in on (0 in
 * a note's key: where the packet leaves, the veth is unknown) and its
 * inner 5-tuple. */
struct fastout_key {
	__u32 veth;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3]; /* 0: the key is hashed as bytes */
};

/* What the veth's ingress saw of a flow's packet that took the kernel's
 * path (no entry yet), to know it again where it leaves the host. */
struct fastout_note {
	__u32 veth;
	__u32 hash;    /* the skb's hash: the VXLAN device picks the UDP source port from it */
	__u8 dmac[6];  /* inner Ethernet header as it came in */
	__u8 smac[6];
	__be16 id;     /* inner IP id and total length */
	__be16 tot_len;
	__u8 ttl;      /* inner TTL, TOS and DF as they came in */
	__u8 tos;
	__be16 df;
	__u32 admitted; /* the packet left and made an entry: a second copy of it leaving voids it */
	__u32 pad;
	__u64 changes; /* steer_changes when it came in */
	__u64 at;      /* bpf_ktime_get_ns() when it came in */
};

/* A flow the kernel's path sent out, learned where its packet left the
 * underlay. */
struct fastout_entry {
	__u8 hdr[FASTOUT_HDR_LEN]; /* the headers the kernel's path wrote, up to the inner IPv4 header */
	__u32 underlay;            /* where they left: bpf_redirect sends there */
	__u32 mtu;                 /* longest inner IP packet (or GSO segment) the path sends */
	__u8 dmac[6];              /* the frames come in with these MACs ... */
	__u8 smac[6];
	__u8 ttl;    /* ... this TTL, TOS and DF */
	__u8 tos;
	__be16 df;
	__u32 port_min;            /* the VXLAN device's source port range */
	__u32 port_range;
	__u8 ttl_dec;              /* what the kernel's path took off the inner TTL: 0 bridged, 1 routed */
	__u8 csum;                 /* the device writes an outer UDP checksum */
	__u8 pad[6];
	__u64 changes;             /* steer_changes at admission */
	__u64 last;                /* bpf_ktime_get_ns() of its last use (stamped once per FAST_STAMP_NS) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FAST_ENTRIES);
	__type(key, struct fastout_key);
	__type(value, struct fastout_entry);
} steer_fastout SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FAST_ENTRIES);
	__type(key, struct fastout_key);
	__type(value, struct fastout_note);
} steer_fastout_notes SEC(".maps");

/* What lanes agent read of a VXLAN device the fast path may send through,
 * by its VNI: its UDP source port range (udp_flow_src_port's min and
 * max - min) and the longest inner IP packet the path sends (the device's
 * MTU, and the underlay's less the outer headers). */
struct fastout_vxlan {
	__u32 port_min;
	__u32 port_range;
	__u32 mtu;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); /* VNI */
	__type(value, struct fastout_vxlan);
} steer_fastout_vxlan SEC(".maps");

/* The devices lanes agent vouches for on the way out, by role (bits):
 * host-side veths the fast path may take frames from, underlays it may
 * send to. */
#define FASTOUT_VETH 1
#define FASTOUT_UNDERLAY 2

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* ifindex */
	__type(value, __u32); /* FASTOUT_VETH, FASTOUT_UNDERLAY */
} steer_fastout_dev SEC(".maps");

/* Is ifindex vouched for as role? */
static __always_inline int fastout_dev_is(__u32 ifindex, __u32 role)
{
	__u32 *r = bpf_map_lookup_elem(&steer_fastout_dev, &ifindex);

	return r && (*r & role);
}

static __always_inline void fastout_key_of(struct fastout_key *k, __u32 veth, const struct tuple *t)
{
	k->veth = veth;
	k->saddr = t->saddr;
	k->daddr = t->daddr;
	k->sport = t->sport;
	k->dport = t->dport;
	k->proto = t->proto;
}

/* The UDP source port the VXLAN device picks for a packet of hash h
 * (udp_flow_src_port), in network order. */
static __always_inline __be16 fastout_port(__u32 h, __u32 min, __u32 range)
{
	h ^= h << 16;
	return bpf_htons((__u16)((((__u64)h * range) >> 32) + min));
}

/* Note a frame (Ethernet header eth, IPv4 header ip) of a flow without an
 * entry, for its packet's way out: only a unicast frame without IP
 * options, with a hash to pick its port from. */
static __always_inline void fastout_note(struct __sk_buff *skb, const struct tuple *t, __u32 veth, __u64 now)
{
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = (void *)(long)skb->data;
	struct iphdr *ip = (void *)(eth + 1);
	struct fastout_key k = {};
	struct fastout_note n = {};

	if ((void *)(ip + 1) > data_end || (eth->h_dest[0] & 1) || ip->ihl != 5)
		return;
	n.veth = veth;
	n.id = ip->id;
	n.tot_len = ip->tot_len;
	n.ttl = ip->ttl;
	n.tos = ip->tos;
	n.df = ip->frag_off & bpf_htons(FASTOUT_IP_DF);
	__builtin_memcpy(n.dmac, eth->h_dest, sizeof(n.dmac));
	__builtin_memcpy(n.smac, eth->h_source, sizeof(n.smac));
	n.hash = bpf_get_hash_recalc(skb);
	if (!n.hash)
		return;
	n.changes = path_changes();
	n.at = now;
	fastout_key_of(&k, 0, t);
	bpf_map_update_elem(&steer_fastout_notes, &k, &n, BPF_ANY);
}

/* Does the frame come as the noted packet did: with its MACs, its TTL,
 * and the TOS (DSCP) and DF bits the device may copy outward? */
static __always_inline int fastout_same(const struct fastout_entry *e, const struct ethhdr *eth, const struct iphdr *ip)
{
	return mac_eq(eth->h_dest, e->dmac) && mac_eq(eth->h_source, e->smac) && ip->ttl == e->ttl &&
	       (ip->tos & ~ECN_CE) == (e->tos & ~ECN_CE) && (ip->frag_off & bpf_htons(FASTOUT_IP_DF)) == e->df;
}

/*
 * The kernel's checks on the way out for the frame at eth/ip of len bytes:
 * an inner IPv4 header without options (ip_forward may act on them), its
 * checksum right (ip_rcv on a routed path), its total length the frame's;
 * a TTL the routed path does not expire; no longer than the path's MTU (a
 * GSO frame: TCP, each segment); a UDP packet with a checksum where the
 * outer one is computed (the file's comment).
 */
static __always_inline int fastout_checks(const struct __sk_buff *skb, const struct fastout_entry *e,
					  const struct iphdr *ip, void *data_end)
{
	__u32 ilen = bpf_ntohs(ip->tot_len);
	const struct tcphdr *th = (const void *)(ip + 1);
	const struct udphdr *uh = (const void *)(ip + 1);

	if (ip->ihl != 5 || !ipv4_csum_ok(ip) || ilen != skb->len - ETH_HLEN || ip->ttl <= e->ttl_dec)
		return 0;
	if (skb->gso_size) {
		if (ip->protocol != IPPROTO_TCP || (void *)(th + 1) > data_end)
			return 0;
		return skb->gso_size + sizeof(*ip) + th->doff * 4 <= e->mtu;
	}
	if (ilen > e->mtu)
		return 0;
	if (ip->protocol == IPPROTO_UDP && e->csum)
		return (void *)(uh + 1) <= data_end && uh->check;
	return 1;
}

/* The sum of the n bytes (even, a constant) at p as 16-bit words as they
 * lie in memory. */
static __always_inline __u64 fastout_sum(const void *p, int n)
{
	const __u16 *w = p;
	__u64 sum = 0;

#pragma unroll
	for (int i = 0; i < n / 2; i++)
		sum += w[i];
	return sum;
}

/*
 * The outer UDP checksum of the frame the headers at data begin (outer
 * IPv4 header oip, UDP header uh with its checksum 0, inner IPv4 header
 * iip, whose own checksum is right): the pseudo-header's sum, the UDP and
 * VXLAN headers', the inner Ethernet header's, nothing for the inner IPv4
 * header (it sums to 0), and for the inner TCP or UDP packet the
 * complement of its pseudo-header's sum (the file's comment).
 */
static __always_inline __u16 fastout_udp_csum(const struct iphdr *oip, const struct udphdr *uh,
					      const struct iphdr *iip)
{
	__u64 sum, in;
	__u16 c;

	sum = fastout_sum(&oip->saddr, 8) + bpf_htons(IPPROTO_UDP) + uh->len;
	sum += fastout_sum(uh, sizeof(*uh) + sizeof(struct vxlanhdr) + ETH_HLEN);
	in = fastout_sum(&iip->saddr, 8) + bpf_htons(iip->protocol) + bpf_htons(bpf_ntohs(iip->tot_len) - sizeof(*iip));
	sum += (__u16)~csum_fold64(in);
	c = ~csum_fold64(sum);
	return c ? c : 0xffff;
}

/* The IPv4 header checksum of ip (its check field 0). */
static __always_inline __u16 fastout_ip_csum(const struct iphdr *ip)
{
	return ~csum_fold64(fastout_sum(ip, sizeof(*ip)));
}

/*
 * Send the checked frame out: grow room for the outer headers after its
 * Ethernet header (bpf_skb_adjust_room marks the skb encapsulated, and a
 * GSO one UDP-tunnel GSO), write the template over its first
 * FASTOUT_HDR_LEN bytes (the inner Ethernet header the path wrote
 * included), then the fields the device writes per packet (the file's
 * comment), and redirect it to the underlay's transmit.
 */
static __always_inline int fastout_send(struct __sk_buff *skb, struct fastout_entry *e, __u32 hash, __u64 now)
{
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
		      BPF_F_ADJ_ROOM_ENCAP_L2_ETH | BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
	__u32 gso = skb->gso_size, ilen = skb->len - ETH_HLEN;
	void *data, *data_end;
	struct iphdr *oip, *iip;
	struct udphdr *uh;
	__u8 ecn;

	if (bpf_skb_adjust_room(skb, OUTER_LEN, BPF_ADJ_ROOM_MAC, flags)) {
		count(STAGE_SPLIT, CNT_FASTOUT_REFUSED); /* the frame is whole: the kernel's path */
		return TC_ACT_UNSPEC;
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	oip = data + ETH_HLEN;
	uh = (void *)(oip + 1);
	iip = data + FASTOUT_HDR_LEN;
	if ((void *)(iip + 1) > data_end) {
		count(STAGE_SPLIT, CNT_FASTOUT_DROPPED);
		return TC_ACT_SHOT;
	}
	__builtin_memcpy(data, e->hdr, FASTOUT_HDR_LEN);
	if (e->ttl_dec) {
		iip->check = csum16_add(iip->check, bpf_htons(0x0100));
		iip->ttl--;
	}
	ecn = iip->tos & ECN_CE;
	oip->tos = (oip->tos & ~ECN_CE) | (ecn == ECN_CE ? ECN_ECT_0 : ecn);
	oip->tot_len = bpf_htons(ilen + FASTOUT_HDR_LEN - ETH_HLEN);
	oip->id = (__be16)bpf_get_prandom_u32();
	oip->check = 0;
	oip->check = fastout_ip_csum(oip);
	uh->source = fastout_port(hash, e->port_min, e->port_range);
	uh->len = bpf_htons(ilen + sizeof(*uh) + sizeof(struct vxlanhdr) + ETH_HLEN);
	uh->check = 0;
	if (e->csum && !gso)
		uh->check = fastout_udp_csum(oip, uh, iip);
	if (now > e->last + FAST_STAMP_NS)
		e->last = now;
	count(STAGE_SPLIT, CNT_FASTOUT);
	return bpf_redirect(e->underlay, 0);
}

/* What fastout_seen says of a frame leaving whose flow's note made an
 * entry already. */
#define FASTOUT_AGAIN 1   /* nothing to learn: the fast path's own frame, or another packet */
#define FASTOUT_FLOODED 2 /* the entry is void, and gone */

/*
 * A frame (outer IPv4 header ip, inner iip) leaving whose note n made an
 * entry already: 0 if n made none. A copy of that same packet to another
 * VTEP (a VXLAN device flooding it to more than one, which one entry
 * cannot do) voids the entry and the note (k, veth 0): the kernel's path
 * takes the flow. Anything else is FASTOUT_AGAIN: the fast path's own
 * frames pass here too.
 */
static __always_inline int fastout_seen(struct fastout_key *k, const struct fastout_note *n,
					const struct iphdr *ip, const struct iphdr *iip)
{
	struct fastout_entry *e;
	struct iphdr *eip;

	if (!n->admitted)
		return 0;
	if (n->id != iip->id || n->tot_len != iip->tot_len)
		return FASTOUT_AGAIN;
	k->veth = n->veth;
	e = bpf_map_lookup_elem(&steer_fastout, k);
	eip = e ? (void *)(e->hdr + ETH_HLEN) : NULL;
	if (eip && eip->daddr == ip->daddr)
		return FASTOUT_AGAIN;
	bpf_map_delete_elem(&steer_fastout, k);
	k->veth = 0;
	bpf_map_delete_elem(&steer_fastout_notes, k);
	return FASTOUT_FLOODED;
}

/* An entry made from the packet whose note n is, as it leaves on the
 * underlay ifindex in the frame at data (outer headers at their fixed
 * offsets), through the VXLAN device vx. The note stays, marked: another
 * copy of the same packet leaving (flooded to more than one VTEP) voids
 * the entry (fastout_seen). */
static __always_inline void fastout_admit(const struct fastout_key *nk, struct fastout_note *n,
					  const struct fastout_vxlan *vx, __u32 ifindex, const void *data,
					  const struct outer_hdrs *o, __u64 now)
{
	struct fastout_key k = *nk;
	struct fastout_entry e = {
		.underlay = ifindex,
		.mtu = vx->mtu,
		.ttl = n->ttl,
		.tos = n->tos,
		.df = n->df,
		.port_min = vx->port_min,
		.port_range = vx->port_range,
		.ttl_dec = n->ttl - o->iip->ttl,
		.csum = o->uh->check != 0,
		.changes = n->changes,
		.last = now,
	};

	__builtin_memcpy(e.hdr, data, FASTOUT_HDR_LEN);
	__builtin_memcpy(e.dmac, n->dmac, sizeof(e.dmac));
	__builtin_memcpy(e.smac, n->smac, sizeof(e.smac));
	k.veth = n->veth;
	n->admitted = 1;
	if (bpf_map_update_elem(&steer_fastout, &k, &e, BPF_ANY) == 0)
		count(STAGE_SPLIT, CNT_FASTOUT_ADMITTED);
}
