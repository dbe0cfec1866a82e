// SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0)
//
// profcol's BPF programs, in one object so they share the ring buffer:
//  * profcol_cpu_sample: a perf_event program attached to one software
//    cpu-clock event per online CPU. For every sample it copies pid, tid,
//    cpu, CLOCK_MONOTONIC time, comm and the kernel and user call stacks
//    into one variable-length record in a BPF ring buffer.
//  * profcol_uprobe: the same record for one call of a probed user
//    function (kind SAMPLE_PROBE, probe index from the attach cookie).
//  * profcol_off_cpu_switch / profcol_off_cpu: off-CPU time (off_cpu:,
//    loaded only when configured). On sched_switch (tp_btf) a sampled
//    thread leaving the CPU is noted with how it leaves; when it comes back
//    after at least the threshold its kernel stack is taken there, and at
//    its syscall's exit (raw tracepoint sys_exit, in its own context) its
//    user stack is walked by the same table and Python walkers as on-CPU
//    samples (their raw tracepoint copies, off_cpu_progs): a record of kind
//    SAMPLE_OFF_CPU with its time off CPU. No kprobe or fexit is needed.
//  * profcol_off_cpu_waking: sched_waking (tp_btf), run by the waker: when
//    the woken thread is followed and has waited the threshold already,
//    the waker's stacks (tp_btf copies of the walkers, waker_progs) become
//    a SAMPLE_WAKEUP record whose id the woken thread's record repeats.
//  * profcol_exec / profcol_exit: raw tracepoints on sched_process_exec and
//    sched_process_exit (no tracefs, no BTF) writing process events into
//    their own small ring buffer: process discovery for the receiver.
//  * `targets`: a sample of a process outside the selection is dropped
//    before any stack walk, by a verdict per cgroup v2 id (or per process)
//    the reader writes when the first sample of one asks for it.
//
// Design rules (see docs/ARCHITECTURE.md, "eBPF receiver (as built)"):
//  * No CO-RE relocations and no BTF-defined maps: the object carries no
//    .BTF at all, so the loader never needs /sys/kernel/btf/vmlinux.
//  * Stacks are copied into the record with bpf_get_stack, so no stack is
//    ever lost to a stack-map hash collision; every other loss (full ring
//    buffer, stack walk errors) is counted in the per-CPU `stats` map.
//  * Wakeups are rare: records are written with BPF_RB_NO_WAKEUP and the
//    reader drains on its own timer; only when the ring is over a quarter
//    full do we force a wakeup so bursts are not dropped.
//
// The record layouts are in record.h, mirrored by `profcol_ebpf::record`.

#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <asm/ptrace.h>

#include "record.h"

/* Counter slots in the `stats` map; mirrored by profcol_ebpf::Stat. */
enum stat {
	STAT_SAMPLES = 0,       /* records written to the ring buffer */
	STAT_LOST_RINGBUF = 1,  /* records dropped: ring buffer full */
	STAT_KSTACK_ERR = 2,    /* bpf_get_stack(kernel) failed */
	STAT_USTACK_ERR = 3,    /* bpf_get_stack(user) failed */
	STAT_IDLE = 4,          /* samples of the idle task, skipped */
	STAT_FILTERED = 5,      /* samples outside pid_filter or targets */
	STAT_NO_SCRATCH = 6,    /* scratch lookup failed (never expected) */
	STAT_PROBE_HITS = 7,    /* uprobe hits (written or not) */
	STAT_COUNTED = 8,       /* samples only counted in `counts` (no record) */
	STAT_COUNTS_FULL = 9,   /* not counted: `counts` full (record instead) */
	STAT_DYNAMIC_TEXT = 10, /* not counted: kernel frames outside kernel text */
	STAT_MAX = 11,
};

/* Read-only configuration, set by the loader before load (.rodata). */
const volatile __u32 cfg_max_stack_depth = MAX_STACK_DEPTH;
const volatile __u32 cfg_exclude_idle = 1;
const volatile __u32 cfg_filter_pids = 0;
/* Nonzero when `targets` selects what is sampled (target_selected). */
const volatile __u32 cfg_targets = 0;
/* profcol's own tgid: its calls of probed functions are not counted (and
 * cannot feed back into more events). */
const volatile __u32 cfg_self_tgid = 0;
/* Counting in the kernel: nonzero to count on-CPU samples per stack
 * in `counts` and write one record per stack while its key stays. */
const volatile __u32 cfg_count_in_kernel = 0;
/* The kernel's own text [start, end) (_stext.._etext): its names never
 * change, so a stack whose kernel frames all lie in it is named alike at
 * any time and may be counted. BPF programs, modules and trampolines lie
 * outside: their samples stay records with their own time. */
const volatile __u64 cfg_ktext_start = 0;
const volatile __u64 cfg_ktext_end = 0;
/* Which fields besides pid and stack split counts (COUNT_BY_*), as the
 * receiver's sample_attributes: a field no sample carries would only split
 * counts the reader merges again. */
const volatile __u32 cfg_count_by = 0;
/* Seed of the count key, random per load. */
const volatile __u64 cfg_count_seed = 0;
/* Slots of `count_slots` for counts (its last element is the next slot
 * never handed out). */
