//go:build ignore

/*
 * reorder: MFLOW's in-order micro-flow reassembly as a BPF qdisc (struct_ops
 * Qdisc_ops, Linux >= 6.16 with CONFIG_NET_SCH_BPF), at the root of a
 * container's host-side veth: the first point every split core's path to
 * the container shares.
 *
 * The steering datapath cuts an elephant into micro-flows of `batch`
 * consecutive frames and hands each to the next split core; each core runs
 * its micro-flows through the stack in order, but the cores race each
 * other. The tag in skb->priority (mflow_tag.h) says which flow and which
 * micro-flow a frame belongs to. Per flow, frames of micro-flow k+1 are
 * held until micro-flow k is complete, MFLOW's merge:
 *
 *   - m is the flow's merging counter: the micro-flow being released. A
 *     frame of m passes while nothing of the flow is held (in order, no
 *     extra work); a frame of a later micro-flow is held in that
 *     micro-flow's window (WINDOWS per flow, a ring by sequence number).
 *   - m is complete when `batch` frames of it were counted (GRO segments:
 *     an skb counts gso_segs), or, MFLOW's own rule, when the split core
 *     that carried m has since delivered one of its later micro-flows
 *     (each split core runs its micro-flows in order, so nothing more of m
 *     can come; the splitter deals them round robin by sequence number,
 *     so the micro-flows of one residue m % ncores share a core: the core
 *     the qdisc runs on is not it, when a GRO cell's NAPI thread runs
 *     elsewhere).
 *     Then m advances and the next micro-flow's held frames are released,
 *     in the order they came. The per-core rule holds only for flows GRO
 *     does not hold back: for TCP, GRO on a split core passes a segment it
 *     must not hold (PSH, say) up at once, ahead of one of the previous
 *     micro-flow's it still holds (their metadata differs, so they are
 *     not one GRO flow). So it applies to UDP flows none of whose frames
 *     came merged (UDP GRO off, the default); the others complete by
 *     count, or by the watchdog after a loss.
 *   - A watchdog skips a gap: when m has not completed within timeout of
 *     the flow starting to hold (or of its last progress), m jumps to the
 *     next micro-flow with held frames (counted in gaps). Frames of a
 *     skipped micro-flow that come later pass at once (late).
 *   - Memory is bounded per flow (flow_limit held frames), in all
 *     (total_limit) and per micro-flow (win_slots): at a limit the oldest
 *     gap is skipped as by the watchdog (counted in overflows), so what is
 *     held leaves in order instead of being dropped.
 *   - Frames without a tag (mice, unsplit flows, other traffic) go straight
 *     to a FIFO, which is dequeued first: a frame of a tagged flow enters
 *     the FIFO only while nothing of its flow is stored, so nothing the
 *     flow stored earlier can be overtaken through it.
 *
 * Enqueue and dequeue run under the qdisc's lock (a BPF qdisc is never
 * lockless), so the state needs no atomics; the counters are plain adds.
 * Held skbs live as referenced kptrs in array-map slots (a FIFO ring, and
 * per flow WINDOWS rings of win_slots); reset frees whatever is left.
 *
 * Flows (the tag's flow and generation bits, so a reloaded splitter's flow
 * is a new one) take slots by their flow bits, the next free slot when
 * that one is another flow's; a slot is free again once its flow stored
 * nothing for a second.
 *
 * One loaded copy serves one device: its maps are the one qdisc's state,
 * and init refuses a second instance.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "qdisc.h"
#include "mflow_tag.h"

char __license[] SEC("license") = "Dual MIT/GPL";

#define WINDOWS 16     /* micro-flows of one flow stored at once; a power of 2 */
#define MAX_FLOWS 64   /* flow slots at most (the ready set is a 64-bit mask) */
#define MAX_CORES 64   /* cores the per-core rule follows; others count frames only */
#define FAR 1024       /* a sequence this far from the flow's restarts it */
#define IDLE_NS 1000000000ull /* a flow slot idle this long goes to another flow */
#define WATCHDOG_SLACK_NS 100000ull

/* Sizes fixed at load (the maps' max_entries follow them); powers of 2. */
volatile const __u32 flow_slots = 16; /* flow slots (at most MAX_FLOWS) */
volatile const __u32 win_slots = 512; /* frames one micro-flow may hold */
volatile const __u32 fifo_slots = 1024;
/* Diagnostics, off unless lanes asks (the verifier drops the code then):
 * count the tagged frames dequeued behind a later micro-flow of their
 * flow (check_out). */
