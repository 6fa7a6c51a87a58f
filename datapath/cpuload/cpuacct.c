//go:build ignore

/*
 * cpuacct: per-core time by class of task, taken from the scheduler's own
 * events, for Falcon's balancer.
 *
 * Falcon reads per-CPU busy time inside the kernel every 10 jiffies. From
 * user space the same figure costs a /proc/stat read per sample, plus the
 * run time of every receive kthread and SCHED_IDLE thread from their
 * /proc files, plus a walk of all of /proc now and then to find new ones:
 * a burst on one core once a second, on the IRQ core as likely as not,
 * where the NIC poll waits behind it. Here the kernel hands the time over
 * as it switches tasks, so a sample is one map read, and the figures are
 * in nanoseconds instead of /proc/stat's 10 ms ticks.
 *
 * acct_switch (tp_btf/sched_switch) charges the time since the last switch
 * on this core to the class of the task that ran: idle (the idle task),
 * rxk (a receive kthread: threaded NAPI "napi/...", cpumap "cpumap/..."),
 * yield (a SCHED_IDLE user thread: it gives the core up to anything, so
 * receive work would not wait for it) or other. That wall time includes
 * the interrupts and softirqs that ran on top of the task, so
 * acct_sirq_entry/acct_sirq_exit (tp_btf/softirq_entry, softirq_exit)
 * also charge each softirq's time to the class it interrupted; user space
 * takes it out of the class and counts it as softirq (what the kernel's
 * IRQ time accounting does for /proc/stat): a softirq on top of the idle
 * task is busy time, one on top of a SCHED_IDLE thread is not that
 * thread's.
 *
 * The time since the last switch is not charged yet: user space adds it
 * from `last` and `cls`, or a core that runs one task for seconds without
 * switching would look idle.
 *
 * acct_poll (tp_btf/napi_poll) counts, per core, the polls of the NAPI
 * instances user space names in nic_napis (the underlay NIC's) that found
 * frames, and the frames they took: frames per poll is how many frames a
 * poll found waiting, the NIC's queue depth as its poller saw it. Polls
 * that found nothing are not counted (a poller rescheduled on an empty
 * ring). Attached only by a sampler asked to watch a NIC.
 *
 * Consistency: user space copies each core's struct while that core may be
 * writing it. The writer bumps `begin` (the last field) first and copies
 * it into `end` (the first field) last; the kernel copies a per-CPU value
 * in ascending order, so a copy with end == begin saw no write in flight.
 */

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char __license[] SEC("license") = "Dual MIT/GPL";

/* Just the fields read, relocated against the running kernel's BTF
 * (CO-RE): no vmlinux.h needed. */
struct napi_struct {
	unsigned int napi_id;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	unsigned int flags;
	unsigned int policy;
	char comm[16];
} __attribute__((preserve_access_index));

#define PF_KTHREAD 0x00200000
#define SCHED_IDLE 5

/* Classes; keep in step with cls* in acct.go. */
enum {
	CLS_IDLE,
	CLS_OTHER,
	CLS_YIELD,
	CLS_RXK,
	NCLS,
};

struct acct {
	__u64 end;        /* == begin when no write was in flight */
	__u64 last;       /* ns (CLOCK_MONOTONIC) of the last switch; 0 before the first */
	__u64 cls;        /* class of the task running since last */
	__u64 wall[NCLS]; /* ns each class ran, interrupts included */
	__u64 sirq[NCLS]; /* ns of softirq on top of each class */
	__u64 sirq_start; /* softirq in progress since (ns), 0 none; not guarded */
	__u64 begin;      /* bumped before each write */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct acct);
} acct SEC(".maps");

/* The NAPI instances acct_poll counts, by NAPI id (ids are unique on the
 * host, across network namespaces). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} nic_napis SEC(".maps");

/* A filter in front of nic_napis: bit (id % 4096) is set for every id in
 * it (user space writes the bits after the ids, and may leave a bit of an
 * id it dropped). Every NAPI poll of the host runs acct_poll, and most are
 * not the NIC's: an array read turns those away, where a hash lookup
 * costs several times that. */
#define NAPI_BITS_WORDS 64

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NAPI_BITS_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} nic_napi_bits SEC(".maps");

/* Each core's polls of those instances that found frames, and the frames.
 * Two counters a core alone bumps: a copy may see one bumped and not the
 * other, one poll's worth in thousands per sample. The win_ fields are the
 * wake's window (nic_wake), the core's alone too. */
struct nic_poll {
	__u64 polls;
	__u64 frames;
	__u64 win_start;  /* ns (CLOCK_MONOTONIC) the window began */
	__u64 win_polls;  /* polls and frames in it */
	__u64 win_frames;
	__u64 win_gen;    /* the arming (nic_wake.gen) the window belongs to */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nic_poll);
} nic_polls SEC(".maps");