const volatile __u32 cfg_count_slots = 16384;

/* Off-CPU: a thread off CPU at least this long gets a record (0: off-CPU
 * programs not loaded); each switch-out is followed with this chance,
 * scaled to 2^32 - 1 (the sampled ones are decided before anything else). */
const volatile __u64 cfg_off_cpu_threshold_ns = 0;
const volatile __u32 cfg_off_cpu_probability = 0;
/* The kernel's interrupt entry text, [start, end) each (kallsyms'
 * __irqentry_text_* and __softirqentry_text_*; zeros: unknown). A wakeup
 * whose kernel stack passes through one came from an interrupt, not from
 * the thread it interrupted. */
const volatile __u64 cfg_irq_text_start = 0;
const volatile __u64 cfg_irq_text_end = 0;
const volatile __u64 cfg_softirq_text_start = 0;
const volatile __u64 cfg_softirq_text_end = 0;
/* try_to_wake_up's text [start, end) (kallsyms; zeros: unknown): a
 * waker's kernel stack starts there, the frames above it are the
 * tracepoint's and this program's own. */
const volatile __u64 cfg_wake_text_start = 0;
const volatile __u64 cfg_wake_text_end = 0;

/* count_key frames are hashed in blocks of this many (zeros past the end). */
#define KEY_BLOCK 16
#define KEY_BLOCKS ((MAX_RECORD_FRAMES + KEY_BLOCK - 1) / KEY_BLOCK)
/* `count_key` of a sample before it is counted: a kernel frame lies
 * outside the kernel's own text (set by fill_sample). */
#define KERNEL_TEXT_OUTSIDE 1

#define COUNT_BY_TID 1
#define COUNT_BY_COMM 2
#define COUNT_BY_CPU 4
#ifndef EEXIST
#define EEXIST 17
#endif

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

/* The record being made (and the walks' state, unwind.h and python.h),
 * one per CPU for each kind of program: uprobe and off-CPU programs run
 * in a thread's context, where an on-CPU sample (a hard interrupt) may
 * come between their steps. */
enum scratch_slot {
	SCRATCH_CPU = 0,
	SCRATCH_PROBE = 1,
	SCRATCH_OFF_CPU = 2,
	SCRATCH_WAKER = 3,
	SCRATCH_SLOTS = 4,
};
struct bpf_map_def SEC("maps") scratch = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct sample),
	.max_entries = SCRATCH_SLOTS,
};

/* Stacks counted in the kernel: count key -> its slot in `count_slots`.
 * Sized by the loader; the reader deletes a key when its stack goes idle.
 * Not preallocated: a node holds a few hundred stacks at a time, and the
 * kernel charges preallocated entries to the agent whether used or not.
 * An insert the kernel cannot allocate for (in NMI, its per-CPU free list
 * empty) leaves the sample a record of its own, as a full map does. */
struct bpf_map_def SEC("maps") counts = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u64),
	.value_size = sizeof(__u32),
	.max_entries = 16384,
	.map_flags = BPF_F_NO_PREALLOC,
};

/* The counts, by slot, memory-mapped by the reader: it reads them at a
 * report without a syscall. Element cfg_count_slots is the next slot never
 * handed out. A slot is the reader's again when it has deleted the slot's
 * key, read its last count a report later, zeroed it and pushed it into
 * `free_slots`. Sized by the loader (cfg_count_slots + 1). */
struct bpf_map_def SEC("maps") count_slots = {
	.type = BPF_MAP_TYPE_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u64),
	.max_entries = 16384 + 1,
	.map_flags = BPF_F_MMAPABLE,
};

/* Slots freed by the reader (zeroed), taken before new ones. */
struct bpf_map_def SEC("maps") free_slots = {
	.type = BPF_MAP_TYPE_QUEUE,
	.key_size = 0,
	.value_size = sizeof(__u32),
	.max_entries = 16384,
};

/* Exec and exit events; small, they are few and read promptly. */
struct bpf_map_def SEC("maps") proc_events = {
	.type = BPF_MAP_TYPE_RINGBUF,
	.key_size = 0,
	.value_size = 0,
	.max_entries = 1 << 18,
};

/* Exec/exit events lost because proc_events was full (slot 0). */
struct bpf_map_def SEC("maps") proc_event_lost = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u64),
	.max_entries = 1,
};

/* tgid -> 1 for the `pids` option; consulted only when cfg_filter_pids.
 * Sized by the loader (one entry without `pids`). */
struct bpf_map_def SEC("maps") pid_filter = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u8),
	.max_entries = 1024,
};

/* Verdicts of `targets`, written by the reader. */
#define TARGET_IN 1
#define TARGET_OUT 2
#define TARGET_ASKED 3      /* asked, no answer yet: dropped meanwhile */
#define TARGET_BY_PROCESS 4 /* the executable decides: see target_procs */

/* cgroup v2 id -> verdict. LRU: a cgroup gone leaves by itself; one
 * evicted while in use is asked about again. */
struct bpf_map_def SEC("maps") target_cgroups = {
	.type = BPF_MAP_TYPE_LRU_HASH,
	.key_size = sizeof(__u64),
	.value_size = sizeof(__u8),
	.max_entries = 16384,
};