volatile const __u32 self_check = 0;

/* Set by lanes, read per packet. */
struct mf_config {
	__u32 batch;       /* frames per micro-flow (the splitter's) */
	__u32 ncores;      /* split cores: a new flow's first micro-flows race over them */
	__u64 timeout_ns;  /* the watchdog */
	__u32 flow_limit;  /* frames held per flow */
	__u32 total_limit; /* frames held in all */
	__u32 self_check;  /* the load-time self_check, for lanes to read back */
	__u32 pad;
};

struct mf_counters {
	__u64 passed;     /* frames without a tag: straight to the FIFO */
	__u64 in_order;   /* tagged frames of the micro-flow being released, nothing held: straight through */
	__u64 held;       /* tagged frames held behind an earlier micro-flow */
	__u64 queued;     /* tagged frames of a released micro-flow queued behind their flow's stored frames */
	__u64 released;   /* held frames released in order */
	__u64 gaps;       /* gaps skipped by the watchdog */
	__u64 overflows;  /* gaps skipped because a limit was reached */
	__u64 late;       /* frames of a micro-flow already skipped or gone: passed as they came */
	__u64 drops;      /* frames dropped: the FIFO full */
	__u64 collisions; /* tagged frames passed untagged: every flow slot is another flow's, in use */
	__u64 restarts;   /* flow slots started over (a far sequence jump, or taken from an idle flow) */
	__u64 held_max;   /* the most frames held at once */
	__u64 by_count;   /* micro-flows completed by their frame count */
	__u64 by_core;    /* micro-flows completed because their core moved on */
	__u64 backward;   /* self_check: tagged frames dequeued behind a later micro-flow of their flow */
};

struct window {
	__u32 head; /* frames taken out (ring position) */
	__u32 tail; /* frames put in */
	__u32 segs; /* frames counted, stored or not (GRO segments) */
	__u32 pad;
};

/*
 * A flow's state. Windows hold micro-flows o..o+WINDOWS-1 by sequence
 * number (index seq % WINDOWS); o <= m. Micro-flows o..m are released
 * (dequeued from o on); those after m are held.
 */
struct flow {
	__u32 id; /* the tag's flow and generation bits | FLOW_USED; 0: free */
	__u16 m;
	__u16 o;
	__u32 stored; /* frames in the windows */
	__u32 held;   /* frames in windows after m */
	__u64 deadline; /* the watchdog's, while held */
	__u64 last_ns;
	__u64 cores_seen; /* split cores whose last[] is set */
	__u32 merged;     /* GRO merged some of its frames: the per-core rule is off */
	__u32 udp;        /* a UDP flow: the per-core rule may apply */
	struct window win[WINDOWS];
	__u16 last[MAX_CORES]; /* per split core: the latest micro-flow of its that came */
};

#define FLOW_USED 1u

/* The qdisc's own state. */
struct mf_qstate {
	__u32 fifo_head;
	__u32 fifo_tail;
	__u64 ready; /* flows with released frames to dequeue */
	__u32 rr;    /* where the next search of ready starts */
	__u32 held;  /* frames held, all flows */
	__u32 active; /* an instance exists */
	__u32 pad;
};

struct skb_slot {
	struct sk_buff __kptr *skb;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct mf_config);
	__uint(max_entries, 1);
} mf_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct mf_counters);
	__uint(max_entries, 1);
} mf_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct mf_qstate);
	__uint(max_entries, 1);
} mf_queue SEC(".maps");

/* self_check: per flow bits, the latest micro-flow dequeued. */
struct out_seen {
	__u32 id; /* the tag's flow and generation bits | FLOW_USED; 0: none yet */
	__u16 seq;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct out_seen);
	__uint(max_entries, MAX_FLOWS);
} mf_out SEC(".maps");

