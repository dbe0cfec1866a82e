// SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0)
//
// profcol on-CPU sampler: a perf_event program attached to one software
// cpu-clock event per online CPU. For every sample it copies pid, tid, cpu,
// CLOCK_MONOTONIC time, comm and the kernel and user call stacks into one
// variable-length record in a BPF ring buffer.
//
// Design rules (see docs/arch-ebpf.md):
//  * No CO-RE relocations and no BTF-defined maps: the object carries no
//    .BTF at all, so the loader never needs /sys/kernel/btf/vmlinux.
//  * Stacks are copied into the record with bpf_get_stack, so no stack is
//    ever lost to a stack-map hash collision; every other loss (full ring
//    buffer, stack walk errors) is counted in the per-CPU `stats` map.
//  * Wakeups are rare: records are written with BPF_RB_NO_WAKEUP and the
//    reader drains on its own timer; only when the ring is over a quarter
//    full do we force a wakeup so bursts are not dropped.
//
// The record layout is mirrored by `profcol_ebpf::SampleHeader` (Rust).

#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

#define MAX_STACK_DEPTH 127 /* kernel.perf_event_max_stack default */
#define TASK_COMM_LEN 16

/* Counter slots in the `stats` map; mirrored by profcol_ebpf::Stat. */
enum stat {
	STAT_SAMPLES = 0,       /* records written to the ring buffer */
	STAT_LOST_RINGBUF = 1,  /* records dropped: ring buffer full */
	STAT_KSTACK_ERR = 2,    /* bpf_get_stack(kernel) failed */
	STAT_USTACK_ERR = 3,    /* bpf_get_stack(user) failed */
	STAT_IDLE = 4,          /* samples of the idle task, skipped */
	STAT_FILTERED = 5,      /* samples of pids not in pid_filter */
	STAT_NO_SCRATCH = 6,    /* scratch lookup failed (never expected) */
	STAT_MAX = 8,
};

struct sample {
	__u64 ktime_ns;          /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 pid;               /* tgid */
	__u32 tid;
	__u32 cpu;
	__u16 kstack_len;        /* frames in ips[0 .. kstack_len) */
	__u16 ustack_len;        /* frames in ips[kstack_len .. +ustack_len) */
	char comm[TASK_COMM_LEN];
	__u64 ips[2 * MAX_STACK_DEPTH];
};

#define SAMPLE_HEADER_SIZE (__builtin_offsetof(struct sample, ips))

/* Read-only configuration, set by the loader before load (.rodata). */
const volatile __u32 cfg_max_stack_depth = MAX_STACK_DEPTH;
const volatile __u32 cfg_exclude_idle = 1;
const volatile __u32 cfg_filter_pids = 0;

/* Legacy map definitions: no BTF needed to create them. */
struct bpf_map_def {
	unsigned int type;
	unsigned int key_size;
	unsigned int value_size;
	unsigned int max_entries;
	unsigned int map_flags;
};

/* Sized by the loader (ring_buffer_size); 1 MiB here as a default. */
struct bpf_map_def SEC("maps") events = {
	.type = BPF_MAP_TYPE_RINGBUF,
	.key_size = 0,
	.value_size = 0,
	.max_entries = 1 << 20,
};

struct bpf_map_def SEC("maps") stats = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u64),
	.max_entries = STAT_MAX,
};

struct bpf_map_def SEC("maps") scratch = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct sample),
	.max_entries = 1,
};

/* tgid -> 1 for the `pids` option; consulted only when cfg_filter_pids. */
struct bpf_map_def SEC("maps") pid_filter = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u8),
	.max_entries = 1024,
};

static __always_inline void count(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &slot);
	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

SEC("perf_event")
int profcol_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 tid = (__u32)id;
	__u32 zero = 0;

	if (tid == 0 && cfg_exclude_idle) {
		count(STAT_IDLE);
		return 0;
	}
	if (cfg_filter_pids && !bpf_map_lookup_elem(&pid_filter, &tgid)) {
		count(STAT_FILTERED);
		return 0;
	}

	struct sample *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s) {
		count(STAT_NO_SCRATCH);
		return 0;
	}

	s->ktime_ns = bpf_ktime_get_ns();
	s->pid = tgid;
	s->tid = tid;
	s->cpu = bpf_get_smp_processor_id();
	bpf_get_current_comm(s->comm, sizeof(s->comm));

	__u32 depth = cfg_max_stack_depth;
	if (depth > MAX_STACK_DEPTH)
		depth = MAX_STACK_DEPTH;
	if (depth == 0)
		depth = 1;

	long kbytes = bpf_get_stack(ctx, s->ips, depth * sizeof(__u64), 0);
	__u32 kn = 0;
	if (kbytes < 0)
		count(STAT_KSTACK_ERR);
	else
		kn = (__u64)kbytes / sizeof(__u64);
	if (kn > MAX_STACK_DEPTH)
		kn = MAX_STACK_DEPTH;

	long ubytes = bpf_get_stack(ctx, &s->ips[kn], depth * sizeof(__u64),
				    BPF_F_USER_STACK);
	__u32 un = 0;
	if (ubytes < 0)
		count(STAT_USTACK_ERR);
	else
		un = (__u64)ubytes / sizeof(__u64);
	if (un > MAX_STACK_DEPTH)
		un = MAX_STACK_DEPTH;

	s->kstack_len = kn;
	s->ustack_len = un;

	__u64 size = SAMPLE_HEADER_SIZE + ((__u64)kn + un) * sizeof(__u64);
	if (size > sizeof(*s))
		size = sizeof(*s);

	/* Wake the reader only when the ring is over a quarter full; otherwise
	 * it drains on its own timer. */
	__u64 flags = BPF_RB_NO_WAKEUP;
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 ring = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);
	if (avail + size > ring / 4)
		flags = BPF_RB_FORCE_WAKEUP;

	if (bpf_ringbuf_output(&events, s, size, flags))
		count(STAT_LOST_RINGBUF);
	else
		count(STAT_SAMPLES);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
