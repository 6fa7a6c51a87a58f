/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The shortcuts' change counter: a socket filter lanes agent attaches to
 * its netlink sockets subscribed to nftables and IPsec changes in the
 * namespaces of a shortcut's path. The kernel runs it for every
 * notification it sends them (netlink_broadcast), from the commit of the
 * change, before the process that made it gets its answer: each one voids
 * every PRISM-sync destination and fast path entry written before (maps.h,
 * steer_changes). It keeps the message whole for the agent, which
 * withdraws what it vouched for and reads the path again.
 */
#include "maps.h"

SEC("socket")
int steer_notify(struct __sk_buff *skb)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&steer_changes, &zero);

	if (n)
		__sync_fetch_and_add(n, 1);
	return -1; /* the whole message */
}