/* tgid -> verdict, for cgroups whose verdict is TARGET_BY_PROCESS; an
 * exec or exit deletes the tgid's entry. */
struct bpf_map_def SEC("maps") target_procs = {
	.type = BPF_MAP_TYPE_LRU_HASH,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u8),
	.max_entries = 16384,
};

/* Asks for verdicts; each wakes the reader. */
struct bpf_map_def SEC("maps") target_asks = {
	.type = BPF_MAP_TYPE_RINGBUF,
	.key_size = 0,
	.value_size = 0,
	.max_entries = 1 << 14,
};

static __always_inline void count(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &slot);
	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

/* Marks `key` of `map` asked and asks the reader, once: the samples
 * until it answers are dropped. A lost ask is asked again. */
static __always_inline void ask_target(void *map, void *key, __u64 cgroup, __u32 pid, __u32 kind)
{
	__u8 asked = TARGET_ASKED;
	if (bpf_map_update_elem(map, key, &asked, BPF_NOEXIST))
		return;
	struct target_ask a = { .cgroup_id = cgroup, .pid = pid, .kind = kind };
	if (bpf_ringbuf_output(&target_asks, &a, sizeof(a), BPF_RB_FORCE_WAKEUP))
		bpf_map_delete_elem(map, key);
}

/* Whether the current task is in `targets`' selection. */
static __always_inline int target_selected(__u32 tgid)
{
	__u64 cgroup = bpf_get_current_cgroup_id();
	__u8 *v = bpf_map_lookup_elem(&target_cgroups, &cgroup);
	if (!v) {
		ask_target(&target_cgroups, &cgroup, cgroup, tgid, TARGET_ASK_CGROUP);
		return 0;
	}
	if (*v != TARGET_BY_PROCESS)
		return *v == TARGET_IN;
	v = bpf_map_lookup_elem(&target_procs, &tgid);
	if (!v) {
		ask_target(&target_procs, &tgid, cgroup, tgid, TARGET_ASK_PROCESS);
		return 0;
	}
	return *v == TARGET_IN;
}

/* Frames per stack (kernel and user each), from the configuration. */
static __always_inline __u32 stack_depth(void)
{
	__u32 depth = cfg_max_stack_depth;
	if (depth > MAX_STACK_DEPTH)
		depth = MAX_STACK_DEPTH;
	if (depth == 0)
		depth = 1;
	return depth;
}

/* KERNEL_TEXT_OUTSIDE when a kernel frame of `s` (the kernel stack alone
 * in `ips`, zeros after it) lies outside the kernel's own text, else 0. A
 * fixed trip count with no exit depending on the stack's length keeps the
 * verifier's walk short (see count_key). */
static __always_inline __u64 kernel_text_outside(const struct sample *s)
{
	__u64 outside = 0;
	for (__u32 i = 0; i < MAX_STACK_DEPTH; i++) {
		__u64 ip = s->ips[i];
		if (ip && (ip < cfg_ktext_start || ip >= cfg_ktext_end))
			outside = KERNEL_TEXT_OUTSIDE;
	}
	return outside;
}

/* The scratch record with identity and kernel stack filled in; NULL (and
 * counted) when the scratch map cannot be looked up. */
static __always_inline struct sample *fill_sample(void *ctx, __u32 slot, __u32 tgid, __u32 tid, __u32 kind,
						   __u32 probe)
{
	struct sample *s = bpf_map_lookup_elem(&scratch, &slot);
	if (!s) {
		count(STAT_NO_SCRATCH);
		return NULL;
	}

	s->ktime_ns = bpf_ktime_get_ns();
	s->pid = tgid;
	s->tid = tid;
	s->cpu = bpf_get_smp_processor_id();
	s->kind = kind;
	s->user_end = UNWIND_END_UNKNOWN;
	s->probe = probe;
	s->count_key = 0;
	s->py_len = 0;
	s->py_end = 0;
	s->link = 0;
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	/* Counting hashes whole blocks of frames: the slots past the stacks
	 * must be zero, not the last sample's. */
	if (cfg_count_in_kernel) {
		/* An opaque zero: clang would turn a loop of constant stores
		 * into a memset call, which BPF has not. */
		__u64 zero = 0;
		asm volatile("" : "+r"(zero));
		for (__u32 i = 0; i < MAX_RECORD_FRAMES; i++)
			s->ips[i] = zero;
	}

	long kbytes = bpf_get_stack(ctx, s->ips, stack_depth() * sizeof(__u64), 0);
	__u32 kn = 0;
	if (kbytes < 0)
		count(STAT_KSTACK_ERR);
	else
		kn = (__u64)kbytes / sizeof(__u64);
	if (kn > MAX_STACK_DEPTH)
		kn = MAX_STACK_DEPTH;
	s->kstack_len = kn;
	s->ustack_len = 0;
	if (cfg_count_in_kernel)
		s->count_key = kernel_text_outside(s);
	return s;
}

/* Writes the used part of the record into the ring; `wake` nonzero wakes
 * the reader now. Nonzero when the ring was full (counted). */