/* max_entries of the next three are set at load from the sizes above. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct flow);
	__uint(max_entries, 16);
} mf_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct skb_slot);
	__uint(max_entries, 1024);
} mf_fifo SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct skb_slot);
	__uint(max_entries, 16 * WINDOWS * 512);
} mf_held SEC(".maps");

static __always_inline __s16 sdiff(__u16 a, __u16 b)
{
	return (__s16)(__u16)(a - b);
}

static __always_inline struct window *win_of(struct flow *f, __u16 seq)
{
	return &f->win[seq & (WINDOWS - 1)];
}

static __always_inline __u32 qdisc_pkt_len(const struct sk_buff *skb)
{
	return ((struct qdisc_skb_cb *)skb->cb)->pkt_len;
}

/* Frames an skb stands for: a GRO skb counts its segments. */
static __always_inline __u32 skb_segs(const struct sk_buff *skb)
{
	struct skb_shared_info *sh = (void *)(skb->head + skb->end);
	__u16 segs = 0;

	bpf_probe_read_kernel(&segs, sizeof(segs), &sh->gso_segs);
	return segs > 1 ? segs : 1;
}

/* Whether an skb (data at its Ethernet header, network header set: an
 * IPv4 frame of a split flow) carries UDP. */
static __always_inline __u32 skb_udp(const struct sk_buff *skb)
{
	__u8 proto = 0;

	bpf_probe_read_kernel(&proto, sizeof(proto), skb->head + skb->network_header + 9);
	return proto == 17; /* IPPROTO_UDP */
}

static __always_inline void zero_window(struct window *w)
{
	w->head = 0;
	w->tail = 0;
	w->segs = 0;
}

/* Start flow f over at micro-flow seq with nothing stored. */
static __always_inline void flow_start(struct flow *f, __u32 id, __u16 seq, __u32 udp, const struct mf_config *c,
				       __u64 now)
{
	int i;

	f->id = id;
	/* A new flow's first micro-flows race over the split cores: its
	 * first arrival may be any of them. */
	f->m = seq < c->ncores ? 0 : seq;
	f->o = f->m;
	f->stored = 0;
	f->held = 0;
	f->deadline = 0;
	f->last_ns = now;
	f->cores_seen = 0;
	f->merged = 0;
	f->udp = udp;
	mf_for(i, 0, WINDOWS)
		zero_window(&f->win[i & (WINDOWS - 1)]);
}

/*
 * The split core that carries micro-flow seq, as a label: the splitter
 * deals micro-flows round robin by sequence number (steer's mflow.h,
 * next_microflow, from a rotation per cut), so the micro-flows of one
 * residue seq % ncores share a core, whichever it is. Only while ncores is
 * a power of 2, so that the tag's 16-bit sequence keeps the rotation
 * across its wrap; NO_CORE otherwise.
 */
#define NO_CORE 0xffffffffu
static __always_inline __u32 split_core(__u16 seq, const struct mf_config *c)
{
	if (!c->ncores || c->ncores > MAX_CORES || (c->ncores & (c->ncores - 1)))
		return NO_CORE;
	return seq & (c->ncores - 1) & (MAX_CORES - 1);
}

/* Is micro-flow m complete: all its frames counted, or its split core has
 * gone on to a later micro-flow? */
static __always_inline int complete(struct flow *f, const struct mf_config *c, struct mf_counters *st)
{
	struct window *w = win_of(f, f->m);
	__u32 core;

	if (c->batch && w->segs >= c->batch) {
		st->by_count++;
		return 1;
	}
	core = split_core(f->m, c);
	if (!f->udp || f->merged || core == NO_CORE || !(f->cores_seen & (1ull << core)))
		return 0;
	if (sdiff(f->last[core & (MAX_CORES - 1)], f->m) <= 0)
		return 0;
	st->by_core++;
	return 1;
}

/* Move o past drained windows of micro-flows before m, freeing them for
 * micro-flows o + WINDOWS on. */
static __always_inline void settle(struct flow *f)
{
	struct window *w;
	int i;

	mf_for(i, 0, WINDOWS)
	{
		if (f->o == f->m)
			break;
		w = win_of(f, f->o);
		if (w->head != w->tail)
			break;
		zero_window(w);
		f->o++;
	}
}

/* m advances by one: the next micro-flow's held frames are released (the
 * caller settles o once it is done advancing). */
static __always_inline void release_next(struct flow *f, __u32 fi, struct mf_qstate *q, struct mf_counters *st,
					 const struct mf_config *c, __u64 now)
{
	struct window *w;
	__u32 n;

	f->m++;
	w = win_of(f, f->m);
	n = w->tail - w->head;
	if (n) {
		f->held -= n;
		q->held -= n;
		st->released += n;
	}
	f->deadline = f->held ? now + c->timeout_ns : 0;
	if (n || f->o != f->m)
		q->ready |= 1ull << (fi & (MAX_FLOWS - 1));
}

