//go:build ignore

/*
 * wire: the cable and interrupt line of the testbed's softirq NIC
 * (Config.NIC = "softirq").
 *
 * A NIC's driver polls its rings in NET_RX softirq on the core its
 * interrupt is routed to, in the same poll list as the later stages it
 * feeds (the VXLAN GRO cell, the backlog of a veth): the interleaved
 * polling PRISM's paper measured. A veth cannot be that NIC alone: it
 * schedules its peer's NAPI on the core that transmits, which is the
 * sender's. So in this mode each host's underlay veth ends in a wire
 * namespace, and this program, attached to both wire ends, forwards every
 * frame to the other wire end with XDP_REDIRECT. Each wire end's NAPI is
 * threaded and pinned to the receiving host's IRQ core, so the frame is
 * handed to the receiving underlay veth there, and the kernel schedules
 * that veth's NAPI as a softirq on the IRQ core: the wire thread plays the
 * hardware that DMAs the frame and raises the interrupt.
 *
 * peers maps a wire end's ifindex to the other end; frames for which it
 * has no entry (a wire end being set up) are dropped, as a cable with one
 * end unplugged drops them. The program never looks into a frame: the wire
 * carries whatever the hosts send, byte for byte.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char __license[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, 2);
	__type(key, __u32); /* ifindex of the wire end the frame came in on */
	__type(value, __u32); /* ifindex of the wire end it leaves by */
} peers SEC(".maps");

/*
 * Frames handed to the redirect ([0]) and dropped for want of a peer
 * ([1]), per CPU: a frame the wire lost would otherwise count against the
 * host being measured, so the one per-frame map update the wire does is
 * kept. [0] counts redirects taken, not frames delivered: one the
 * receiving veth then refuses (its ring full) is in [0], and in that
 * veth's own XDP transmit-error statistics.
 *
 * The wire's cost lands on the IRQ core, for every mode alike: besides
 * this program, the veth copies every skb-borne frame (TCP segments)
 * into a page of its own before XDP runs, as it does for any XDP program
 * (bench/xdppass.go measured it); so on this NIC vanilla already pays that
 * copy, and vanilla:xdp-pass adds nothing to compare.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&counts, &i);

	if (c)
		(*c)++;
}

SEC("xdp")
int wire(struct xdp_md *ctx)
{
	long act = bpf_redirect_map(&peers, ctx->ingress_ifindex, XDP_DROP);

	count(act == XDP_REDIRECT ? 0 : 1);
	return act;
}