static __always_inline long write_record(struct sample *s, int wake)
{
	__u64 size = SAMPLE_HEADER_SIZE + ((__u64)s->kstack_len + s->ustack_len + 2 * (__u64)s->py_len) * sizeof(__u64);
	if (size > sizeof(*s))
		size = sizeof(*s);

	/* Wake the reader only when the ring is over a quarter full; otherwise
	 * it drains on its own timer. */
	__u64 flags = BPF_RB_NO_WAKEUP;
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 ring = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);
	if (wake || avail + size > ring / 4)
		flags = BPF_RB_FORCE_WAKEUP;

	long err = bpf_ringbuf_output(&events, s, size, flags);
	if (err)
		count(STAT_LOST_RINGBUF);
	else
		count(STAT_SAMPLES);
	return err;
}

/* One 64-bit word into the count key (multiply-rotate, as in murmur). */
static __always_inline __u64 key_mix(__u64 h, __u64 w)
{
	w *= 0x87c37b91114253d5ULL;
	w = (w << 31) | (w >> 33);
	w *= 0x4cf5ad432745937fULL;
	h ^= w;
	h = (h << 27) | (h >> 37);
	return h * 5 + 0x52dce729;
}

/* The count key of a sample: its pid, the fields of cfg_count_by, how the
 * user stack ended and both stacks, hashed with the per-load seed. Two
 * stacks with one key (odds ~n^2/2^65 per interval) would share a count. */
static __always_inline __u64 count_key(const struct sample *s)
{
	__u32 by = cfg_count_by;
	__u64 h = key_mix(cfg_count_seed, ((__u64)s->pid << 32) | ((by & COUNT_BY_TID) ? s->tid : 0));
	h = key_mix(h, ((by & COUNT_BY_CPU) ? (__u64)s->cpu : 0) | ((__u64)s->user_end << 32));
	if (by & COUNT_BY_COMM) {
		__u64 c[2];
		__builtin_memcpy(c, s->comm, sizeof(c));
		h = key_mix(h, c[0]);
		h = key_mix(h, c[1]);
	}
	__u32 kn = s->kstack_len, un = s->ustack_len, pn = s->py_len;
	h = key_mix(h, (__u64)kn | ((__u64)un << 16) | ((__u64)pn << 32) | ((__u64)s->py_end << 48));
	__u32 n = kn + un + 2 * pn;
	/* Blocks of KEY_BLOCK frames, the slots past the stacks being zero
	 * (fill_sample): the verifier walks the rest of the program once per
	 * exit of this loop, so few exits (one per block, not per frame). */
	for (__u32 b = 0; b < KEY_BLOCKS; b++) {
		if (b * KEY_BLOCK >= n)
			break;
		for (__u32 j = 0; j < KEY_BLOCK; j++) {
			__u32 i = b * KEY_BLOCK + j;
			if (i < MAX_RECORD_FRAMES)
				h = key_mix(h, s->ips[i]);
		}
	}
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	return h ^ (h >> 33);
}

/* A zeroed slot for a new count: a freed one, else one never handed out;
 * cfg_count_slots when none is left. */
static __always_inline __u32 take_slot(void)
{
	__u32 slot;
	if (bpf_map_pop_elem(&free_slots, &slot) == 0)
		return slot;
	__u32 last = cfg_count_slots;
	__u64 *next = bpf_map_lookup_elem(&count_slots, &last);
	if (!next)
		return last;
	__u64 n = __sync_fetch_and_add(next, 1);
	return n < last ? (__u32)n : last;
}

/* Counts an on-CPU sample: a stack whose key is in `counts` only adds one
 * to its slot; a new one takes a slot and becomes a SAMPLE_CPU_COUNTED
 * record carrying its key and slot. 0 when the sample must be a record of
 * its own (kernel frames whose names may change, or no slot left). */
static __always_inline int count_sample(struct sample *s, int wake)
{
	if (s->count_key == KERNEL_TEXT_OUTSIDE) {
		count(STAT_DYNAMIC_TEXT);
		return 0;
	}
	__u64 key = count_key(s);
	__u32 *slot = bpf_map_lookup_elem(&counts, &key);
	__u64 *n;
	if (slot) {
		n = bpf_map_lookup_elem(&count_slots, slot);
		if (!n)
			return 0;
		__sync_fetch_and_add(n, 1);
		count(STAT_COUNTED);
		return 1;
	}
	__u32 fresh = take_slot();
	n = bpf_map_lookup_elem(&count_slots, &fresh);
	if (fresh >= cfg_count_slots || !n) {
		count(STAT_COUNTS_FULL);
		return 0;
	}
	long err = bpf_map_update_elem(&counts, &key, &fresh, BPF_NOEXIST);
	if (err) {
		/* The slot goes back unused (still zero). -EEXIST: another CPU
		 * put the key in first; count there. */
		bpf_map_push_elem(&free_slots, &fresh, 0);
		slot = err == -EEXIST ? bpf_map_lookup_elem(&counts, &key) : 0;
		n = slot ? bpf_map_lookup_elem(&count_slots, slot) : 0;
		if (!n) {
			count(STAT_COUNTS_FULL);
			return 0;
		}
		__sync_fetch_and_add(n, 1);
		count(STAT_COUNTED);
		return 1;
	}
	__sync_fetch_and_add(n, 1);
	s->kind = SAMPLE_CPU_COUNTED;
	s->count_key = key;
	s->probe = fresh;
	/* A count whose record is lost could never be named: its key goes;
	 * the reader finds the slot unnamed and frees it. */
	if (write_record(s, wake))
		bpf_map_delete_elem(&counts, &key);
	return 1;
}