/* Release every micro-flow that is complete, in order. Micro-flow m + 1
 * must have a window (m + 1 - o < WINDOWS), or its frames would meet the
 * released ones of o in one ring. */
static __always_inline void advance(struct flow *f, __u32 fi, struct mf_qstate *q, struct mf_counters *st,
				    const struct mf_config *c, __u64 now)
{
	int i;

	mf_for(i, 0, WINDOWS)
	{
		if (sdiff(f->m + 1, f->o) >= WINDOWS || !complete(f, c, st))
			break;
		release_next(f, fi, q, st, c, now);
	}
	settle(f);
}

/* Give up on micro-flow m (lost, or a limit reached): m jumps to the next
 * micro-flow with held frames, which are released, then every one complete
 * after it. Only while something is held. */
static __always_inline void skip_gap(struct flow *f, __u32 fi, struct mf_qstate *q, struct mf_counters *st,
				     const struct mf_config *c, __u64 now)
{
	struct window *w;
	int i;

	mf_for(i, 0, WINDOWS)
	{
		if (!f->held || sdiff(f->m + 1, f->o) >= WINDOWS)
			break;
		release_next(f, fi, q, st, c, now);
		w = win_of(f, f->m);
		if (w->tail != w->head)
			break;
	}
	advance(f, fi, q, st, c, now);
}

/* Release everything held (a flow starting over): the stored frames drain
 * in order, then the flow restarts. */
static __always_inline void flush(struct flow *f, __u32 fi, struct mf_qstate *q, struct mf_counters *st,
				  const struct mf_config *c, __u64 now)
{
	int i;

	mf_for(i, 0, WINDOWS)
	{
		if (!f->held || sdiff(f->m + 1, f->o) >= WINDOWS)
			break;
		release_next(f, fi, q, st, c, now);
	}
	settle(f);
}

/* A frame of micro-flow seq came: its split core has got that far. */
static __always_inline void note_core(struct flow *f, __u16 seq, const struct mf_config *c)
{
	__u32 core = split_core(seq, c);

	if (core == NO_CORE)
		return;
	core &= MAX_CORES - 1;
	if (!(f->cores_seen & (1ull << core)) || sdiff(seq, f->last[core]) > 0)
		f->last[core] = seq;
	f->cores_seen |= 1ull << core;
}

/* A flow slot is free once nothing is stored in it and its flow sent
 * nothing for IDLE_NS. */
static __always_inline int slot_free(const struct flow *f, __u64 now)
{
	return !f->id || (!f->stored && now - f->last_ns >= IDLE_NS);
}

/*
 * The slot of the flow with tag id id whose home slot (by its flow bits)
 * home is another flow's: the slot that holds it, else the first free one
 * from home on, else NO_SLOT. Two flows whose bits share a home both get a
 * slot of their own while there are slots.
 */
#define NO_SLOT 0xffffffffu
static __always_inline __u32 find_slot(__u32 home, __u32 id, __u64 now)
{
	__u32 free = NO_SLOT, fi;
	struct flow *f;
	int i;

	mf_for(i, 0, flow_slots)
	{
		fi = (home + i) & (flow_slots - 1) & (MAX_FLOWS - 1);
		f = bpf_map_lookup_elem(&mf_flows, &fi);
		if (!f)
			continue;
		if (f->id == id)
			return fi;
		if (free == NO_SLOT && slot_free(f, now))
			free = fi;
	}
	return free;
}

enum dest {
	TO_FIFO,
	TO_WINDOW,
};

/*
 * Where a tagged frame goes, with the flow's state updated for it; for
 * TO_WINDOW *slot is its index in mf_held.
 */
static __always_inline enum dest place_tagged(const struct sk_buff *skb, __u32 tag, struct mf_qstate *q,
					      struct mf_counters *st, const struct mf_config *c, __u32 *slot)
{
	__u32 segs = skb_segs(skb);
	__u32 id = mflow_tag_id(tag) | FLOW_USED;
	__u32 fi = (tag >> MFLOW_TAG_FLOW_SHIFT) & (flow_slots - 1) & (MAX_FLOWS - 1);
	__u16 seq = mflow_tag_seq(tag);
	__u64 now = bpf_ktime_get_ns();
	struct window *w;
	struct flow *f;
	__s16 d;

