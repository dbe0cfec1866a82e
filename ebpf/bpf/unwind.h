/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * User-stack unwinding with unwind tables built from .eh_frame (#19),
 * included by cpu_sample.bpf.c. Its maps and programs are this file's own.
 *
 * The receiver loads, per ELF file (shared by build id), a compact table
 * (profcol_elf::unwind::CompactTable): 64 KiB pages of rows
 * `(address & 0xffff) << 16 | rule id` into `unwind_rows`, the page index
 * into `unwind_pages`, rules into `unwind_rules`; and, per process, one
 * entry of `unwind_procs`: pid -> its mappings that have a table, sorted
 * by address ((start, end) -> (table, bias), at most UNWIND_PROC_RANGES),
 * written once when the process is loaded and deleted when it exits. The
 * sampling program starts a walk for processes the map knows and
 * tail-calls `profcol_unwind`, which unwinds
 * UNWIND_FRAMES_PER_CALL frames per call (the verifier checks a bounded
 * loop per program; no bpf_loop, which needs BTF func_info, and the object
 * carries no BTF) and tail-calls itself until the stack ends; then it
 * writes the record. Code of a known process outside its ranges, and code a
 * table marks RULE_FRAME_POINTER (Go code in a Go binary), are walked by
 * frame pointers (mode auto). A signal trampoline (RULE_SIGNAL) continues
 * in the interrupted code with the registers the kernel saved.
 *
 * Layouts are mirrored by profcol_ebpf::unwind; change both together.
 */
#ifndef PROFCOL_UNWIND_H
#define PROFCOL_UNWIND_H

/* Rule kinds (profcol_elf::unwind::kind). */
#define RULE_UNSUPPORTED 0
#define RULE_CFA_RSP 1
#define RULE_CFA_RBP 2
#define RULE_PLT 3
#define RULE_OUTERMOST 4
#define RULE_NO_INFO 5
#define RULE_FRAME_POINTER 6 /* code that keeps frame pointers (Go) */
#define RULE_SIGNAL 7        /* a signal trampoline: registers from the ucontext */
#define RULE_GO_CGO_CALL 8   /* Go's asmcgocall after its call into C: back to the goroutine stack */
/* Where the caller's rbp is (profcol_elf::unwind::rbp). */
#define RBP_SAME 0
#define RBP_AT_CFA 1
#define RBP_UNKNOWN 2

/* cfg_unwind_mode */
#define UNWIND_MODE_FRAME_POINTERS 0
#define UNWIND_MODE_AUTO 1
#define UNWIND_MODE_TABLES 2

#define UNWIND_FRAMES_PER_CALL 8
/* 127 frames / 8 per call: 16 calls, under the kernel's limit of 33. */
#define UNWIND_MAX_CALLS 17
#define UNWIND_SEARCH_STEPS 17 /* log2(65536 rows per page) + 1 */
#define UNWIND_PROC_RANGES 64  /* a power of two: indexes are masked with it - 1 */
#define UNWIND_RANGE_UNUSED 0x7fffffffffffffffULL /* start of an unused range slot */
#define USER_ADDR_END 0x0000800000000000ULL

const volatile __u32 cfg_unwind_mode = UNWIND_MODE_FRAME_POINTERS;

struct unwind_rule {
	__u8 kind;
	__u8 rbp;
	__s16 rbp_offset;
	__s32 cfa_offset;
};

struct unwind_page_key {
	__u32 table;
	__u32 page; /* file virtual address >> 16 */
};

struct unwind_page {
	__u32 first; /* global row index in unwind_rows */
	__u32 count;
};

/* A mapping of a process with an unwind table. */
struct unwind_range {
	__u64 start;
	__u64 end;  /* exclusive */
	__u64 bias; /* process address - file virtual address */
	__u32 table;
	__u32 pad;
};

/* A process the receiver has loaded: its ranges with a table, sorted by
 * start, not overlapping, then unused slots (start UNWIND_RANGE_UNUSED,
 * end 0). Code outside them has no table (walked by frame pointers in
 * mode auto). */
struct unwind_proc {
	__u32 count; /* ranges in use (for bpftool readers; the search scans all slots) */
	__u32 pad;
	struct unwind_range ranges[UNWIND_PROC_RANGES];
};

/* The walk between tail calls (per CPU). */
struct unwind_state {
	__u64 pc;
	__u64 sp;
	__u64 bp;
	__u32 frames;  /* user frames recorded */
	__u32 kframes; /* kernel frames before them in the record */
	__u32 depth;
	__u32 calls;
	__u32 pid;
	__u32 bp_known;
	__u32 wake;         /* wake the reader with this record */
	__u32 pc_exact;     /* pc is an interrupted instruction, not a return address */
	__u64 last_wake_ns; /* last wake-up for a process without tables */
	__u32 last_unknown; /* pid of this CPU's last sample of a process without tables */
	__u32 _pad;
};

/* unwind_start's answer when the walk did not start. */
#define UNWIND_START_NO -1
#define UNWIND_START_UNKNOWN 1 /* the receiver has not loaded the process */
/* Wake-ups for processes without tables, per CPU, at most this often. */
#define UNWIND_WAKE_PERIOD_NS 20000000ULL

/* Two rows per element (elements are 8 bytes in an array map anyway);
 * sized by the loader from unwind.max_table_bytes. Mapped into the
 * receiver (BPF_F_MMAPABLE, Linux >= 5.5; the ring buffer needs 5.8), which
 * writes rows with plain stores rather than a syscall per element. */
struct bpf_map_def SEC("maps") unwind_rows = {
	.type = BPF_MAP_TYPE_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u64),
	.max_entries = 1,
	.map_flags = BPF_F_MMAPABLE,
};

