//go:build ignore

/*
 * xdp_gen: the in-kernel half of the udp_stress generator.
 *
 * Userspace hands BPF_PROG_RUN (BPF_F_TEST_XDP_LIVE_FRAMES) one pre-built
 * VXLAN frame (or, with `plain` set, a plain Ethernet/IPv4/UDP frame for
 * the native path); the kernel runs this program once per repetition on a
 * recycled copy of it. Each run stamps the next sequence number of the
 * chosen inner flow into the payload, sets that flow's ports, and redirects
 * the frame through a devmap into the sending underlay device, whose veth
 * peer receives it like a NIC would.
 *
 * Live-frame pages are recycled without being re-initialised, and a frame's
 * page comes back to the generator's pool from the receiver, which may have
 * written into it: a host that routes the inner packet (Flannel) decrements
 * its TTL, fixes its checksum and writes a new Ethernet header in place,
 * whose 16-byte aligned copy (the neighbour's cached header) also zeroes the
 * VNI's last byte. So every run writes all headers back from hdr, then
 * what differs between packets (sequence, both source ports). The frame
 * head the kernel keeps in the page is reused the same way unless a run
 * changes the frame's bounds, so every run also sets 4 bytes of metadata
 * (GEN_META, below). All runs of one program happen on the single generator thread,
 * so the plain (non-atomic) updates of the ARRAY maps below are race free.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "vxlan.h"

/* Metadata every generated frame carries (see the redirect below). */
#define GEN_META 4

char __license[] SEC("license") = "Dual MIT/GPL";

#define MAX_FLOWS 4096

/*
 * The frame userspace builds (frame.go mirrors these offsets): outer
 * Ethernet/IPv4/UDP/VXLAN, inner Ethernet/IPv4/UDP, then the payload, whose
 * first 8 bytes are the flow's sequence number (big endian).
 */
struct frame {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	struct vxlanhdr vxlan;
	struct ethhdr inner_eth;
	struct iphdr inner_ip;
	struct udphdr inner_udp;
	__be64 seq;
} __attribute__((packed));

/* The plain frame (plain = 1): no VXLAN, the outer UDP is the flow's. */
struct plain_frame {
	struct ethhdr eth;
	struct iphdr ip;
	struct udphdr udp;
	__be64 seq;
} __attribute__((packed));

/* Load-time settings (set from Go before loading; read-only afterwards). */
const volatile __u32 nr_flows = 1;    /* inner flows, 1..MAX_FLOWS */
const volatile __u32 run_len = 1;     /* consecutive packets per flow: 1 = round robin */
const volatile __u16 inner_sport = 0; /* flow i uses inner UDP source port inner_sport+i */
const volatile __u16 outer_sport = 0; /* flow i uses outer UDP source port outer_sport+i, the
                                       * per-flow entropy a VXLAN device derives from the inner flow */
const volatile __u8 plain = 0;        /* 1: struct plain_frame, flow i's UDP source port inner_sport+i */
/*
 * Pacer: packet spacing and token-bucket depth in ns << 8 (fixed point so a
 * rate like 3 Mpps is not rounded to 333 ns). interval_fp == 0: no pacing.
 */
const volatile __u64 interval_fp = 0;
const volatile __u64 burst_fp = 0;
/*
 * Packets per train: with pacing, packets leave in trains of this many back
 * to back, one train every interval_fp (which userspace scaled by train, so
 * the average rate stays), as a NIC that coalesces interrupts hands the
 * stack its frames. 1: evenly spaced.
 */
const volatile __u32 train = 1;
/*
 * Arrivals: 0 keeps the spacing above (evenly spaced packets or trains);
 * 1 makes it Poisson: the gap to the next packet (train) is interval_fp
 * times an exponential variate of mean 1, drawn from exp_q, so the average
 * rate stays. Poisson arrivals are what a receive queue sees from many
 * independent senders merged: they cluster by chance, and a queue forms
 * behind the clusters even when the average load leaves room.
 * exp_q holds EXP_Q quantiles of Exp(1) at the midpoints of EXP_Q equal
 * slices, in units of 1 / (1 << EXP_SHIFT), normalised by userspace
 * (gen.go: expQuantiles) to a mean of exactly 1. No floating point in BPF,
 * hence the table; its longest gap is 7.6 means.
 */
