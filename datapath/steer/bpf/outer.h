/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The kernel's checks on an overlay frame's outer headers, from ip_rcv to
 * vxlan_rcv, and RFC 6040's decapsulation of the ECN field: what a
 * shortcut that hands the inner frame on without that path must check
 * and do itself. They work on the frame's bytes (data, data_end) and its
 * length, so XDP (PRISM-sync, sync.h) and tc (the fast path, fast.h)
 * share them; what each hook can tell by other means (the outer UDP
 * checksum's state in an skb) stays with its caller.
 */
#pragma once

#include "parse.h"

/* The outer headers a shortcut strips: Ethernet, IPv4 without options,
 * UDP, VXLAN. A frame with outer IPv4 options takes the normal path
 * (ip_rcv_options may act on them). */
#define OUTER_LEN (ETH_HLEN + sizeof(struct iphdr) + sizeof(struct udphdr) + sizeof(struct vxlanhdr))

/* What decapsulation does to the inner ECN field (outer_ecn). */
#define OUTER_ECN_KEEP 0
#define OUTER_ECN_CE 1   /* outer CE onto an ECN-capable inner packet */
#define OUTER_ECN_ECT1 2 /* outer ECT(1) onto an inner ECT(0) */

#define ECN_NOT_ECT 0
#define ECN_ECT_1 1
#define ECN_ECT_0 2
#define ECN_CE 3

/* The kernel's csum16_add: a one's complement sum of two 16-bit words as
 * they lie in memory. */
static __always_inline __u16 csum16_add(__u16 csum, __u16 addend)
{
	__u16 res = csum + addend;

	return res + (res < addend);
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5];
}

/* ip_fast_csum()'s test: the header's words sum to 0xffff (ones'
 * complement), its checksum field included. */
static __always_inline int ipv4_csum_ok(const struct iphdr *ip)
{
	const __u16 *w = (const void *)ip;
	__u32 sum = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

/* Fold a ones' complement sum to 16 bits. */
static __always_inline __u32 csum_fold64(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u32)sum;
}

/* Datagrams longer than this many bytes after the outer IPv4 header are
 * not checksummed here (and take the normal path): more than a non-frags
 * XDP frame holds. */
#define OUTER_CSUM_CHUNK 256
#define OUTER_CSUM_CHUNKS 16

/* Add the bytes [*p, *p + n) to *sum if they lie within the frame. */
#define CSUM_STEP(n)                                           \
	do {                                                   \
		if (p + (n) <= data_end) {                     \
			r = bpf_csum_diff(NULL, 0, p, (n), 0); \
			if (r < 0)                             \
				return 0;                      \
			sum += (__u32)r;                       \
			p += (n);                              \
		}                                              \
	} while (0)

/*
 * Is the outer UDP checksum of the frame [data, data_end) (outer headers
 * at their fixed offsets, the datagram running to data_end) right? As
 * udp_lib_checksum_complete verifies it before the VXLAN socket sees the
 * datagram: the ones' complement sum of the pseudo-header, the UDP header
 * and the payload is 0xffff. bpf_csum_diff returns the sum of its bytes as
 * they lie in memory (folded or not, by kernel version: the final fold
 * makes both the same), and so are the pseudo-header's words taken here.
 * Inlined into one global function per hook (the verifier checks its
 * branches once, not once per path of the program that calls it).
 */
static __always_inline int outer_udp_csum_ok(void *data, void *data_end)
{
	struct iphdr *ip = data + ETH_HLEN;
	struct udphdr *uh = (void *)(ip + 1);
	void *p = uh;
	const __u16 *a;
	__u64 sum;
	long r;

	if ((void *)(uh + 1) > data_end)
		return 0;
	a = (const void *)&ip->saddr;
	sum = (__u64)a[0] + a[1] + a[2] + a[3] + bpf_htons(IPPROTO_UDP) + uh->len;

#pragma unroll
	for (int i = 0; i < OUTER_CSUM_CHUNKS; i++) {
		if (p + OUTER_CSUM_CHUNK > data_end)
			break;
		r = bpf_csum_diff(NULL, 0, p, OUTER_CSUM_CHUNK, 0);
		if (r < 0)
			return 0;
		sum += (__u32)r;
		p += OUTER_CSUM_CHUNK;
	}
	CSUM_STEP(128);
	CSUM_STEP(64);
	CSUM_STEP(32);
	CSUM_STEP(16);
	CSUM_STEP(8);
	CSUM_STEP(4);
	if (p + 2 <= data_end) {
		sum += *(__u16 *)p;
		p += 2;
	}
	if (p + 1 <= data_end) {
		sum += *(__u8 *)p; /* the odd last byte, padded with a zero byte after it */
		p += 1;
	}
	if (p != data_end)
		return 0; /* longer than OUTER_CSUM_CHUNKS chunks */
	return csum_fold64(sum) == 0xffff;
}