struct bpf_map_def SEC("maps") unwind_pages = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(struct unwind_page_key),
	.value_size = sizeof(struct unwind_page),
	.max_entries = 1,
	.map_flags = BPF_F_NO_PREALLOC,
};

struct bpf_map_def SEC("maps") unwind_rules = {
	.type = BPF_MAP_TYPE_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct unwind_rule),
	.max_entries = 16384,
};

/* pid -> struct unwind_proc; entries allocated on update (2 KiB each). */
struct bpf_map_def SEC("maps") unwind_procs = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct unwind_proc),
	.max_entries = 32768,
	.map_flags = BPF_F_NO_PREALLOC,
};

struct bpf_map_def SEC("maps") unwind_states = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct unwind_state),
	.max_entries = 1,
};

struct bpf_map_def SEC("maps") unwind_progs = {
	.type = BPF_MAP_TYPE_PROG_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u32),
	.max_entries = 1,
};

/* The range of `p` holding `pc`, or NULL. A branchless binary search over
 * all UNWIND_PROC_RANGES slots (unused ones start at UNWIND_RANGE_UNUSED,
 * above every user address): a branch per step made the verifier explore
 * each outcome of each step, for each frame, past its instruction limit. */
static __always_inline struct unwind_range *unwind_range_of(struct unwind_proc *p, __u64 pc)
{
	__u32 base = 0;
#pragma unroll
	for (__u32 half = UNWIND_PROC_RANGES / 2; half > 0; half /= 2) {
		__u64 start = p->ranges[(base + half) & (UNWIND_PROC_RANGES - 1)].start;
		/* 1 when start <= pc: both are below 2^63, so the difference's
		 * sign bit says which is larger. */
		__u32 le = 1 - (__u32)((pc - start) >> 63);
		base += half * le;
	}
	struct unwind_range *m = &p->ranges[base & (UNWIND_PROC_RANGES - 1)];
	return (m->start <= pc && pc < m->end) ? m : NULL;
}

static __always_inline int unwind_knows(__u32 pid)
{
	return bpf_map_lookup_elem(&unwind_procs, &pid) != NULL;
}