/* The record out, or only a count (`countable`, with cfg_count_in_kernel).
 * A sample that is to wake the reader (a file the unwinder asks for) is
 * always a record: a count of a stack seen before writes nothing, and the
 * wake-up would be lost until the report. */
static __always_inline void output_sample(struct sample *s, int wake, int countable)
{
	if (cfg_count_in_kernel && countable && !wake && s->kind == SAMPLE_CPU && count_sample(s, wake))
		return;
	write_record(s, wake);
}

/* The user stack of the kernel's frame-pointer walk, and the record out.
 * `entry_ret` nonzero: the sample is taken at a function's first
 * instruction (a uprobe), where the frame-pointer walk skips the caller
 * (its frame is not set up yet); the return address found at the stack
 * pointer is put back as the second user frame. */
static __always_inline int write_fp_sample(void *ctx, struct sample *s, __u64 entry_ret, int wake, int countable)
{
	__u32 depth = stack_depth();
	__u32 kn = s->kstack_len;
	if (kn > MAX_STACK_DEPTH)
		kn = MAX_STACK_DEPTH;

	/* With entry_ret the walk lands one slot later, leaving room for it. */
	__u32 at = entry_ret ? kn + 1 : kn;
	if (at > MAX_STACK_DEPTH + 1)
		at = MAX_STACK_DEPTH + 1;
	long ubytes = bpf_get_stack(ctx, &s->ips[at], depth * sizeof(__u64),
				    BPF_F_USER_STACK);
	__u32 un = 0;
	if (ubytes < 0)
		count(STAT_USTACK_ERR);
	else
		un = (__u64)ubytes / sizeof(__u64);
	if (un > MAX_STACK_DEPTH)
		un = MAX_STACK_DEPTH;
	if (entry_ret && un > 0 && kn <= MAX_STACK_DEPTH) {
		s->ips[kn] = s->ips[kn + 1]; /* the leaf: the probed function */
		s->ips[kn + 1] = entry_ret;  /* its caller */
		un += 1;
		if (un > depth)
			un = depth;
	}
	s->ustack_len = un;
	output_sample(s, wake, countable);
	return 0;
}

/* Copies stacks and identity into the scratch record and writes it. */
static __always_inline int write_sample(void *ctx, __u32 tgid, __u32 tid, __u32 kind, __u32 probe,
					__u64 entry_ret)
{
	struct sample *s = fill_sample(ctx, SCRATCH_PROBE, tgid, tid, kind, probe);
	if (!s)
		return 0;
	return write_fp_sample(ctx, s, entry_ret, 0, 0);
}

#include "unwind.h"
#include "python.h"

SEC("perf_event")
int profcol_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 tid = (__u32)id;

	if (tid == 0 && cfg_exclude_idle) {
		count(STAT_IDLE);
		return 0;
	}
	if ((cfg_filter_pids && !bpf_map_lookup_elem(&pid_filter, &tgid)) || (cfg_targets && !target_selected(tgid))) {
		count(STAT_FILTERED);
		return 0;
	}
	struct sample *s = fill_sample(ctx, SCRATCH_CPU, tgid, tid, SAMPLE_CPU, 0);
	if (!s)
		return 0;
	/* The table walk (a tail call that writes the record), unless the
	 * sample has no user stack or tables are off. */
	unwind_start(ctx, 1, &unwind_progs, SCRATCH_CPU, s, stack_depth());
	if (cfg_unwind_mode != UNWIND_MODE_FRAME_POINTERS)
		s->user_end = UNWIND_END_NO_TABLE;
	return write_fp_sample(ctx, s, 0, 0, 1);
}

SEC("uprobe")
int profcol_uprobe(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;

	if (tgid == cfg_self_tgid)
		return 0;
	count(STAT_PROBE_HITS);
	if ((cfg_filter_pids && !bpf_map_lookup_elem(&pid_filter, &tgid)) || (cfg_targets && !target_selected(tgid))) {
		count(STAT_FILTERED);
		return 0;
	}
	__u64 ret = 0;
	if (bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP(ctx)))
		ret = 0;
	return write_sample(ctx, tgid, (__u32)id, SAMPLE_PROBE, (__u32)bpf_get_attach_cookie(ctx), ret);
}

/* A thread off CPU since `ns` (0: not followed), in `state` (enum
 * off_cpu_state); `wake`: the id of the wakeup recorded for it (0: none). */
struct off_cpu_start {
	__u64 ns;
	__u32 state;
	__u32 pad;
	__u64 wake;
};

/* Sampled threads off CPU, by task (its task_struct's address): an entry
 * is written in place once its thread has one, and goes with the thread
 * (profcol_exit). Task-local storage would be cheaper still, but its map
 * would be made at every load, and kernels before 5.11 have none. Sized
 * by the loader (1 entry with off_cpu off); allocated as threads come. */