#define EXP_Q 1024
#define EXP_SHIFT 12
const volatile __u8 poisson = 0;
const volatile __u16 exp_q[EXP_Q] = {};
/*
 * The headers and sequence field as userspace built them: the first
 * sizeof(struct frame) bytes of the frame (a plain frame's are fewer), in
 * 8-byte words.
 */
/* copy_hdr writes whole words, which must cover every header byte; the
 * sequence right after them is written on every run anyway. */
_Static_assert(__builtin_offsetof(struct frame, seq) <= sizeof(struct frame) / 8 * 8, "struct frame: copy_hdr");
_Static_assert(__builtin_offsetof(struct plain_frame, seq) <= sizeof(struct plain_frame) / 8 * 8,
	       "struct plain_frame: copy_hdr");

#define HDR_WORDS ((sizeof(struct frame) + 7) / 8)
const volatile __u64 hdr[HDR_WORDS] = {};

/*
 * copy_hdr writes the whole 8-byte words of hdr that fit in len bytes to
 * the packet. Volatile loads, word by word: clang must not fold the
 * zero-initialised array into constants before userspace fills it.
 */
static __always_inline void copy_hdr(void *data, const int len)
{
	int i;

#pragma unroll
	for (i = 0; i < len / 8; i++)
		*(__u64 *)(data + 8 * i) = hdr[i];
}

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, __u32); /* ifindex of the sending underlay device (sender's netns) */
} tx_port SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_FLOWS);
	__type(key, __u32); /* flow index */
	__type(value, __u64); /* next sequence number of that flow */
} flow_seq SEC(".maps");

struct gen_state {
	__u64 pkt;     /* packets handed to the redirect so far: picks the flow */
	__u64 next_fp; /* pacer: earliest time (ns << 8) the next packet may leave; 0 = not started */
	__u64 start_ns; /* bpf_ktime_get_ns() of the first packet since userspace zeroed it */
	__u64 left;     /* pacer: packets of the current train still to send */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, struct gen_state);
} state SEC(".maps");

struct gen_stats {
	__u64 sent;  /* runs that ended in XDP_REDIRECT: the offered packets */
	__u64 held;  /* runs the pacer dropped because the packet was not due yet */
	__u64 error; /* runs dropped for any other reason (short frame, empty devmap, no room for GEN_META) */
	__u64 stall; /* times the pacer found itself more than burst_fp behind and forgave the backlog */
	__u64 late;  /* packets (first of a train) sent more than one interval behind their schedule: catch-up */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32); /* always 0 */
	__type(value, struct gen_stats);
} stats SEC(".maps");

