/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * User-stack unwinding with unwind tables built from .eh_frame,
 * included by cpu_sample.bpf.c. Its maps and programs are this file's own.
 *
 * The receiver loads, per ELF file (shared by build id), a compact table
 * (profcol_elf::unwind::CompactTable): 64 KiB pages of rows
 * `(address & 0xffff) << 16 | rule id` into `unwind_rows`, the page index
 * into `unwind_pages`, rules into `unwind_rules`; and, per mapped file
 * (device and inode, as the kernel sees them), an entry of `unwind_files`
 * saying which table holds its code and how file offsets become table
 * addresses. Nothing per process: the BPF program finds the mapping of a
 * pc itself (bpf_find_vma, in `profcol_unwind_fill`) and keeps what it
 * found in `unwind_procs` (pid -> up to UNWIND_PROC_RANGES ranges, each
 * re-checked after UNWIND_RANGE_TTL_S), deleted at exec and exit. A file
 * with no entry yet goes into `unwind_wanted`, which the receiver reads to
 * build its table; its code is walked by frame pointers meanwhile (mode
 * auto). bpf_find_vma takes the mmap lock with a trylock whose unlock is
 * deferred to irq_work in this context, so one call per sample: a new
 * process's ranges fill in over its first samples.
 *
 * The sampling program tail-calls `profcol_unwind`, which unwinds
 * UNWIND_FRAMES_PER_CALL frames per call (a bounded loop per program) and
 * tail-calls itself until the stack ends; then it writes the record. Code
 * a table marks RULE_FRAME_POINTER (Go code in a Go binary) and code with
 * no table are walked by frame pointers (mode auto). A signal trampoline
 * (RULE_SIGNAL) continues in the interrupted code with the registers the
 * kernel saved.
 *
 * The kernel structs are read at member offsets the receiver finds in the
 * kernel's BTF (profcol_ebpf::btf) and sets before load (cfg_off_*): no
 * CO-RE, so loading never parses all of the kernel's BTF. The object
 * carries BTF of its own only because bpf_find_vma's callback needs
 * func_info.
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
#define UNWIND_PROC_RANGES 16  /* a power of two: indexes are masked with it - 1 */
#define UNWIND_RANGE_TTL_S 4   /* a cached range is looked up again after this (units of 2^30 ns) */
#define UNWIND_FILE_SEGS 2     /* executable segments per file entry */
#define UNWIND_NEED_FILL 100   /* unwind_step: the pc's mapping is not cached */
#define UNWIND_NO_TABLE_ID 0   /* a range or file without a table (frame pointers) */
#define UNWIND_PENDING_ID 0xffffffffU /* a file whose table is being built: not cached, not asked again */
#define UNWIND_RANGE_UNUSED 0x7fffffffffffffffULL /* start of an unused range slot */
#define USER_ADDR_END 0x0000800000000000ULL

const volatile __u32 cfg_unwind_mode = UNWIND_MODE_FRAME_POINTERS;
/* Byte offsets of the kernel members bpf_find_vma's callback reads. */
const volatile __u32 cfg_off_vm_start = 0;
const volatile __u32 cfg_off_vm_end = 8;
const volatile __u32 cfg_off_vm_pgoff = 0;
const volatile __u32 cfg_off_vm_file = 0;
const volatile __u32 cfg_off_f_inode = 0;
const volatile __u32 cfg_off_i_ino = 0;
const volatile __u32 cfg_off_i_sb = 0;
const volatile __u32 cfg_off_s_dev = 0;

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

/* A mapping of a process, as the BPF program found it. */
struct unwind_range {
	__u64 start;
	__u64 end;  /* exclusive */
	__u64 bias; /* process address - table (file virtual) address */
	__u32 table; /* UNWIND_NO_TABLE_ID: frame pointers */
	__u32 born;  /* bpf_ktime_get_ns() >> 30 when found */
};

/* The mappings of a process found so far: sorted by start, not
 * overlapping, then unused slots (start UNWIND_RANGE_UNUSED, end 0). */