struct bpf_map_def SEC("maps") off_cpu_starts = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u64),
	.value_size = sizeof(struct off_cpu_start),
	.max_entries = 65536,
	.map_flags = BPF_F_NO_PREALLOC,
};

/* The thread this CPU switched to after a wait over the threshold, whose
 * record (header and kernel stack in scratch[SCRATCH_OFF_CPU]) is due at
 * its syscall's exit. */
struct off_cpu_due {
	__u64 task; /* 0: nothing due */
};

struct bpf_map_def SEC("maps") off_cpu_dues = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct off_cpu_due),
	.max_entries = 1,
};

/* The table walker's copies for the off-CPU record (raw tracepoint
 * programs, as the one that starts the walk), as unwind_progs. */
struct bpf_map_def SEC("maps") off_cpu_progs = {
	.type = BPF_MAP_TYPE_PROG_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u32),
	.max_entries = 3,
};

/* The walkers' copies for wakeup records (tp_btf programs loaded for
 * sched_waking: a tracing program tail-calls only programs of its own
 * attach point). */
struct bpf_map_def SEC("maps") waker_progs = {
	.type = BPF_MAP_TYPE_PROG_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u32),
	.max_entries = 3,
};

/* task_struct members the off-CPU programs read (from the kernel's BTF;
 * 0: unknown). */
const volatile __u32 cfg_off_task_pid = 0;
const volatile __u32 cfg_off_task_tgid = 0;
const volatile __u32 cfg_off_task_comm = 0;

SEC("raw_tracepoint/sys_exit")
int profcol_off_cpu_unwind(struct bpf_raw_tracepoint_args *ctx)
{
	return unwind_walk(ctx, &off_cpu_progs, SCRATCH_OFF_CPU);
}

SEC("raw_tracepoint/sys_exit")
int profcol_off_cpu_unwind_fill(struct bpf_raw_tracepoint_args *ctx)
{
	return unwind_fill(ctx, &off_cpu_progs, SCRATCH_OFF_CPU);
}

SEC("raw_tracepoint/sys_exit")
int profcol_off_cpu_python(struct bpf_raw_tracepoint_args *ctx)
{
	return py_walk_frames(ctx, &off_cpu_progs, SCRATCH_OFF_CPU);
}

SEC("tp_btf/sched_waking")
int profcol_waker_unwind(__u64 *ctx)
{
	return unwind_walk(ctx, &waker_progs, SCRATCH_WAKER);
}

SEC("tp_btf/sched_waking")
int profcol_waker_unwind_fill(__u64 *ctx)
{
	return unwind_fill(ctx, &waker_progs, SCRATCH_WAKER);
}

SEC("tp_btf/sched_waking")
int profcol_waker_python(__u64 *ctx)
{
	return py_walk_frames(ctx, &waker_progs, SCRATCH_WAKER);
}

/* task_struct state bits (include/linux/sched.h). */
#define TASK_INTERRUPTIBLE 0x1
#define TASK_UNINTERRUPTIBLE 0x2
#define TASK_NOLOAD 0x400

/* The header of an off-CPU record of task `task` (not the current one),
 * its kernel stack already in `s`. */
static __always_inline void off_cpu_header(struct sample *s, void *task, __u64 off_ns, __u32 state, __u32 kn,
					   __u64 link)
{
	__u32 pid = 0, tgid = 0;
	bpf_probe_read_kernel(&pid, sizeof(pid), task + cfg_off_task_pid);
	bpf_probe_read_kernel(&tgid, sizeof(tgid), task + cfg_off_task_tgid);
	bpf_probe_read_kernel(s->comm, sizeof(s->comm), task + cfg_off_task_comm);
	s->ktime_ns = bpf_ktime_get_ns();
	s->pid = tgid;
	s->tid = pid;
	s->cpu = bpf_get_smp_processor_id();
	s->kind = SAMPLE_OFF_CPU;
	s->user_end = UNWIND_END_UNKNOWN;
	s->probe = state;
	s->count_key = off_ns;
	s->py_len = 0;
	s->py_end = 0;
	s->kstack_len = kn;
	s->ustack_len = 0;
	s->link = link;
}

/* sched_switch(preempt, prev, next, prev_state), as `prev` (current)
 * leaves the CPU for `next`:
 *  - what was due on this CPU and did not reach a syscall's exit (a wait
 *    outside a syscall: a page fault) goes out with its kernel stack only;
 *  - a sampled `prev` is noted, with how it leaves;
 *  - `next`, if noted, is back: a wait under the threshold is forgotten
 *    (no stack walked); one over it takes its kernel stack (where it
 *    waited) and is due at its syscall's exit, where its user stack is
 *    walked in its own context. A runnable `next` was preempted, mostly in
 *    user mode (no syscall exit comes): it goes out now, kernel stack only.
 * A tp_btf program: `next` is a task pointer bpf_get_task_stack takes. */
