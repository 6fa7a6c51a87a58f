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

#include "outer.h"
#include "prio.h"

/* The outer UDP checksum of an XDP frame (outer_udp_csum_ok). A global
 * function, so the verifier checks its branches once, not once per path
 * of steer_xdp. */
__noinline int sync_udp_csum_ok(struct xdp_md *ctx)
{
	return outer_udp_csum_ok((void *)(long)ctx->data, (void *)(long)ctx->data_end);
}

/*
 * Would the kernel's own path deliver this frame, decapsulated, to the
 * container its inner destination MAC names? sync_dest has found the
 * destination; this checks the rest of what the kernel checks on the way,
 * from ip_rcv to the bridge, on the frame as it lies (the outer headers
 * at OUTER_LEN's fixed offsets):
 *
 *   outer_ok        ip_rcv_core's, udp_rcv's and vxlan_rcv's checks of
 *                   the headers themselves (outer.h)
 *   ip_rcv_core     Ethernet destination the underlay's own MAC (else
 *                   PACKET_OTHERHOST: dropped)
 *   route lookup    outer destination a local VTEP address (steer_sync_local)
 *   udp_rcv         checksum 0 (none) or right (verified before the VXLAN
 *                   socket sees the datagram: sync_udp_csum_ok)
 *   vxlan_rcv       the inner source a remote MAC of a static forwarding
 *                   entry, from its own VTEP (steer_sync_src: vxlan_snoop,
 *                   vxlan_set_mac)
 *   ECN (RFC 6040)  outer_ecn (*ecn, applied by sync_redirect once the
 *                   shortcut is taken)
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
	struct sync_local_key lk = {};
	struct sync_key sk = { .vni = ov->vni };
	struct outer_hdrs o;
	struct sync_local *loc;
	struct sync_src *src;

	if (ov->inner_off != OUTER_LEN || !outer_at(data, data_end, &o) || !outer_ok(&o, data_end - data))
		return NULL;
	lk.ifindex = ctx->ingress_ifindex;
	lk.addr = o.ip->daddr;
	loc = bpf_map_lookup_elem(&steer_sync_local, &lk);
	if (!loc || !mac_eq(o.eth->h_dest, loc->mac))
		return NULL;
	if (o.uh->check && !sync_udp_csum_ok(ctx))
		return NULL;
	__builtin_memcpy(sk.mac, o.ieth->h_source, sizeof(sk.mac));
	src = bpf_map_lookup_elem(&steer_sync_src, &sk);
	if (!src || src->vtep != o.ip->saddr)
		return NULL;
	if (!outer_ecn(&o, ecn))
		return NULL;
	return src;
}

/*
 * PRISM-sync: the host-side veth a high-priority frame may go to directly,
 * or 0. The control plane lists a (VNI, inner destination MAC) only where
 * the bridge forwards that MAC to that veth and nothing on the way could
 * act on the frame, until the deadline it renews and while no change it
 * watches came since it read that (steer_changes); a frame longer than the
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
	changes = bpf_map_lookup_elem(&steer_changes, &zero);
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

/* The inner IPv4 header's ECN as decapsulation leaves it (inner_ecn). */
static __always_inline void sync_ecn(struct xdp_md *ctx, __u32 ecn)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct iphdr *iip = data + OUTER_LEN + ETH_HLEN;

	if (ecn == OUTER_ECN_KEEP || (void *)(iip + 1) > data_end)
		return;
	inner_ecn(iip, ecn);
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
		/* Cannot fail for a frame sync_accept took (OUTER_LEN
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