struct unwind_proc {
	__u32 count; /* ranges in use (for bpftool readers; the search scans all slots) */
	__u32 pad;
	struct unwind_range ranges[UNWIND_PROC_RANGES];
};

/* A file as the kernel names it: inode->i_sb->s_dev (MKDEV: major << 20 |
 * minor) and inode->i_ino. */
struct unwind_file_key {
	__u32 dev;
	__u32 pad;
	__u64 ino;
};

/* File offsets [off_lo, off_hi) of an executable segment; table address =
 * file offset + delta. */
struct unwind_file_seg {
	__u64 off_lo;
	__u64 off_hi;
	__u64 delta;
};

/* Written by the receiver: the file's table, UNWIND_NO_TABLE_ID (none) or
 * UNWIND_PENDING_ID (being built). */
struct unwind_file {
	__u32 table;
	__u32 nsegs;
	struct unwind_file_seg segs[UNWIND_FILE_SEGS];
};

/* A file sampled with no entry in unwind_files: where, for the receiver to
 * open it (/proc/pid/map_files/start-end), and how often. */
struct unwind_want {
	__u32 pid;
	__u32 count;
	__u64 start;
	__u64 end;
	__u64 pgoff;
	__u64 first_ns;
};

/* What bpf_find_vma's callback found. */
struct unwind_vma {
	__u64 start;
	__u64 end;
	__u64 pgoff;
	__u64 ino;
	__u32 dev;
	__u32 has_file;
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
	__u64 last_wake_ns; /* last wake-up for a wanted file */
	__u64 miss_pc;      /* the pc whose mapping profcol_unwind_fill looks up */
	__u32 redo;         /* the frame at pc is recorded: step it again after the fill */
	__u32 filled;       /* bpf_find_vma was called for this sample */
};

/* Wake-ups for wanted files, per CPU, at most this often. */
#define UNWIND_WAKE_PERIOD_NS 20000000ULL

/* Two rows per element (elements are 8 bytes in an array map anyway), in
 * chunks of UNWIND_CHUNK_ELEMS elements: the receiver creates a chunk when
 * a table first needs it and drops it when no table uses it, so the kernel
 * holds what the loaded tables take, not unwind.max_table_bytes (the outer
 * array's length, set by the loader). A page's rows never straddle two
 * chunks (one page holds at most 65536 rows: exactly a chunk). Each chunk
 * is mapped into the receiver (BPF_F_MMAPABLE, Linux >= 5.5; the ring
 * buffer needs 5.8), which writes rows with plain stores rather than a
 * syscall per element. The inner arrays keep one size (no
 * BPF_F_INNER_MAP), so the verifier inlines their lookups. */
#define UNWIND_CHUNK_SHIFT 15 /* elements per chunk: 32768 (256 KiB) */
#define UNWIND_CHUNK_ELEMS (1U << UNWIND_CHUNK_SHIFT)
struct unwind_rows_chunk {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, UNWIND_CHUNK_ELEMS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(map_flags, BPF_F_MMAPABLE);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct unwind_rows_chunk);
} unwind_rows SEC(".maps");

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

/* pid -> struct unwind_proc, written by profcol_unwind_fill (520 bytes,
 * allocated on update), deleted at exec and exit. */
struct bpf_map_def SEC("maps") unwind_procs = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct unwind_proc),
	.max_entries = 16384,
	.map_flags = BPF_F_NO_PREALLOC,
};

/* struct unwind_file_key -> struct unwind_file, written by the receiver. */
struct bpf_map_def SEC("maps") unwind_files = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(struct unwind_file_key),
	.value_size = sizeof(struct unwind_file),
	.max_entries = 8192,
	.map_flags = BPF_F_NO_PREALLOC,
};

/* struct unwind_file_key -> struct unwind_want; read and emptied by the
 * receiver. Preallocated: inserted on the sampling path. */
struct bpf_map_def SEC("maps") unwind_wanted = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(struct unwind_file_key),
	.value_size = sizeof(struct unwind_want),
	.max_entries = 1024,
};

/* The new ranges of a process while profcol_unwind_fill builds them. */
struct bpf_map_def SEC("maps") unwind_fill_scratch = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct unwind_proc),
	.max_entries = SCRATCH_SLOTS,
};