SEC("tp_btf/sched_switch")
int profcol_off_cpu_switch(__u64 *ctx)
{
	__u32 zero = 0;
	struct off_cpu_due *due = bpf_map_lookup_elem(&off_cpu_dues, &zero);
	struct sample *s = bpf_map_lookup_elem(&scratch, &(__u32){ SCRATCH_OFF_CPU });
	if (!due || !s)
		return 0;
	if (due->task) {
		due->task = 0;
		write_record(s, 0);
	}

	void *prev = (void *)ctx[1];
	void *next = (void *)ctx[2];
	/* One clock read for both ends of the switch. */
	__u64 now = bpf_ktime_get_ns();
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if ((__u32)id != 0 && (cfg_off_cpu_probability == 0xffffffff || bpf_get_prandom_u32() <= cfg_off_cpu_probability) &&
	    !(cfg_filter_pids && !bpf_map_lookup_elem(&pid_filter, &tgid)) && !(cfg_targets && !target_selected(tgid))) {
		__u64 prev_state = ctx[3];
		__u32 state = OFF_CPU_RUNNABLE;
		/* Preempted, or yielding, it stays runnable: waiting for a CPU. */
		if (!ctx[0] && (prev_state & (TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE)))
			/* TASK_IDLE (uninterruptible, not counted as load) is no I/O. */
			state = (prev_state & TASK_UNINTERRUPTIBLE) && !(prev_state & TASK_NOLOAD)
					? OFF_CPU_UNINTERRUPTIBLE
					: OFF_CPU_SLEEPING;
		__u64 key = (__u64)prev;
		struct off_cpu_start *start = bpf_map_lookup_elem(&off_cpu_starts, &key);
		if (start) {
			start->ns = now;
			start->state = state;
			start->wake = 0;
		} else {
			struct off_cpu_start first = { .ns = now, .state = state };
			bpf_map_update_elem(&off_cpu_starts, &key, &first, BPF_NOEXIST);
		}
	}

	__u64 key = (__u64)next;
	struct off_cpu_start *start = bpf_map_lookup_elem(&off_cpu_starts, &key);
	if (!start || !start->ns)
		return 0;
	__u64 off_ns = now - start->ns;
	__u32 state = start->state;
	__u64 link = start->wake;
	start->ns = 0;
	start->wake = 0;
	if (off_ns < cfg_off_cpu_threshold_ns)
		return 0;
	long kbytes = bpf_get_task_stack(next, s->ips, stack_depth() * sizeof(__u64), 0);
	__u32 kn = kbytes > 0 ? (__u64)kbytes / sizeof(__u64) : 0;
	if (kn > MAX_STACK_DEPTH)
		kn = MAX_STACK_DEPTH;
	off_cpu_header(s, next, off_ns, state, kn, link);
	if (state == OFF_CPU_RUNNABLE) {
		write_record(s, 0);
		return 0;
	}
	due->task = (__u64)next;
	return 0;
}

/* A syscall's exit, in the thread that made it: the wait it came back
 * from, if due, with its user stack walked (tables and Python as on-CPU
 * samples, else frame pointers). */
SEC("raw_tracepoint/sys_exit")
int profcol_off_cpu(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 zero = 0;
	struct off_cpu_due *due = bpf_map_lookup_elem(&off_cpu_dues, &zero);
	if (!due || !due->task || due->task != bpf_get_current_task())
		return 0;
	due->task = 0;
	struct sample *s = bpf_map_lookup_elem(&scratch, &(__u32){ SCRATCH_OFF_CPU });
	if (!s)
		return 0;
	unwind_start(ctx, 0, &off_cpu_progs, SCRATCH_OFF_CPU, s, stack_depth());
	if (cfg_unwind_mode != UNWIND_MODE_FRAME_POINTERS)
		s->user_end = UNWIND_END_NO_TABLE;
	return write_fp_sample(ctx, s, 0, 0, 0);
}

/* Whether kernel frame `ip` lies in interrupt entry text. */
static __always_inline int in_irq_text(__u64 ip)
{
	return (ip >= cfg_irq_text_start && ip < cfg_irq_text_end) ||
	       (ip >= cfg_softirq_text_start && ip < cfg_softirq_text_end);
}

/* sched_waking(p), run by whatever wakes `p`: a thread, or an interrupt
 * on top of whatever it interrupted. When `p` is followed off CPU (it went
 * to sleep; a preempted thread is not woken) and has waited the threshold
 * already (a wait is not longer than its wakeup plus the run queue), the
 * waker's stacks go out as a SAMPLE_WAKEUP record whose id `p`'s entry
 * keeps for its SAMPLE_OFF_CPU record. From an interrupt, only its kernel
 * frames up to its entry are the waker's (the rest are the interrupted
 * context's); the record is put in `p`'s process, with no thread. */
