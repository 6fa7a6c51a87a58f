/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Parsing: the outer Ethernet/IPv4/UDP/VXLAN headers of an overlay frame
 * and the inner Ethernet/IPv4/TCP-or-UDP headers of its flow, with the
 * kernel's length rules (ip_rcv's total length, udp_rcv's UDP length,
 * tcp_v4_rcv's data offset): a field steer reads is one the kernel would
 * read too. Fragments, IPv4 options beyond the header's own length, and
 * anything but IPv4 are refused (the frame goes on untouched).
 */
#pragma once

#include "maps.h"
#include "vxlan.h"

/* Not in the UAPI headers (they live in include/net/ip.h). */
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

/* Longest header chain each parser may read: IPv4 options at their maximum. */
#define MAX_INNER_HDRS (ETH_HLEN + 60 + sizeof(struct tcphdr))
#define MAX_OUTER_HDRS (ETH_HLEN + 60 + sizeof(struct udphdr) + sizeof(struct vxlanhdr) + MAX_INNER_HDRS)

struct tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	/* The frame ends a GRO segment of its flow (see mark_inline): a TCP
	 * segment with URG, PSH, RST, SYN or FIN, or without payload, which
	 * make GRO hand the merged segment on at once, or any UDP datagram.
	 * Not part of the flow's identity. */
	__u8 seg_end;
};

/* A read position in a packet; every step is checked against end, the
 * bytes the program can read, and left, the bytes the headers read so far
 * say lie ahead (an skb's length at first, then the IPv4 total length and
 * the UDP length): a field lanes reads is one the kernel would read too,
 * not a byte past what it trims. */
struct cursor {
	void *pos;
	void *end;
	__u32 left;
};

static __always_inline void *take(struct cursor *c, __u32 len)
{
	void *p = c->pos;

	if (p + len > c->end || len > c->left)
		return NULL;
	c->pos = p + len;
	c->left -= len;
	return p;
}

/* IPv4 header including options, within its total length (as ip_rcv
 * checks it: at least the header, at most what the frame holds; the rest
 * is trimmed); fragments are refused because only the first carries
 * ports, and steering the rest differently would split them. */
static __always_inline struct iphdr *parse_ipv4(struct cursor *c)
{
	__u32 avail = c->left;
	struct iphdr *ip = take(c, sizeof(*ip));
	__u32 hlen, tot;

	if (!ip || ip->version != 4 || ip->ihl < 5)
		return NULL;
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return NULL;
	hlen = ip->ihl * 4;
	tot = bpf_ntohs(ip->tot_len);
	if (tot < hlen || tot > avail)
		return NULL;
	c->left = tot - sizeof(*ip);
	if (!take(c, hlen - sizeof(*ip)))
		return NULL;
	return ip;
}

/* A UDP header within the IP payload, whose length (at least the header)
 * bounds what follows, as udp_rcv trims it. */
static __always_inline struct udphdr *parse_udp(struct cursor *c)
{
	__u32 avail = c->left;
	struct udphdr *uh = take(c, sizeof(*uh));
	__u32 len;

	if (!uh)
		return NULL;
	len = bpf_ntohs(uh->len);
	if (len < sizeof(*uh) || len > avail)
		return NULL;
	c->left = len - sizeof(*uh);
	return uh;
}

/* TCP flags (byte 13 of the header) that make tcp_gro_receive flush the
 * segment: URG, PSH, RST, SYN, FIN. */
#define TCP_GRO_FLUSH_FLAGS 0x2f