	f = bpf_map_lookup_elem(&mf_flows, &fi);
	if (!f)
		return TO_FIFO;
	if (f->id != id) {
		fi = find_slot(fi, id, now);
		f = bpf_map_lookup_elem(&mf_flows, &fi);
		if (!f) {
			/* Every slot is another flow's, in use. */
			st->collisions++;
			return TO_FIFO;
		}
		if (f->id != id) {
			if (f->id)
				st->restarts++;
			flow_start(f, id, seq, skb_udp(skb), c, now);
		}
	}
	f->last_ns = now;

	d = sdiff(seq, f->o);
	if (d <= -FAR || d >= FAR) {
		/* The flow's sequence jumped (its split state restarted). */
		if (f->stored) {
			flush(f, fi, q, st, c, now);
			st->late++;
			return TO_FIFO;
		}
		st->restarts++;
		flow_start(f, id, seq, skb_udp(skb), c, now);
		d = 0;
	}
	if (d < 0) {
		/* Its micro-flow was skipped or has drained: too late to
		 * wait for. */
		st->late++;
		return TO_FIFO;
	}
	w = win_of(f, seq);
	if (d >= WINDOWS || (sdiff(seq, f->m) > 0 && (f->held >= c->flow_limit || q->held >= c->total_limit ||
						      w->tail - w->head >= win_slots))) {
		/* A limit: release the oldest gap's frames rather than hold
		 * more. */
		st->overflows++;
		skip_gap(f, fi, q, st, c, now);
		d = sdiff(seq, f->o);
		w = win_of(f, seq);
		if (d < 0 || d >= WINDOWS ||
		    (sdiff(seq, f->m) > 0 && (f->held >= c->flow_limit || q->held >= c->total_limit))) {
			/* Still no room for it (released frames not yet
			 * out, or other flows hold the total): it passes as
			 * it came. */
			st->late++;
			return TO_FIFO;
		}
	}

	note_core(f, seq, c);
	w->segs += segs;
	if (segs > 1)
		f->merged = 1;
	if (!f->stored && seq == f->m) {
		/* In order, nothing of the flow waiting: straight through. */
		st->in_order++;
		advance(f, fi, q, st, c, now);
		return TO_FIFO;
	}
	if (w->tail - w->head >= win_slots) {
		/* Released frames of its micro-flow fill the window (the
		 * device is not taking them): it passes as it came. */
		st->late++;
		advance(f, fi, q, st, c, now);
		return TO_FIFO;
	}
	*slot = (fi * WINDOWS + (seq & (WINDOWS - 1))) * win_slots + (w->tail & (win_slots - 1));
	w->tail++;
	f->stored++;
	if (sdiff(seq, f->m) > 0) {
		f->held++;
		q->held++;
		st->held++;
		if (q->held > st->held_max)
			st->held_max = q->held;
		if (!f->deadline)
			f->deadline = now + c->timeout_ns;
	} else {
		/* Behind stored frames of its flow, in order. */
		st->queued++;
		q->ready |= 1ull << (fi & (MAX_FLOWS - 1));
	}
	advance(f, fi, q, st, c, now);
	return TO_WINDOW;
}

SEC("struct_ops/mf_enqueue")
int BPF_PROG(mf_enqueue, struct sk_buff *skb, struct Qdisc *sch, struct bpf_sk_buff_ptr *to_free)
{
	__u32 zero = 0, idx = 0, tag = skb->priority, len = qdisc_pkt_len(skb);
	struct mf_qstate *q = bpf_map_lookup_elem(&mf_queue, &zero);
	struct mf_counters *st = bpf_map_lookup_elem(&mf_stats, &zero);
	struct mf_config *c = bpf_map_lookup_elem(&mf_cfg, &zero);
	enum dest to = TO_FIFO;
	struct skb_slot *slot;
	struct sk_buff *old;

	if (!q || !st || !c)
		goto drop;
	if (mflow_tagged(tag))
		to = place_tagged(skb, tag, q, st, c, &idx);
	else
		st->passed++;
	if (to == TO_FIFO) {
		if (q->fifo_tail - q->fifo_head >= fifo_slots) {
			st->drops++;
			goto drop;
		}
		idx = q->fifo_tail & (fifo_slots - 1);
		slot = bpf_map_lookup_elem(&mf_fifo, &idx);
		if (!slot)
			goto drop;
		q->fifo_tail++;
	} else {
		slot = bpf_map_lookup_elem(&mf_held, &idx);
		if (!slot)
			goto drop;
	}
	old = bpf_kptr_xchg(&slot->skb, skb);
	if (old)
		bpf_qdisc_skb_drop(old, to_free); /* never: a slot is empty until its turn comes round */
	sch->q.qlen++;
	sch->qstats.backlog += len;
	return NET_XMIT_SUCCESS;
drop:
	sch->qstats.drops++;
	bpf_qdisc_skb_drop(skb, to_free);
	return NET_XMIT_DROP;
}