/*
 * The wake: armed by user space (gen non-zero, a new value per arming;
 * written only there), acct_poll judges the counted polls of core cpu
 * (WAKE_ANY_CPU: every core's, each apart) in windows of window_ns, and
 * sends one record to nic_wake_rb for each window whose polls (at least
 * min_polls) found depth hundredths of a frame or more each, on average:
 * lanes agent samples slowly while PRISM stands aside and this wakes it
 * when the NIC's queue deepens. A window is judged at the first counted
 * poll after it ends (one on an idle NIC waits for the next poll, which
 * is the first frame that could need the queues). Disarmed, it costs one
 * lookup a counted poll. The ring buffer needs Linux 5.8, as the object
 * does as a whole.
 */
#define WAKE_ANY_CPU 0xffffffffu

struct nic_wake {
	__u64 window_ns;
	__u32 gen;
	__u32 depth;
	__u32 cpu;
	__u32 min_polls;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nic_wake);
} nic_wake SEC(".maps");

struct nic_wake_rec {
	__u32 gen;
	__u32 cpu;
	__u64 polls;
	__u64 frames;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} nic_wake_rb SEC(".maps");

#define barrier() asm volatile("" ::: "memory")

static __always_inline struct acct *mine(void)
{
	__u32 k = 0;
	return bpf_map_lookup_elem(&acct, &k);
}

static __always_inline __u64 classify(struct task_struct *t)
{
	if (t->pid == 0)
		return CLS_IDLE;
	if (t->flags & PF_KTHREAD) {
		/* The kthread's name is set before it first runs. */
		const char *c = t->comm;
		if (c[0] == 'n' && c[1] == 'a' && c[2] == 'p' && c[3] == 'i' && c[4] == '/')
			return CLS_RXK;
		if (c[0] == 'c' && c[1] == 'p' && c[2] == 'u' && c[3] == 'm' && c[4] == 'a' &&
		    c[5] == 'p' && c[6] == '/')
			return CLS_RXK;
		return CLS_OTHER;
	}
	return t->policy == SCHED_IDLE ? CLS_YIELD : CLS_OTHER;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(acct_switch, _Bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct acct *a = mine();
	if (!a)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 seq = a->begin + 1;

	__u64 c = a->cls;

	a->begin = seq;
	barrier();
	if (a->last && now > a->last && c < NCLS)
		a->wall[c] += now - a->last;
	a->last = now;
	a->cls = classify(next);
	barrier();
	a->end = seq;
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(acct_sirq_entry, unsigned int vec)
{
	struct acct *a = mine();
	if (a)
		a->sirq_start = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(acct_sirq_exit, unsigned int vec)
{
	struct acct *a = mine();
	if (!a || !a->sirq_start)
		return 0; /* attached while this softirq ran */
	__u64 now = bpf_ktime_get_ns();
	__u64 start = a->sirq_start;
	__u64 seq = a->begin + 1;
	__u64 c = a->cls;

	a->sirq_start = 0;
	if (!a->last || now <= start || c >= NCLS)
		return 0; /* no switch seen yet: the class is unknown */
	a->begin = seq;
	barrier();
	a->sirq[c] += now - start;
	barrier();
	a->end = seq;
	return 0;
}

SEC("tp_btf/napi_poll")
int BPF_PROG(acct_poll, struct napi_struct *napi, int work, int budget)
{
	__u32 id = napi->napi_id;
	__u32 k = 0, cpu, word = (id / 64) % NAPI_BITS_WORDS;
	__u64 *bits;
	struct nic_poll *p;
	struct nic_wake *w;
	__u64 now;

	if (work <= 0)
		return 0;
	bits = bpf_map_lookup_elem(&nic_napi_bits, &word);
	if (!bits || !(*bits & (1ull << (id % 64))) || !bpf_map_lookup_elem(&nic_napis, &id))
		return 0;
	p = bpf_map_lookup_elem(&nic_polls, &k);
	if (!p)
		return 0;
	p->polls++;
	p->frames += work;

	w = bpf_map_lookup_elem(&nic_wake, &k);
	if (!w || !w->gen)
		return 0;
	cpu = bpf_get_smp_processor_id();
	if (w->cpu != WAKE_ANY_CPU && w->cpu != cpu)
		return 0;
	now = bpf_ktime_get_ns();
	if (p->win_gen != w->gen) {
		/* A new arming: what an earlier one counted is not this one's. */
		p->win_gen = w->gen;
		p->win_start = now;
		p->win_polls = 0;
		p->win_frames = 0;
	}
	p->win_polls++;
	p->win_frames += work;
	if (now - p->win_start < w->window_ns)
		return 0;
	if (p->win_polls >= w->min_polls && p->win_frames * 100 >= (__u64)w->depth * p->win_polls) {
		struct nic_wake_rec r = { .gen = w->gen, .cpu = cpu, .polls = p->win_polls, .frames = p->win_frames };

		bpf_ringbuf_output(&nic_wake_rb, &r, sizeof(r), 0);
	}
	p->win_start = now;
	p->win_polls = 0;
	p->win_frames = 0;
	return 0;
}
