/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * PRISM-sync's shortcut: a high-priority frame for a container the control
 * plane vouches for is checked as the kernel's own path would check it
 * (sync_accept: IPv4 and UDP checksums and lengths, local VTEP, VXLAN
 * flags, the source's static forwarding entry, ECN), decapsulated with its
 * outer ECN mark copied inward, and redirected to the container's
 * host-side veth through a devmap.
 */
#pragma once

#include "prio.h"

/* The outer headers the shortcut strips: Ethernet, IPv4 without options,
 * UDP, VXLAN. A frame with outer IPv4 options takes the normal path
 * (ip_rcv_options may act on them). */
#define SYNC_OUTER_LEN (ETH_HLEN + sizeof(struct iphdr) + sizeof(struct udphdr) + sizeof(struct vxlanhdr))

/* What decapsulation does to the inner ECN field (sync_accept). */
#define SYNC_ECN_KEEP 0
#define SYNC_ECN_CE 1   /* outer CE onto an ECN-capable inner packet */
#define SYNC_ECN_ECT1 2 /* outer ECT(1) onto an inner ECT(0) */

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

/* Frames longer than this many bytes after the outer IPv4 header are not
 * checksummed here (and take the normal path): more than a non-frags
 * XDP frame holds. */
#define SYNC_CSUM_CHUNK 256
#define SYNC_CSUM_CHUNKS 16

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
 * Is the outer UDP checksum (which sync_accept requires set: 0 is none) right?
 * As udp_lib_checksum_complete verifies it before the VXLAN socket sees
 * the datagram: the ones' complement sum of the pseudo-header, the UDP
 * header and the payload is 0xffff. The datagram runs to the end of the
 * frame (sync_accept has checked the lengths). bpf_csum_diff returns the
 * sum of its bytes as they lie in memory (folded or not, by kernel
 * version: the final fold makes both the same), and so are the
 * pseudo-header's words taken here. A global function, so the verifier
 * checks its branches once, not once per path of steer_xdp; the outer
 * headers lie at sync_accept's fixed offsets.
 */
__noinline int sync_udp_csum_ok(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
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
	for (int i = 0; i < SYNC_CSUM_CHUNKS; i++) {
		if (p + SYNC_CSUM_CHUNK > data_end)
			break;
		r = bpf_csum_diff(NULL, 0, p, SYNC_CSUM_CHUNK, 0);
		if (r < 0)
			return 0;
		sum += (__u32)r;
		p += SYNC_CSUM_CHUNK;
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
		return 0; /* longer than SYNC_CSUM_CHUNKS chunks */
	return csum_fold64(sum) == 0xffff;
}

/*
 * Would the kernel's own path deliver this frame, decapsulated, to the
 * container its inner destination MAC names? sync_dest has found the
 * destination; this checks the rest of what the kernel checks on the way,
 * from ip_rcv to the bridge, on the frame as it lies (the outer headers
 * at SYNC_OUTER_LEN fixed offsets):
 *
 *   ip_rcv_core     IPv4, no options, header checksum right, total length
 *                   the frame's (the kernel trims what lies beyond; the
 *                   shortcut would hand it on), Ethernet destination the
 *                   underlay's own MAC (else PACKET_OTHERHOST: dropped)
 *   route lookup    outer destination a local VTEP address (steer_sync_local)
 *   udp_rcv         UDP length the datagram's (trimmed otherwise); checksum
 *                   0 (none) or right (verified before the VXLAN socket
 *                   sees the datagram: udp_csum_ok)
 *   vxlan_rcv       flags exactly I, the VNI's reserved byte 0 (anything
 *                   else is dropped on a device without GBP or GPE, which
 *                   the planner requires); the inner source a remote MAC
 *                   of a static forwarding entry, from its own VTEP
 *                   (steer_sync_src: vxlan_snoop, vxlan_set_mac)
 *   ECN (RFC 6040)  outer CE on a Not-ECT inner packet is dropped; outer
 *                   CE marks an ECN-capable inner packet CE, outer ECT(1)
 *                   turns an inner ECT(0) into ECT(1) (*ecn, applied by
 *                   sync_redirect once the shortcut is taken)
 *
 * The rest of the path (netfilter, tc, the bridge's port states and
 * filters, the VXLAN device up) is the control plane's to vouch for before
 * it lists a destination. Returns the source's entry, or NULL: the frame
 * takes the normal path, whole, where the kernel decides.
 */
static __always_inline struct sync_src *sync_accept(struct xdp_md *ctx, const struct overlay *ov, __u32 *ecn)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	struct udphdr *uh = (void *)(ip + 1);
	struct vxlanhdr *vx = (void *)(uh + 1);
	struct ethhdr *ieth = (void *)(vx + 1);
	struct iphdr *iip = (void *)(ieth + 1);
	struct sync_local_key lk = {};
	struct sync_key sk = { .vni = ov->vni };
	struct sync_local *loc;
	struct sync_src *src;
	__u32 otos, itos;

	if (ov->inner_off != SYNC_OUTER_LEN || (void *)(iip + 1) > data_end)
		return NULL;
	if (ip->ihl != 5 || !ipv4_csum_ok(ip) || bpf_ntohs(ip->tot_len) != data_end - (void *)ip)
		return NULL;
	lk.ifindex = ctx->ingress_ifindex;
	lk.addr = ip->daddr;
	loc = bpf_map_lookup_elem(&steer_sync_local, &lk);
	if (!loc || !mac_eq(eth->h_dest, loc->mac))
		return NULL;
	if (bpf_ntohs(uh->len) != bpf_ntohs(ip->tot_len) - sizeof(*ip) || (uh->check && !sync_udp_csum_ok(ctx)))
		return NULL;
	if (vx->vx_flags != bpf_htonl(VXLAN_FLAG_VNI) || (vx->vx_vni & bpf_htonl(0xff)))
		return NULL;
	__builtin_memcpy(sk.mac, ieth->h_source, sizeof(sk.mac));
	src = bpf_map_lookup_elem(&steer_sync_src, &sk);
	if (!src || src->vtep != ip->saddr)
		return NULL;
	otos = ip->tos & ECN_CE;
	itos = iip->tos & ECN_CE;
	*ecn = SYNC_ECN_KEEP;
	if (itos == ECN_NOT_ECT) {
		if (otos == ECN_CE)
			return NULL;
	} else if (otos == ECN_CE) {
		if (itos != ECN_CE)
			*ecn = SYNC_ECN_CE;
	} else if (otos == ECN_ECT_1 && itos == ECN_ECT_0) {
		*ecn = SYNC_ECN_ECT1;
	}
	return src;
}

/*
 * PRISM-sync: the host-side veth a high-priority frame may go to directly,
 * or 0. The control plane lists a (VNI, inner destination MAC) only where
 * the bridge forwards that MAC to that veth and nothing on the way could
 * act on the frame, until the deadline it renews and while no change it
 * watches came since it read that (steer_sync_changes); a frame longer than the
 * container's MTU would be dropped by the veth, so it takes the batch
 * path (CNT_SYNC_MISS), and so does one the kernel would not deliver
 * (sync_accept, CNT_SYNC_REFUSED). *src and *ecn are sync_accept's.
 */
static __always_inline __u32 sync_dest(struct xdp_md *ctx, const struct overlay *ov, struct sync_src **src,
				       __u32 *ecn)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data + (ov->inner_off & 0xff); /* < 256: outer headers, IPv4 options at most */
	struct sync_key key = { .vni = ov->vni };
	struct sync_dest *d;
	__u32 zero = 0;
	__u64 *changes;

	if ((void *)(eth + 1) > data_end)
		return 0;
	__builtin_memcpy(key.mac, eth->h_dest, sizeof(key.mac));
	d = bpf_map_lookup_elem(&steer_sync, &key);
	if (!d || data_end - (void *)eth - ETH_HLEN > d->mtu) {
		count(STAGE_SPLIT, CNT_SYNC_MISS);
		return 0;
	}
	changes = bpf_map_lookup_elem(&steer_sync_changes, &zero);
	if (bpf_ktime_get_ns() >= d->deadline || !changes || *(volatile __u64 *)changes != d->changes) {
		count(STAGE_SPLIT, CNT_SYNC_EXPIRED);
		return 0;
	}
	*src = sync_accept(ctx, ov, ecn);
	if (!*src) {
		count(STAGE_SPLIT, CNT_SYNC_REFUSED);
		return 0;
	}
	return d->ifindex;
}