/* The user registers at the sample: the interrupted ones when the sample
 * hit user mode, else those saved at kernel entry. */
static __always_inline int user_regs(struct bpf_perf_event_data *ctx, struct pt_regs *out)
{
	if ((ctx->regs.cs & 3) == 3) {
		out->rip = ctx->regs.rip;
		out->rsp = ctx->regs.rsp;
		out->rbp = ctx->regs.rbp;
		return 0;
	}
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs)
		return -1;
	if (bpf_probe_read_kernel(out, sizeof(*out), regs))
		return -1;
	return 0;
}

/* The last row of page `pg` at or below `lo` (the address's low 16 bits):
 * its rule, or NULL (an address before the page's first row: no info). */
static __always_inline struct unwind_rule *unwind_find_rule(struct unwind_page *pg, __u32 lo)
{
	__u32 l = pg->first, r = pg->first + pg->count;
	for (int i = 0; i < UNWIND_SEARCH_STEPS; i++) {
		if (l >= r)
			break;
		__u32 mid = l + (r - l) / 2;
		__u32 key = mid >> 1;
		__u64 *pair = bpf_map_lookup_elem(&unwind_rows, &key);
		if (!pair)
			return NULL;
		__u32 row = (mid & 1) ? (__u32)(*pair >> 32) : (__u32)*pair;
		if ((row >> 16) <= lo)
			l = mid + 1;
		else
			r = mid;
	}
	if (l == pg->first)
		return NULL;
	__u32 idx = l - 1;
	__u32 key = idx >> 1;
	__u64 *pair = bpf_map_lookup_elem(&unwind_rows, &key);
	if (!pair)
		return NULL;
	__u32 row = (idx & 1) ? (__u32)(*pair >> 32) : (__u32)*pair;
	__u32 rule_id = row & 0xffff;
	return bpf_map_lookup_elem(&unwind_rules, &rule_id);
}

/* One frame-pointer step; 0 or an enum unwind_end. */
static __always_inline __u32 unwind_fp_step(struct unwind_state *st)
{
	if (!st->bp_known)
		return UNWIND_END_UNSUPPORTED;
	if (st->bp == 0)
		return UNWIND_END_OUTERMOST;
	__u64 frame[2];
	if (bpf_probe_read_user(frame, sizeof(frame), (void *)st->bp))
		return UNWIND_END_READ_ERROR;
	st->sp = st->bp + 16;
	st->bp = frame[0];
	st->pc = frame[1];
	return 0;
}

/* Out of a signal trampoline (glibc's __restore_rt, entered by the
 * handler's return with rsp at the kernel's ucontext): the interrupted
 * rsp and rip (saved next to each other) and rbp. */
static __always_inline __u32 unwind_signal_step(struct unwind_state *st, struct unwind_rule *rule)
{
	__u64 sp_ip[2];
	__u64 bp;
	if (bpf_probe_read_user(sp_ip, sizeof(sp_ip), (void *)(st->sp + rule->cfa_offset)))
		return UNWIND_END_READ_ERROR;
	if (bpf_probe_read_user(&bp, sizeof(bp), (void *)(st->sp + rule->rbp_offset)))
		return UNWIND_END_READ_ERROR;
	st->sp = sp_ip[0];
	st->pc = sp_ip[1];
	st->bp = bp;
	st->bp_known = 1;
	st->pc_exact = 1;
	return 0;
}

/* Out of Go's runtime.asmcgocall, which switched to the system stack and
 * called C: it saved the goroutine g at sp + cfa_offset and its stack
 * depth (g.stack.hi - the goroutine's sp at the call) at sp + rbp_offset.
 * asmcgocall keeps no frame, so that goroutine sp holds its return address
 * (into runtime.cgocall); rbp is the goroutine's still. */