/* The lowest set bit of x (not 0). */
static __always_inline __u32 lowest_bit(__u64 x)
{
	__u32 n = 0;

	if (!(x & 0xffffffffull)) {
		n += 32;
		x >>= 32;
	}
	if (!(x & 0xffff)) {
		n += 16;
		x >>= 16;
	}
	if (!(x & 0xff)) {
		n += 8;
		x >>= 8;
	}
	if (!(x & 0xf)) {
		n += 4;
		x >>= 4;
	}
	if (!(x & 0x3)) {
		n += 2;
		x >>= 2;
	}
	if (!(x & 0x1))
		n += 1;
	return n;
}

/* The next released frame of a ready flow, round robin over the flows. */
static __always_inline struct sk_buff *take_released(struct mf_qstate *q)
{
	__u64 rest;
	__u32 fi, idx;
	struct skb_slot *slot;
	struct sk_buff *skb;
	struct window *w;
	struct flow *f;

	rest = q->ready & ~((1ull << (q->rr & (MAX_FLOWS - 1))) - 1);
	fi = lowest_bit(rest ? rest : q->ready) & (MAX_FLOWS - 1);
	q->rr = fi + 1;
	f = bpf_map_lookup_elem(&mf_flows, &fi);
	if (!f) {
		q->ready &= ~(1ull << fi);
		return NULL;
	}
	w = win_of(f, f->o);
	if (w->head == w->tail) {
		q->ready &= ~(1ull << fi);
		return NULL;
	}
	idx = (fi * WINDOWS + (f->o & (WINDOWS - 1))) * win_slots + (w->head & (win_slots - 1));
	w->head++;
	f->stored--;
	settle(f);
	w = win_of(f, f->o);
	if (w->head == w->tail)
		q->ready &= ~(1ull << fi);
	slot = bpf_map_lookup_elem(&mf_held, &idx);
	if (!slot)
		return NULL;
	skb = bpf_kptr_xchg(&slot->skb, NULL);
	return skb;
}

/* The watchdog: skip the gap of every flow held past its deadline. Returns
 * the earliest deadline still pending (0: none). */
static __always_inline __u64 expire(struct mf_qstate *q, struct mf_counters *st, const struct mf_config *c, __u64 now)
{
	__u64 next = 0;
	struct flow *f;
	__u32 fi = 0;
	int i;

	mf_for(i, 0, flow_slots)
	{
		fi = i;
		f = bpf_map_lookup_elem(&mf_flows, &fi);
		if (!f || !f->held)
			continue;
		if (f->deadline <= now) {
			st->gaps++;
			skip_gap(f, fi, q, st, c, now);
		}
		if (f->held && (!next || f->deadline < next))
			next = f->deadline;
	}
	return next;
}

/*
 * self_check: is skb, leaving, behind a later micro-flow of its flow that
 * already left? The qdisc's merge rule says no, but for frames it passes
 * as they came (late) or unordered (collisions): a count above theirs is
 * disorder of the qdisc's own. A far jump is a restarted flow, not a step
 * back.
 */
static __always_inline void check_out(const struct sk_buff *skb, struct mf_counters *st)
{
	__u32 tag = skb->priority, key;
	struct out_seen *o;
	__u32 id;
	__s16 d;

	if (!mflow_tagged(tag))
		return;
	id = mflow_tag_id(tag) | FLOW_USED;
	key = (tag >> MFLOW_TAG_FLOW_SHIFT) & (MAX_FLOWS - 1);
	o = bpf_map_lookup_elem(&mf_out, &key);
	if (!o)
		return;
	d = sdiff(mflow_tag_seq(tag), o->seq);
	if (o->id == id && d < 0 && d > -FAR) {
		st->backward++;
		return;
	}
	o->id = id;
	o->seq = mflow_tag_seq(tag);
}