/* The inner IPv4 header's ECN as decapsulation leaves it (the kernel's
 * IP_ECN_set_ce and IP_ECN_set_ect1, checksum updated in place). */
static __always_inline void sync_ecn(struct xdp_md *ctx, __u32 ecn)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *iip = data + SYNC_OUTER_LEN + ETH_HLEN;

	if (ecn == SYNC_ECN_KEEP || (void *)(iip + 1) > data_end)
		return;
	if (ecn == SYNC_ECN_CE) {
		__u32 e = (iip->tos + 1) & ECN_CE; /* ECT(1): 2, ECT(0): 3 */

		iip->check = csum16_add(iip->check, (__u16)(bpf_htons(0xFFFB) + bpf_htons((__u16)e)));
		iip->tos |= ECN_CE;
	} else {
		iip->check = csum16_add(iip->check, bpf_htons(0x1));
		iip->tos ^= ECN_CE;
	}
}

/*
 * Strip the outer Ethernet/IPv4/UDP/VXLAN headers, as the VXLAN device
 * would, and hand the inner frame to the container's host-side veth: the
 * veth's transmit puts it on its peer's queue, whose NAPI runs next on
 * this core and takes it through inner IP and UDP/TCP to the socket.
 * The devmap is checked first, so a vanished veth leaves the frame whole
 * on the normal path; a redirect that still fails (the device went in
 * between) drops the frame, which then no longer is a valid overlay frame
 * (CNT_SYNC_DROPPED, as the drops after the redirect: steer_sync_xmit).
 * The source's seen stamp tells lanes agent which bridge forwarding
 * entries the shortcut keeps from being refreshed by learning.
 */
static __always_inline int sync_redirect(struct xdp_md *ctx, const struct overlay *ov, __u32 ifindex,
					 struct sync_src *src, __u32 ecn)
{
	long ret;

	if (!bpf_map_lookup_elem(&steer_sync_dev, &ifindex)) {
		count(STAGE_SPLIT, CNT_SYNC_MISS);
		return XDP_PASS;
	}
	sync_ecn(ctx, ecn);
	if (bpf_xdp_adjust_head(ctx, (int)(ov->inner_off & 0xff))) {
		/* Cannot fail for a frame sync_accept took (SYNC_OUTER_LEN
		 * before at least an inner IPv4 header); were it to, the
		 * frame would be whole but its ECN already set: dropped. */
		count(STAGE_SPLIT, CNT_SYNC_DROPPED);
		return XDP_DROP;
	}
	if (src)
		stamp_at(&src->seen);
	ret = bpf_redirect_map(&steer_sync_dev, ifindex, XDP_DROP);
	count(STAGE_SPLIT, ret == XDP_REDIRECT ? CNT_SYNC : CNT_SYNC_DROPPED);
	return ret;
}