/* Ethernet + IPv4 + a complete TCP or UDP header. */
static __always_inline int parse_inner(struct cursor *c, struct tuple *t)
{
	struct ethhdr *eth = take(c, sizeof(*eth));
	struct iphdr *ip;

	if (!eth || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	ip = parse_ipv4(c);
	if (!ip)
		return -1;
	t->saddr = ip->saddr;
	t->daddr = ip->daddr;
	t->proto = ip->protocol;
	if (ip->protocol == IPPROTO_TCP) {
		__u32 avail = c->left;
		struct tcphdr *th = take(c, sizeof(*th));

		/* The whole header, options included, as tcp_v4_rcv pulls it. */
		if (!th || th->doff < 5 || th->doff * 4 > avail)
			return -1;
		t->sport = th->source;
		t->dport = th->dest;
		/* A segment without payload (a pure ACK) is never merged. */
		t->seg_end = (((__u8 *)th)[13] & TCP_GRO_FLUSH_FLAGS) != 0 ||
			     bpf_ntohs(ip->tot_len) <= ip->ihl * 4 + th->doff * 4;
		return 0;
	}
	if (ip->protocol == IPPROTO_UDP) {
		struct udphdr *uh = parse_udp(c);

		if (!uh)
			return -1;
		t->sport = uh->source;
		t->dport = uh->dest;
		/* Inner UDP is not merged by GRO on the underlay (no socket
		 * there asks for UDP GRO), unless the NIC has rx-gro-list or
		 * rx-udp-gro-forwarding on (off by default): lanes assumes
		 * both off, and the plan says so. */
		t->seg_end = 1;
		return 0;
	}
	return -1;
}

/* Where parse_outer found the overlay: for PRISM-sync, which strips the
 * outer headers. */
struct overlay {
	__u32 vni;
	__u32 inner_off; /* offset of the inner Ethernet header */
};

/* parse_outer's answer for a frame of the overlay (a VNI lanes knows)
 * whose inner frame lanes does not parse: inner IPv6, ARP, a fragment. */
#define PARSE_INNER_UNKNOWN (-2)

/* Outer Ethernet/IPv4/UDP/VXLAN of a VNI lanes knows, then the inner flow;
 * ov (may be NULL) gets the VNI and where the inner frame starts. -1: not
 * the overlay; PARSE_INNER_UNKNOWN: the overlay, an inner frame lanes does
 * not parse. */
static __always_inline int parse_outer(struct cursor *c, const struct steer_cfg *cfg, struct tuple *t,
				       struct overlay *ov)
{
	void *start = c->pos;
	struct ethhdr *eth = take(c, sizeof(*eth));
	struct iphdr *ip;
	struct udphdr *uh;
	struct vxlanhdr *vx;
	__u32 vni;

	if (!eth || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	ip = parse_ipv4(c);
	if (!ip || ip->protocol != IPPROTO_UDP)
		return -1;
	uh = parse_udp(c);
	if (!uh || uh->dest != bpf_htons((__u16)cfg->vxlan_port))
		return -1;
	vx = take(c, sizeof(*vx));
	if (!vx || !(vx->vx_flags & bpf_htonl(VXLAN_FLAG_VNI)))
		return -1;
	vni = bpf_ntohl(vx->vx_vni) >> 8;
	if (!bpf_map_lookup_elem(&steer_vni, &vni))
		return -1;
	if (ov) {
		ov->vni = vni;
		ov->inner_off = c->pos - start;
	}
	return parse_inner(c, t) < 0 ? PARSE_INNER_UNKNOWN : 0;
}

/* Frames a (possibly GRO-merged) skb stands for. */
static __always_inline __u32 skb_frames(const struct __sk_buff *skb)
{
	return skb->gso_segs > 1 ? skb->gso_segs : 1;
}

/* Pull the first want bytes (capped at the skb's length) into the linear
 * area, only if they are not there yet: pulling unclones the skb. */
static __always_inline int pull(struct __sk_buff *skb, __u32 want)
{
	if (want > skb->len)
		want = skb->len;
	if ((void *)(long)skb->data + want <= (void *)(long)skb->data_end)
		return 0;
	return bpf_skb_pull_data(skb, want);
}

/* The inner flow of a frame whose data starts at the inner Ethernet header
 * (the veths' tc hooks); -1 if it is not one lanes understands. */
static __always_inline int skb_inner_tuple(struct __sk_buff *skb, struct tuple *t)
{
	struct cursor c;

	if (pull(skb, MAX_INNER_HDRS) < 0)
		return -1;
	c.pos = (void *)(long)skb->data;
	c.end = (void *)(long)skb->data_end;
	c.left = skb->len;
	return parse_inner(&c, t);
}