SEC("struct_ops/mf_dequeue")
struct sk_buff *BPF_PROG(mf_dequeue, struct Qdisc *sch)
{
	__u32 zero = 0, idx;
	struct mf_qstate *q = bpf_map_lookup_elem(&mf_queue, &zero);
	struct mf_counters *st;
	struct mf_config *c;
	struct sk_buff *skb = NULL;
	struct skb_slot *slot;
	__u64 next;

	if (!q)
		return NULL;
	if (q->fifo_head != q->fifo_tail) {
		idx = q->fifo_head & (fifo_slots - 1);
		q->fifo_head++;
		slot = bpf_map_lookup_elem(&mf_fifo, &idx);
		if (slot)
			skb = bpf_kptr_xchg(&slot->skb, NULL);
		if (skb)
			goto out;
	}
	if (!q->ready && q->held) {
		st = bpf_map_lookup_elem(&mf_stats, &zero);
		c = bpf_map_lookup_elem(&mf_cfg, &zero);
		if (!st || !c)
			return NULL;
		next = expire(q, st, c, bpf_ktime_get_ns());
		if (!q->ready) {
			if (next)
				bpf_qdisc_watchdog_schedule(sch, next, WATCHDOG_SLACK_NS);
			return NULL;
		}
	}
	/* A flow marked ready whose window turns out empty clears its bit:
	 * try the next. */
	if (q->ready) {
		skb = take_released(q);
		if (!skb && q->ready)
			skb = take_released(q);
		if (skb)
			goto out;
	}
	return NULL;
out:
	if (self_check) {
		st = bpf_map_lookup_elem(&mf_stats, &zero);
		if (st)
			check_out(skb, st);
	}
	sch->q.qlen--;
	sch->qstats.backlog -= qdisc_pkt_len(skb);
	bpf_qdisc_bstats_update(sch, skb);
	return skb;
}

SEC("struct_ops/mf_init")
int BPF_PROG(mf_init, struct Qdisc *sch, struct nlattr *opt, struct netlink_ext_ack *extack)
{
	__u32 zero = 0;
	struct mf_qstate *q = bpf_map_lookup_elem(&mf_queue, &zero);

	/* One instance per loaded copy: its maps are that qdisc's state. */
	if (!q || q->active)
		return -16; /* EBUSY */
	q->active = 1;
	sch->limit = fifo_slots;
	return 0;
}

/* Free every skb left in the slots of map m (slots..slots+n). */
static __always_inline void free_slots(void *m, __u32 n)
{
	struct skb_slot *slot;
	struct sk_buff *skb;
	__u32 idx;
	int i;

	mf_for(i, 0, n)
	{
		idx = i;
		slot = bpf_map_lookup_elem(m, &idx);
		if (!slot)
			continue;
		skb = bpf_kptr_xchg(&slot->skb, NULL);
		if (skb)
			bpf_kfree_skb(skb);
	}
}

SEC("struct_ops/mf_reset")
void BPF_PROG(mf_reset, struct Qdisc *sch)
{
	__u32 zero = 0, fi;
	struct mf_qstate *q = bpf_map_lookup_elem(&mf_queue, &zero);
	struct flow *f;
	int i;

	free_slots(&mf_fifo, fifo_slots);
	free_slots(&mf_held, flow_slots * WINDOWS * win_slots);
	mf_for(i, 0, flow_slots)
	{
		fi = i;
		f = bpf_map_lookup_elem(&mf_flows, &fi);
		if (f) {
			f->id = 0;
			f->stored = 0;
			f->held = 0;
		}
	}
	if (q) {
		q->fifo_head = 0;
		q->fifo_tail = 0;
		q->ready = 0;
		q->rr = 0;
		q->held = 0;
	}
	sch->q.qlen = 0;
	sch->qstats.backlog = 0;
}

SEC("struct_ops/mf_destroy")
void BPF_PROG(mf_destroy, struct Qdisc *sch)
{
	__u32 zero = 0;
	struct mf_qstate *q = bpf_map_lookup_elem(&mf_queue, &zero);

	/* reset ran before: nothing is held. */
	if (q)
		q->active = 0;
}

SEC(".struct_ops.link")
struct Qdisc_ops mflow_reorder = {
	.enqueue = (void *)mf_enqueue,
	.dequeue = (void *)mf_dequeue,
	.init = (void *)mf_init,
	.reset = (void *)mf_reset,
	.destroy = (void *)mf_destroy,
	.id = "lanes_mf",
};