SEC("xdp")
int xdp_gen(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct frame *f = data;
	struct gen_state *st;
	struct gen_stats *cnt;
	__u32 zero = 0, flow;
	__u64 *seq;
	int verdict = XDP_DROP;

	cnt = bpf_map_lookup_elem(&stats, &zero);
	st = bpf_map_lookup_elem(&state, &zero);
	if (!cnt || !st)
		return XDP_DROP;
	/* The verifier knows `plain` (frozen rodata), so each load keeps one
	 * of the two layouts' checks and stores. */
	if (plain) {
		if (data + sizeof(struct plain_frame) > data_end)
			goto out;
	} else if ((void *)(f + 1) > data_end) {
		goto out;
	}

	if (interval_fp && st->left) {
		/* The rest of a train leaves without waiting. */
		st->left--;
	} else if (interval_fp) {
		__u64 now = bpf_ktime_get_ns() << 8;
		__u64 next = st->next_fp;

		if (next == 0) {
			next = now;
		} else if (now < next) {
			/* Not due: drop this copy. A dropped live frame goes
			 * straight back to the page pool, so a wait step costs
			 * one run. */
			cnt->held++;
			return XDP_DROP;
		} else if (now - next > burst_fp) {
			/* The thread lost its core for a while (another task ran
			 * at a cond_resched): catch up at most burst_fp worth of
			 * packets, back to back, and forgive the rest. */
			next = now - burst_fp;
			cnt->stall++;
		}
		/* Behind by more than one interval: this packet leaves in a
		 * catch-up burst, closer to the previous one than the spacing
		 * the background was calibrated with. */
		if (now - next > interval_fp)
			cnt->late++;
		if (poisson)
			st->next_fp = next + ((interval_fp * exp_q[bpf_get_prandom_u32() & (EXP_Q - 1)]) >> EXP_SHIFT);
		else
			st->next_fp = next + interval_fp;
		st->left = train - 1;
	}

	/* A BPF_PROG_RUN call takes a while to set up before the first run:
	 * userspace measures the rate from here, not from the syscall. */
	if (!st->start_ns)
		st->start_ns = bpf_ktime_get_ns();

	flow = (__u32)((st->pkt / run_len) % nr_flows);
	seq = bpf_map_lookup_elem(&flow_seq, &flow);
	if (!seq)
		goto out;

	/* Typed stores instead of the packed members: one 8-byte and two
	 * 2-byte writes rather than byte-wise ones (unaligned packet access
	 * is fine on the architectures lanes runs on). The headers first,
	 * whatever a receiver left in this page. */
	if (plain) {
		copy_hdr(data, sizeof(struct plain_frame));
		*(__be64 *)(data + __builtin_offsetof(struct plain_frame, seq)) = bpf_cpu_to_be64(*seq);
		*(__be16 *)(data + __builtin_offsetof(struct plain_frame, udp.source)) = bpf_htons(inner_sport + flow);
	} else {
		copy_hdr(data, sizeof(struct frame));
		*(__be64 *)((void *)f + __builtin_offsetof(struct frame, seq)) = bpf_cpu_to_be64(*seq);
		*(__be16 *)((void *)f + __builtin_offsetof(struct frame, udp.source)) = bpf_htons(outer_sport + flow);
		*(__be16 *)((void *)f + __builtin_offsetof(struct frame, inner_udp.source)) = bpf_htons(inner_sport + flow);
	}

	/*
	 * Exactly GEN_META bytes of (zeroed) metadata leave with every frame.
	 * A live frame's page comes back from the receiver that freed it, and
	 * the kernel reuses the frame head stored in it as is unless this run
	 * changed the frame's bounds: a receiver's writes there (its own
	 * redirect rebuilds that head) then leave with the next frame. lanes'
	 * steer_xdp found a receiver's stale metadata on such frames, could
	 * add none of its own and stopped trusting its queue counts.
	 * Setting the metadata changes the bounds, so the head is rebuilt from
	 * this run's frame every time.
	 */
	{
		void *meta = (void *)(long)ctx->data_meta;
		void *start = (void *)(long)ctx->data;

		/* Not sent without: it would take the stale head along. */
		if (meta > start || bpf_xdp_adjust_meta(ctx, (int)(start - meta) - GEN_META))
			goto out;
		meta = (void *)(long)ctx->data_meta;
		if (meta + GEN_META > (void *)(long)ctx->data)
			goto out;
		*(__u32 *)meta = 0;
	}

	/* XDP_DROP, not XDP_ABORTED, when the devmap slot is empty. */
	verdict = bpf_redirect_map(&tx_port, 0, XDP_DROP);
	if (verdict == XDP_REDIRECT) {
		(*seq)++;
		st->pkt++;
		cnt->sent++;
		return verdict;
	}
out:
	cnt->error++;
	return verdict;
}