struct bpf_map_def SEC("maps") unwind_states = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct unwind_state),
	.max_entries = SCRATCH_SLOTS,
};

/* 0: profcol_unwind, 1: profcol_unwind_fill, 2: profcol_python. */
#define UNWIND_PROG_WALK 0
#define UNWIND_PROG_FILL 1
#define UNWIND_PROG_PYTHON 2
struct bpf_map_def SEC("maps") unwind_progs = {
	.type = BPF_MAP_TYPE_PROG_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u32),
	.max_entries = 3,
};

static __always_inline void py_start(void *ctx, void *progs, __u32 slot, __u32 pid);
struct unwind_state;
struct unwind_file_key;
static __always_inline int py_unknown_process(struct unwind_state *st, struct unwind_file_key *key);

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

/* The user registers at the sample: with `ctx_regs`, `ctx` starts with the
 * interrupted registers (a perf event's), taken when they are user mode;
 * else those saved at kernel entry. */
static __always_inline int user_regs(void *ctx, int ctx_regs, struct pt_regs *out)
{
	struct pt_regs *at = ctx;
	if (ctx_regs && (at->cs & 3) == 3) {
		out->rip = at->rip;
		out->rsp = at->rsp;
		out->rbp = at->rbp;
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
	/* Global row r is element (r >> 1) of the whole array: chunk
	 * r >> (UNWIND_CHUNK_SHIFT + 1), element (r >> 1) & (UNWIND_CHUNK_ELEMS - 1)
	 * in it; all of a page's rows lie in one chunk. */
	__u32 chunk = pg->first >> (UNWIND_CHUNK_SHIFT + 1);
	void *rows = bpf_map_lookup_elem(&unwind_rows, &chunk);
	if (!rows)
		return NULL;
	__u32 l = pg->first, r = pg->first + pg->count;
	for (int i = 0; i < UNWIND_SEARCH_STEPS; i++) {
		if (l >= r)
			break;
		__u32 mid = l + (r - l) / 2;
		__u32 key = (mid >> 1) & (UNWIND_CHUNK_ELEMS - 1);
		__u64 *pair = bpf_map_lookup_elem(rows, &key);
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
	__u32 key = (idx >> 1) & (UNWIND_CHUNK_ELEMS - 1);
	__u64 *pair = bpf_map_lookup_elem(rows, &key);
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

/* No table for the code at st->pc: frame pointers in mode auto. Where
 * that step fails (the code keeps no frame pointer: rbp is garbage), the
 * stack ended for want of a table, and says so. */
static __always_inline __u32 unwind_no_table(struct unwind_state *st)
{
	if (cfg_unwind_mode != UNWIND_MODE_AUTO)
		return UNWIND_END_NO_TABLE;
	__u32 end = unwind_fp_step(st);
	return end == UNWIND_END_READ_ERROR ? UNWIND_END_NO_TABLE : end;
}

/* Moves `st` from the frame at st->pc (in process `proc`, NULL when none
 * of its ranges are cached) to its caller; 0 to go on, UNWIND_NEED_FILL
 * when the pc's mapping is to be looked up first (st unchanged), else how
 * the stack ended.
 *
 * A global function: the verifier checks it once, on its own, rather than
 * at each of the frame loop's unrolled steps with the caller's states
 * (inlined, profcol_unwind took ~110 ms of every start to verify). Its
 * pointer arguments may be NULL as far as the verifier knows. */
__noinline __u32 unwind_step(struct unwind_state *st, struct unwind_proc *proc, __u32 now_s)
{
	if (!st)
		return UNWIND_END_READ_ERROR;
	/* A return address may be just past its function (a noreturn call
	 * last): look up the call instruction. The leaf's pc and one a
	 * signal interrupted are instructions of their own. */
	__u64 pc = (st->frames > 1 && !st->pc_exact) ? st->pc - 1 : st->pc;
	struct unwind_range *m = proc ? unwind_range_of(proc, pc) : NULL;
	if (!m || now_s - m->born > UNWIND_RANGE_TTL_S) {
		if (!st->filled) {
			st->miss_pc = pc;
			return UNWIND_NEED_FILL;
		}
		if (!m) {
			st->pc_exact = 0;
			return unwind_no_table(st);
		}
	}
	st->pc_exact = 0;
	if (m->table == UNWIND_NO_TABLE_ID)
		return unwind_no_table(st);
	__u64 vaddr = pc - m->bias;
	struct unwind_page_key pk = { .table = m->table, .page = (__u32)(vaddr >> 16) };
	struct unwind_page *pg = bpf_map_lookup_elem(&unwind_pages, &pk);
	/* No page: code the table does not cover, or a table evicted since
	 * the range was cached. */
	if (!pg)
		return unwind_no_table(st);
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

/* Ends the walk: on to the Python walker for a Python process, else the
 * record out. */
static __always_inline int unwind_finish(void *ctx, void *progs, __u32 slot, struct unwind_state *st,
					 struct sample *s, __u32 end)
{
	s->ustack_len = st->frames;
	s->user_end = end;
	py_start(ctx, progs, slot, st->pid);
	output_sample(s, st->wake, 1);
	return 0;
}

/* The walk, from the program `progs` holds at UNWIND_PROG_WALK (one copy
 * per program type: a tail call stays within its type), of the record in
 * slot `slot` of scratch and of the walk's per-CPU state: an off-CPU walk
 * runs in its thread's context, where an on-CPU sample may interrupt it. */
static __always_inline int unwind_walk(void *ctx, void *progs, __u32 slot)
{
	struct unwind_state *st = bpf_map_lookup_elem(&unwind_states, &slot);
	struct sample *s = bpf_map_lookup_elem(&scratch, &slot);
	if (!st || !s)
		return 0;
	__u32 pid = st->pid;
	/* Looked up once per call (the fill replaces it, then calls again). */
	struct unwind_proc *proc = bpf_map_lookup_elem(&unwind_procs, &pid);
	__u32 now_s = (__u32)(bpf_ktime_get_ns() >> 30);
	__u32 end = 0;
	for (int i = 0; i < UNWIND_FRAMES_PER_CALL; i++) {
		if (!st->redo) {
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
		}
		st->redo = 0;
		end = unwind_step(st, proc, now_s);
		if (end == UNWIND_NEED_FILL) {
			st->redo = 1;
			st->filled = 1;
			bpf_tail_call(ctx, progs, UNWIND_PROG_FILL);
			/* Not loaded: on without it. */
			st->redo = 0;
			end = unwind_step(st, proc, now_s);
		}
		if (end)
			break;
	}
	if (!end) {
		st->calls++;
		if (st->calls < UNWIND_MAX_CALLS)
			bpf_tail_call(ctx, progs, UNWIND_PROG_WALK);
		end = UNWIND_END_DEPTH;
	}
	return unwind_finish(ctx, progs, slot, st, s, end);
}

SEC("perf_event")
int profcol_unwind(struct bpf_perf_event_data *ctx)
{
	return unwind_walk(ctx, &unwind_progs, SCRATCH_CPU);
}

struct vm_area_struct;

/* bpf_find_vma's callback: the mapping's range, offset and file. */
static long unwind_vma_cb(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct unwind_vma *v = data;
	void *base = (void *)vma;
	void *file = NULL, *inode = NULL, *sb = NULL;
	bpf_probe_read_kernel(&v->start, sizeof(v->start), base + cfg_off_vm_start);
	bpf_probe_read_kernel(&v->end, sizeof(v->end), base + cfg_off_vm_end);
	bpf_probe_read_kernel(&v->pgoff, sizeof(v->pgoff), base + cfg_off_vm_pgoff);
	bpf_probe_read_kernel(&file, sizeof(file), base + cfg_off_vm_file);
	if (!file)
		return 0;
	bpf_probe_read_kernel(&inode, sizeof(inode), file + cfg_off_f_inode);
	if (!inode)
		return 0;
	bpf_probe_read_kernel(&v->ino, sizeof(v->ino), inode + cfg_off_i_ino);
	bpf_probe_read_kernel(&sb, sizeof(sb), inode + cfg_off_i_sb);
	if (!sb)
		return 0;
	bpf_probe_read_kernel(&v->dev, sizeof(v->dev), sb + cfg_off_s_dev);
	v->has_file = 1;
	return 0;
}

/* Asks the receiver for the table of file `key` (mapped by `pid` as `v`);
 * 1 when this CPU should wake it: from the file's second sample on until
 * the receiver takes the entry, at most every UNWIND_WAKE_PERIOD_NS per
 * CPU (a wake-up only at the second sample was lost when another file had
 * just woken it from this CPU). */
static __always_inline int unwind_want_file(struct unwind_state *st, struct unwind_file_key *key,
					    struct unwind_vma *v)
{
	struct unwind_want *w = bpf_map_lookup_elem(&unwind_wanted, key);
	if (w) {
		if (__sync_fetch_and_add(&w->count, 1) < 1)
			return 0;
		__u64 now = bpf_ktime_get_ns();
		if (now - st->last_wake_ns < UNWIND_WAKE_PERIOD_NS)
			return 0;
		st->last_wake_ns = now;
		return 1;
	}
	struct unwind_want nw = {
		.pid = st->pid,
		.count = 1,
		.start = v->start,
		.end = v->end,
		.pgoff = v->pgoff,
		.first_ns = bpf_ktime_get_ns(),
	};
	bpf_map_update_elem(&unwind_wanted, key, &nw, BPF_NOEXIST);
	return 0;
}

/* The range of mapping `v` for `pc`, from its file's entry `f`: the part
 * of the mapping in the executable segment holding pc, with its bias; the
 * whole mapping without a table when no segment holds it. */
static __always_inline void unwind_range_from(struct unwind_range *r, struct unwind_vma *v,
					      struct unwind_file *f, __u64 pc)
{
	r->start = v->start;
	r->end = v->end;
	r->bias = 0;
	r->table = UNWIND_NO_TABLE_ID;
	if (!f || f->table == UNWIND_NO_TABLE_ID)
		return;
	__u64 map_off = v->pgoff << 12; /* file offset at v->start */
	__u64 off = pc - v->start + map_off;
#pragma unroll
	for (int i = 0; i < UNWIND_FILE_SEGS; i++) {
		struct unwind_file_seg *g = &f->segs[i];
		if (i >= f->nsegs || off < g->off_lo || off >= g->off_hi)
			continue;
		if (g->off_lo > map_off && v->start + (g->off_lo - map_off) > r->start)
			r->start = v->start + (g->off_lo - map_off);
		if (v->start + (g->off_hi - map_off) < r->end)
			r->end = v->start + (g->off_hi - map_off);
		r->bias = v->start - map_off - g->delta;
		r->table = f->table;
		return;
	}
}

/* Puts the range with the lower start first. */
static __always_inline void unwind_order(struct unwind_range *a, struct unwind_range *b)
{
	if (b->start < a->start) {
		struct unwind_range t = *a;
		*a = *b;
		*b = t;
	}
}

/* `nw` = the ranges of `old` (NULL: none) that are fresh and do not
 * overlap `r`, and `r`, sorted (the highest dropped when all slots are
 * taken). Every access is at a constant index and the only branches are
 * compare-and-swaps, so the verifier's walk stays short: indexes computed
 * from the data (an insertion point) made it explore each combination. */
static __always_inline void unwind_ranges_with(struct unwind_proc *nw, struct unwind_proc *old,
					       struct unwind_range *r, __u32 now_s)
{
#pragma unroll
	for (int i = 0; i < UNWIND_PROC_RANGES; i++) {
		struct unwind_range *o = &nw->ranges[i];
		if (old) {
			*o = old->ranges[i];
			if ((o->start < r->end && r->start < o->end) || now_s - o->born > UNWIND_RANGE_TTL_S) {
				o->start = UNWIND_RANGE_UNUSED;
				o->end = 0;
			}
		} else {
			o->start = UNWIND_RANGE_UNUSED;
			o->end = 0;
		}
	}
	/* Unused slots (the highest start) to the end. */
#pragma unroll
	for (int p = 0; p < UNWIND_PROC_RANGES - 1; p++) {
#pragma unroll
		for (int i = 0; i < UNWIND_PROC_RANGES - 1 - p; i++)
			unwind_order(&nw->ranges[i], &nw->ranges[i + 1]);
	}
	/* The new range in the last slot, then down to its place. */
	nw->ranges[UNWIND_PROC_RANGES - 1] = *r;
#pragma unroll
	for (int i = UNWIND_PROC_RANGES - 2; i >= 0; i--)
		unwind_order(&nw->ranges[i], &nw->ranges[i + 1]);
	__u32 n = 0;
#pragma unroll
	for (int i = 0; i < UNWIND_PROC_RANGES; i++)
		n += nw->ranges[i].start != UNWIND_RANGE_UNUSED;
	nw->count = n;
}

/* Looks up the mapping of st->miss_pc and caches it in unwind_procs;
 * then back to the walk. */
static __always_inline int unwind_fill(void *ctx, void *progs, __u32 slot)
{
	struct unwind_state *st = bpf_map_lookup_elem(&unwind_states, &slot);
	struct sample *s = bpf_map_lookup_elem(&scratch, &slot);
	struct unwind_proc *nw = bpf_map_lookup_elem(&unwind_fill_scratch, &slot);
	if (!st || !s || !nw)
		return 0;
	__u32 pid = st->pid;
	__u64 pc = st->miss_pc;
	struct unwind_vma v = {};
	struct task_struct *task = bpf_get_current_task_btf();
	if (bpf_find_vma(task, pc, unwind_vma_cb, &v, 0) == 0 && v.start <= pc && pc < v.end) {
		struct unwind_file *f = NULL;
		struct unwind_file_key key = { .dev = v.dev, .ino = v.ino };
		int cache = 1;
		if (v.has_file) {
			if (py_unknown_process(st, &key))
				st->wake = 1;
			f = bpf_map_lookup_elem(&unwind_files, &key);
			/* Not known yet: asked for, and not cached, so the
			 * table is used as soon as it is in. */
			if (!f) {
				if (unwind_want_file(st, &key, &v))
					st->wake = 1;
				cache = 0;
			} else if (f->table == UNWIND_PENDING_ID) {
				cache = 0;
			}
		}
		if (cache) {
			struct unwind_range r;
			unwind_range_from(&r, &v, f, pc);
			r.born = (__u32)(bpf_ktime_get_ns() >> 30);
			__u32 now_s = r.born;
			struct unwind_proc *old = bpf_map_lookup_elem(&unwind_procs, &pid);
			unwind_ranges_with(nw, old, &r, now_s);
			bpf_map_update_elem(&unwind_procs, &pid, nw, BPF_ANY);
		}
	}
	bpf_tail_call(ctx, progs, UNWIND_PROG_WALK);
	/* Over the tail-call limit (not expected): the stack so far. */
	return unwind_finish(ctx, progs, slot, st, s, UNWIND_END_DEPTH);
}

SEC("perf_event")
int profcol_unwind_fill(struct bpf_perf_event_data *ctx)
{
	return unwind_fill(ctx, &unwind_progs, SCRATCH_CPU);
}

/* Starts a table walk (`progs`' copy) for a sample whose header and kernel
 * stack are in `s` (`ctx_regs`: as user_regs); returns (and the caller
 * takes the frame-pointer path) only when the walk did not start. */
static __always_inline void unwind_start(void *ctx, int ctx_regs, void *progs, __u32 slot, struct sample *s,
					 __u32 depth)
{
	if (cfg_unwind_mode == UNWIND_MODE_FRAME_POINTERS)
		return;
	struct pt_regs regs = {};
	if (user_regs(ctx, ctx_regs, &regs))
		return;
	if (regs.rip == 0 || regs.rip >= USER_ADDR_END)
		return; /* a kernel thread: no user stack */
	struct unwind_state *st = bpf_map_lookup_elem(&unwind_states, &slot);
	if (!st)
		return;
	st->wake = 0;
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
	st->redo = 0;
	st->filled = 0;
	bpf_tail_call(ctx, progs, UNWIND_PROG_WALK);
}

#endif