static __always_inline __u32 unwind_go_cgo_step(struct unwind_state *st, struct unwind_rule *rule)
{
	__u64 g, depth, hi, ra;
	if (bpf_probe_read_user(&g, sizeof(g), (void *)(st->sp + rule->cfa_offset)) ||
	    bpf_probe_read_user(&depth, sizeof(depth), (void *)(st->sp + rule->rbp_offset)) ||
	    bpf_probe_read_user(&hi, sizeof(hi), (void *)(g + 8))) /* g.stack.hi */
		return UNWIND_END_READ_ERROR;
	__u64 sp = hi - depth;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)sp))
		return UNWIND_END_READ_ERROR;
	st->sp = sp + 8;
	st->pc = ra;
	return 0;
}

/* Moves `st` from the frame at st->pc (in process `proc`) to its caller;
 * 0 to go on, else how the stack ended. */
static __always_inline __u32 unwind_step(struct unwind_state *st, struct unwind_proc *proc)
{
	/* A return address may be just past its function (a noreturn call
	 * last): look up the call instruction. The leaf's pc and one a
	 * signal interrupted are instructions of their own. */
	__u64 pc = (st->frames > 1 && !st->pc_exact) ? st->pc - 1 : st->pc;
	st->pc_exact = 0;
	/* The process is not (or no longer) loaded. */
	if (!proc)
		return UNWIND_END_NO_TABLE;
	struct unwind_range *m = unwind_range_of(proc, pc);
	if (!m) {
		if (cfg_unwind_mode == UNWIND_MODE_AUTO)
			return unwind_fp_step(st);
		return UNWIND_END_NO_TABLE;
	}
	__u64 vaddr = pc - m->bias;
	struct unwind_page_key pk = { .table = m->table, .page = (__u32)(vaddr >> 16) };
	struct unwind_page *pg = bpf_map_lookup_elem(&unwind_pages, &pk);
	if (!pg)
		return UNWIND_END_NO_TABLE;
	struct unwind_rule *rule = unwind_find_rule(pg, (__u32)(vaddr & 0xffff));
	if (!rule)
		return UNWIND_END_NO_TABLE;
	__u64 cfa;
	switch (rule->kind) {
	case RULE_CFA_RSP:
		cfa = st->sp + rule->cfa_offset;
		break;
	case RULE_CFA_RBP:
		if (!st->bp_known)
			return UNWIND_END_UNSUPPORTED;
		cfa = st->bp + rule->cfa_offset;
		break;
	case RULE_PLT:
		cfa = st->sp + 8 + (((st->pc & 15) >= (__u64)rule->cfa_offset) ? 8 : 0);
		break;
	case RULE_OUTERMOST:
		return UNWIND_END_OUTERMOST;
	case RULE_NO_INFO:
		return UNWIND_END_NO_TABLE;
	case RULE_FRAME_POINTER:
		if (cfg_unwind_mode == UNWIND_MODE_AUTO)
			return unwind_fp_step(st);
		return UNWIND_END_NO_TABLE;
	case RULE_SIGNAL:
		return unwind_signal_step(st, rule);
	case RULE_GO_CGO_CALL:
		return unwind_go_cgo_step(st, rule);
	default:
		return UNWIND_END_UNSUPPORTED;
	}
	__u64 ra;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)))
		return UNWIND_END_READ_ERROR;
	if (rule->rbp == RBP_AT_CFA) {
		if (bpf_probe_read_user(&st->bp, sizeof(st->bp), (void *)(cfa + rule->rbp_offset)))
			return UNWIND_END_READ_ERROR;
	} else if (rule->rbp == RBP_UNKNOWN) {
		st->bp_known = 0;
	}
	st->sp = cfa;
	st->pc = ra;
	return 0;
}