/* An overlay frame's headers at OUTER_LEN's fixed offsets, up to the inner
 * IPv4 header. */
struct outer_hdrs {
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *uh;
	struct vxlanhdr *vx;
	struct ethhdr *ieth;
	struct iphdr *iip;
};

/* The headers of the frame at data, if all of them lie before data_end. */
static __always_inline int outer_at(void *data, void *data_end, struct outer_hdrs *o)
{
	o->eth = data;
	o->ip = data + ETH_HLEN;
	o->uh = (void *)(o->ip + 1);
	o->vx = (void *)(o->uh + 1);
	o->ieth = (void *)(o->vx + 1);
	o->iip = (void *)(o->ieth + 1);
	return (void *)(o->iip + 1) <= data_end;
}

/*
 * The kernel's checks of the outer headers that depend on them alone, for
 * a frame of len bytes whose headers outer_at found:
 *
 *   ip_rcv_core     IPv4 without options, header checksum right, total
 *                   length the frame's (the kernel trims what lies beyond;
 *                   a shortcut would hand it on)
 *   udp_rcv         UDP length the datagram's (trimmed otherwise)
 *   vxlan_rcv       flags exactly I, the VNI's reserved byte 0 (anything
 *                   else is dropped on a device without GBP or GPE)
 *
 * The outer UDP checksum is the caller's: how an skb says it was verified
 * differs from a bare XDP frame.
 */
static __always_inline int outer_ok(const struct outer_hdrs *o, __u32 len)
{
	if (o->ip->ihl != 5 || !ipv4_csum_ok(o->ip) || bpf_ntohs(o->ip->tot_len) != len - ETH_HLEN)
		return 0;
	if (bpf_ntohs(o->uh->len) != bpf_ntohs(o->ip->tot_len) - sizeof(struct iphdr))
		return 0;
	return o->vx->vx_flags == bpf_htonl(VXLAN_FLAG_VNI) && !(o->vx->vx_vni & bpf_htonl(0xff));
}

/*
 * IP_ECN_decapsulate (RFC 6040): outer CE on a Not-ECT inner packet is
 * dropped (0: the frame takes the normal path, where the kernel drops
 * it); outer CE marks an ECN-capable inner packet CE, outer ECT(1) turns
 * an inner ECT(0) into ECT(1) (*ecn, for inner_ecn once the shortcut is
 * taken).
 */
static __always_inline int outer_ecn(const struct outer_hdrs *o, __u32 *ecn)
{
	__u32 otos = o->ip->tos & ECN_CE, itos = o->iip->tos & ECN_CE;

	*ecn = OUTER_ECN_KEEP;
	if (itos == ECN_NOT_ECT)
		return otos != ECN_CE;
	if (otos == ECN_CE) {
		if (itos != ECN_CE)
			*ecn = OUTER_ECN_CE;
	} else if (otos == ECN_ECT_1 && itos == ECN_ECT_0) {
		*ecn = OUTER_ECN_ECT1;
	}
	return 1;
}

/* The inner IPv4 header's ECN as decapsulation leaves it (the kernel's
 * IP_ECN_set_ce and IP_ECN_set_ect1, checksum updated in place). */
static __always_inline void inner_ecn(struct iphdr *iip, __u32 ecn)
{
	if (ecn == OUTER_ECN_CE) {
		__u32 e = (iip->tos + 1) & ECN_CE; /* ECT(1): 2, ECT(0): 3 */

		iip->check = csum16_add(iip->check, (__u16)(bpf_htons(0xFFFB) + bpf_htons((__u16)e)));
		iip->tos |= ECN_CE;
	} else if (ecn == OUTER_ECN_ECT1) {
		iip->check = csum16_add(iip->check, bpf_htons(0x1));
		iip->tos ^= ECN_CE;
	}
}