SEC("tp_btf/sched_waking")
int profcol_off_cpu_waking(__u64 *ctx)
{
	void *p = (void *)ctx[0];
	__u64 key = (__u64)p;
	struct off_cpu_start *start = bpf_map_lookup_elem(&off_cpu_starts, &key);
	if (!start || !start->ns || start->state == OFF_CPU_RUNNABLE)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (now - start->ns < cfg_off_cpu_threshold_ns)
		return 0;
	struct sample *s = bpf_map_lookup_elem(&scratch, &(__u32){ SCRATCH_WAKER });
	if (!s) {
		count(STAT_NO_SCRATCH);
		return 0;
	}
	__u32 cpu = bpf_get_smp_processor_id();
	/* Unique per wakeup: no CPU wakes twice in one nanosecond. */
	__u64 link = (now << 8) | (cpu & 0xff);
	start->wake = link;

	long kbytes = bpf_get_stack(ctx, s->ips, stack_depth() * sizeof(__u64), 0);
	__u32 kn = kbytes > 0 ? (__u64)kbytes / sizeof(__u64) : 0;
	if (kbytes < 0)
		count(STAT_KSTACK_ERR);
	if (kn > MAX_STACK_DEPTH)
		kn = MAX_STACK_DEPTH;
	/* Drop the frames above try_to_wake_up (few: the program and the
	 * tracepoint's caller). */
	__u32 skip = 0;
	for (__u32 i = 0; i < 8; i++) {
		if (i >= kn)
			break;
		__u64 ip = s->ips[i];
		if (ip >= cfg_wake_text_start && ip < cfg_wake_text_end) {
			skip = i;
			break;
		}
	}
	if (skip) {
		for (__u32 j = 0; j < MAX_STACK_DEPTH; j++) {
			__u32 k = j + skip;
			if (k >= kn || k >= MAX_STACK_DEPTH)
				break;
			s->ips[j] = s->ips[k];
		}
		kn -= skip;
	}
	__u32 context = WAKEUP_TASK;
	for (__u32 i = 0; i < MAX_STACK_DEPTH; i++) {
		if (i >= kn)
			break;
		if (in_irq_text(s->ips[i])) {
			context = WAKEUP_INTERRUPT;
			kn = i + 1;
			break;
		}
	}
	__u64 id = bpf_get_current_pid_tgid();
	s->ktime_ns = now;
	s->cpu = cpu;
	s->kind = SAMPLE_WAKEUP;
	s->user_end = UNWIND_END_UNKNOWN;
	s->probe = context;
	s->count_key = 0;
	s->py_len = 0;
	s->py_end = 0;
	s->link = link;
	s->kstack_len = kn;
	s->ustack_len = 0;
	if (context == WAKEUP_INTERRUPT) {
		__u32 tgid = 0;
		bpf_probe_read_kernel(&tgid, sizeof(tgid), p + cfg_off_task_tgid);
		s->pid = tgid;
		s->tid = 0;
		__builtin_memset(s->comm, 0, sizeof(s->comm));
		write_record(s, 0);
		return 0;
	}
	s->pid = id >> 32;
	s->tid = (__u32)id;
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	unwind_start(ctx, 0, &waker_progs, SCRATCH_WAKER, s, stack_depth());
	if (cfg_unwind_mode != UNWIND_MODE_FRAME_POINTERS)
		s->user_end = UNWIND_END_NO_TABLE;
	return write_fp_sample(ctx, s, 0, 0, 0);
}

static __always_inline int proc_event(__u32 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct proc_event e = {
		.ktime_ns = bpf_ktime_get_ns(),
		.pid = id >> 32,
		.kind = kind,
	};
	/* Thread exits are not process exits: only the leader's counts. */
	if (kind == PROC_EXIT && (__u32)id != e.pid)
		return 0;
	bpf_get_current_comm(e.comm, sizeof(e.comm));
	e.cgroup_id = bpf_get_current_cgroup_id();
	/* Wake the reader only for an event into an empty ring: while events
	 * keep coming it reads them on its own short period, and an idle host
	 * costs it no wake-up at all. */
	__u64 flags = bpf_ringbuf_query(&proc_events, BPF_RB_AVAIL_DATA) ? BPF_RB_NO_WAKEUP
									 : BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&proc_events, &e, sizeof(e), flags)) {
		__u32 zero = 0;
		__u64 *v = bpf_map_lookup_elem(&proc_event_lost, &zero);
		if (v)
			*v += 1;
	}
	return 0;
}

/* A new image or a process gone: the mappings the unwinder found for the
 * pid, and its interpreter, are no longer its own. */
static __always_inline void forget_mappings(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	if (cfg_unwind_mode != UNWIND_MODE_FRAME_POINTERS && (__u32)id == pid) {
		bpf_map_delete_elem(&unwind_procs, &pid);
		if (cfg_off_task_fsbase)
			bpf_map_delete_elem(&py_procs, &pid);
	}
	/* A new image may be judged otherwise by an `executable` matcher. */
	if (cfg_targets && (__u32)id == pid)
		bpf_map_delete_elem(&target_procs, &pid);
}

SEC("raw_tracepoint/sched_process_exec")
int profcol_exec(struct bpf_raw_tracepoint_args *ctx)
{
	forget_mappings();
	return proc_event(PROC_EXEC);
}

SEC("raw_tracepoint/sched_process_exit")
int profcol_exit(struct bpf_raw_tracepoint_args *ctx)
{
	/* Every thread's exit: its off-CPU entry goes with it. */
	if (cfg_off_cpu_threshold_ns) {
		__u64 task = bpf_get_current_task();
		bpf_map_delete_elem(&off_cpu_starts, &task);
	}
	forget_mappings();
	return proc_event(PROC_EXIT);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