SEC("perf_event")
int profcol_unwind(struct bpf_perf_event_data *ctx)
{
	__u32 zero = 0;
	struct unwind_state *st = bpf_map_lookup_elem(&unwind_states, &zero);
	struct sample *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!st || !s)
		return 0;
	__u32 pid = st->pid;
	/* Looked up once per call (unwind_step: NULL, no longer loaded). */
	struct unwind_proc *proc = bpf_map_lookup_elem(&unwind_procs, &pid);
	__u32 end = 0;
	for (int i = 0; i < UNWIND_FRAMES_PER_CALL; i++) {
		if (st->frames >= st->depth) {
			end = UNWIND_END_DEPTH;
			break;
		}
		/* A return address of 0, or outside user space: the end. */
		if (st->pc == 0 || st->pc >= USER_ADDR_END) {
			end = st->frames ? UNWIND_END_OUTERMOST : UNWIND_END_READ_ERROR;
			break;
		}
		__u32 at = st->kframes + st->frames;
		if (at >= 2 * MAX_STACK_DEPTH + 1) {
			end = UNWIND_END_DEPTH;
			break;
		}
		s->ips[at] = st->pc;
		st->frames++;
		end = unwind_step(st, proc);
		if (end)
			break;
	}
	if (!end) {
		st->calls++;
		if (st->calls < UNWIND_MAX_CALLS)
			bpf_tail_call(ctx, &unwind_progs, 0);
		end = UNWIND_END_DEPTH;
	}
	s->ustack_len = st->frames;
	s->user_end = end;
	/* Countable: auto walks only processes the reader loaded; in tables
	 * mode a process it has not loaded yet is unknown to it. */
	output_sample(s, st->wake, cfg_unwind_mode == UNWIND_MODE_AUTO || unwind_knows(s->pid));
	return 0;
}

/* Whether this CPU wakes the reader for `pid`, a process without tables:
 * from its second sample on this CPU with no other such process sampled
 * there between, at most once per UNWIND_WAKE_PERIOD_NS. The reader builds
 * tables from a process's second sample, and most short-lived processes
 * are sampled once: waking for them bought a /proc read of a process whose
 * samples get no tables anyway. */
static __always_inline int unwind_wake_due(__u32 pid)
{
	__u32 zero = 0;
	struct unwind_state *st = bpf_map_lookup_elem(&unwind_states, &zero);
	if (!st)
		return 0;
	int again = st->last_unknown == pid;
	st->last_unknown = pid;
	if (!again)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (now - st->last_wake_ns < UNWIND_WAKE_PERIOD_NS)
		return 0;
	st->last_wake_ns = now;
	return 1;
}

/* Starts a table walk for a CPU sample whose header and kernel stack are in
 * `s`; when the walk is not started (the caller then takes the
 * frame-pointer path) returns UNWIND_START_UNKNOWN for a process the
 * receiver has not loaded, else UNWIND_START_NO. On success it does not
 * return (tail call). */
static __always_inline int unwind_start(struct bpf_perf_event_data *ctx, struct sample *s, __u32 depth)
{
	if (cfg_unwind_mode == UNWIND_MODE_FRAME_POINTERS)
		return UNWIND_START_NO;
	struct pt_regs regs = {};
	if (user_regs(ctx, &regs))
		return UNWIND_START_NO;
	if (regs.rip == 0 || regs.rip >= USER_ADDR_END)
		return UNWIND_START_NO; /* a kernel thread: no user stack */
	/* Processes the receiver has not loaded yet: frame pointers (auto). */
	int unknown = !unwind_knows(s->pid);
	if (cfg_unwind_mode == UNWIND_MODE_AUTO && unknown)
		return UNWIND_START_UNKNOWN;
	int wake = unknown && unwind_wake_due(s->pid);
	__u32 zero = 0;
	struct unwind_state *st = bpf_map_lookup_elem(&unwind_states, &zero);
	if (!st)
		return UNWIND_START_NO;
	st->wake = wake;
	st->pc = regs.rip;
	st->sp = regs.rsp;
	st->bp = regs.rbp;
	st->frames = 0;
	st->kframes = s->kstack_len;
	st->depth = depth;
	st->calls = 0;
	st->pid = s->pid;
	st->bp_known = 1;
	st->pc_exact = 0;
	bpf_tail_call(ctx, &unwind_progs, 0);
	return UNWIND_START_NO;
}

#endif
