/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The kernel types reorder.c touches, reduced to the members it reads or
 * writes. preserve_access_index makes every access a CO-RE relocation that
 * the loader resolves against the running kernel's BTF, so the offsets
 * here are never used: only names and types must match the kernel's.
 * Struct Qdisc_ops is the struct_ops value the loader translates member
 * by member (by name) into the kernel's layout.
 */
#pragma once

#include <linux/types.h>

struct sk_buff {
	unsigned int len;
	__u32 priority;
	char cb[48];
	unsigned char *head;
	unsigned int end;
	__u16 network_header;
} __attribute__((preserve_access_index));

struct skb_shared_info {
	unsigned short gso_segs;
} __attribute__((preserve_access_index));

struct qdisc_skb_cb {
	unsigned int pkt_len;
} __attribute__((preserve_access_index));

struct qdisc_skb_head {
	__u32 qlen;
} __attribute__((preserve_access_index));

struct gnet_stats_queue {
	__u32 backlog;
	__u32 drops;
} __attribute__((preserve_access_index));

struct Qdisc {
	__u32 limit;
	struct qdisc_skb_head q;
	struct gnet_stats_queue qstats;
} __attribute__((preserve_access_index));

struct bpf_sk_buff_ptr {
	struct sk_buff *skb;
} __attribute__((preserve_access_index));

struct nlattr;
struct netlink_ext_ack;

struct Qdisc_ops {
	char id[16];
	int (*enqueue)(struct sk_buff *skb, struct Qdisc *sch, struct sk_buff **to_free);
	struct sk_buff *(*dequeue)(struct Qdisc *sch);
	int (*init)(struct Qdisc *sch, struct nlattr *arg, struct netlink_ext_ack *extack);
	void (*reset)(struct Qdisc *sch);
	void (*destroy)(struct Qdisc *sch);
};

/* Open-coded iterators (kernel/bpf/bpf_iter.c), not in this libbpf's
 * headers. */
struct bpf_iter_num {
	__u64 __opaque[1];
} __attribute__((aligned(8)));

extern int bpf_iter_num_new(struct bpf_iter_num *it, int start, int end) __ksym;
extern int *bpf_iter_num_next(struct bpf_iter_num *it) __ksym;
extern void bpf_iter_num_destroy(struct bpf_iter_num *it) __ksym;

/* for (i = start; i < end; i++), verified once however many times it runs. */
#define mf_for(i, start, end)                                                                       \
	for (struct bpf_iter_num ___it __attribute__((cleanup(bpf_iter_num_destroy))),              \
	     *___p __attribute__((unused)) = (bpf_iter_num_new(&___it, (start), (end)), (void *)0); \
	     ({                                                                                     \
		     int *___t = bpf_iter_num_next(&___it);                                         \
		     (___t && ((i) = *___t, 1));                                                    \
	     });)

/* The BPF qdisc's kfuncs (net/sched/bpf_qdisc.c). */
extern void bpf_kfree_skb(struct sk_buff *skb) __ksym;
extern void bpf_qdisc_skb_drop(struct sk_buff *skb, struct bpf_sk_buff_ptr *to_free) __ksym;
extern void bpf_qdisc_watchdog_schedule(struct Qdisc *sch, __u64 expire, __u64 delta_ns) __ksym;
extern void bpf_qdisc_bstats_update(struct Qdisc *sch, const struct sk_buff *skb) __ksym;

#define NET_XMIT_SUCCESS 0x00
#define NET_XMIT_DROP 0x01
