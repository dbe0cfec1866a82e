/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * The CPython frame walker, included by cpu_sample.bpf.c after unwind.h.
 *
 * When the native walk of a sample ends and its process is a Python one
 * (an entry in `py_procs`, written by the receiver when it finds a CPython
 * interpreter mapped), unwind_finish tail-calls `profcol_python`. It finds
 * the thread state of the sampled thread (the one whose `thread_id`, i.e.
 * pthread_self(), is the task's fs base; cached per thread in `py_threads`)
 * and walks its frame chain from the current frame outwards, appending two
 * words per Python frame to the record after the native frames:
 *
 *   word 0: code object address | PY_KIND_CPYTHON << 56 | PY_FRAME_ENTRY
 *   word 1: the raw 8 bytes at the frame's instruction member (f_lasti,
 *           prev_instr or instr_ptr: the receiver's namer knows which)
 *
 * PY_FRAME_ENTRY marks the outermost Python frame one call of
 * _PyEval_EvalFrameDefault runs: every frame before 3.11, `is_entry` in
 * 3.11, the frame before a C-stack shim frame from 3.12 (shims are not
 * recorded). From 3.14 the code word is a tagged reference: the namer
 * masks its low bits. The receiver puts each such group where its eval call is in
 * the native stack.
 *
 * Every offset comes from the receiver (struct py_proc), per version; no
 * CPython header is compiled in. Layouts are mirrored by
 * profcol_ebpf::python; change both together.
 */
#ifndef PROFCOL_PYTHON_H
#define PROFCOL_PYTHON_H

#define PY_FRAMES_PER_CALL 16
/* Interpreters and threads per interpreter searched for a thread state. */
#define PY_MAX_INTERPS 4
#define PY_MAX_THREADS 64
/* Bytes of a frame read at once: every member the walk needs lies in them. */
#define PY_FRAME_READ 128
#define PY_NO_OFFSET 0xffff
#define PY_KIND_CPYTHON 1ULL
#define PY_FRAME_ENTRY (1ULL << 63)

/* How the Python walk of a sample ended (`py_end`). */
enum py_end {
	PY_END_NONE = 0,         /* not a Python process, or not walked */
	PY_END_COMPLETE = 1,     /* the thread's outermost frame reached */
	PY_END_DEPTH = 2,        /* PY_MAX_FRAMES frames */
	PY_END_READ_ERROR = 3,   /* reading the process's memory failed */
	PY_END_NO_THREAD = 4,    /* no thread state is the sampled thread's */
	PY_END_NO_FRAME = 5,     /* the thread runs no Python code now */
};

/* Offsets per process, written by the receiver (profcol_ebpf::python). */
struct py_proc {
	__u64 runtime; /* process address of _PyRuntime */
	__u16 version; /* major << 8 | minor */
	__u16 runtime_interpreters_head;
	__u16 interp_next;
	__u16 interp_threads_head;
	__u16 tstate_next;
	__u16 tstate_thread_id;
	__u16 tstate_frame;
	__u16 cframe_current_frame; /* PY_NO_OFFSET: tstate_frame is the frame */
	__u16 frame_previous;
	__u16 frame_code;
	__u16 frame_instr;
	__u16 frame_owner;    /* PY_NO_OFFSET before 3.11 */
	__u16 frame_is_entry; /* PY_NO_OFFSET but in 3.11 */
	/* 3.12+: `owner` of a frame on the C stack (an eval call's entry
	 * shim, not recorded); PY_NO_OFFSET before. */
	__u16 cstack_owner;
	/* When the receiver found it (bpf_ktime_get_ns() >> 20): while young,
	 * its records wake the reader, so a short-lived process is named
	 * before its memory goes. */
	__u32 born;
};

/* A process found less than this long ago (units of 2^20 ns) is young. */
#define PY_YOUNG 1024
/* Wake-ups for young processes' records, per CPU, at most this often. */
#define PY_WAKE_PERIOD_NS 10000000ULL

/* The walk between tail calls (per CPU). */
struct py_walk {
	__u64 frame; /* the next frame to read */
	__u32 frames; /* Python frames recorded */
	__u32 calls;
};

/* `task_struct.thread.fsbase`, from the kernel's BTF (0: no Python walk). */
const volatile __u32 cfg_off_task_fsbase = 0;

/* pid -> struct py_proc, written by the receiver. */
struct bpf_map_def SEC("maps") py_procs = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct py_proc),
	.max_entries = 4096,
	.map_flags = BPF_F_NO_PREALLOC,
};

/* Interpreter files (struct unwind_file_key -> 1), written by the
 * receiver when it finds a Python process: the first sample of a later
 * process mapping one wakes the reader, which finds that process too. */
struct bpf_map_def SEC("maps") py_files = {
	.type = BPF_MAP_TYPE_HASH,
	.key_size = sizeof(struct unwind_file_key),
	.value_size = sizeof(__u8),
	.max_entries = 256,
	.map_flags = BPF_F_NO_PREALLOC,
};

/* tid -> its thread state's address, the last one found; or
 * PY_NO_THREAD_STATE | the time (2^30 ns units) none was found. */
#define PY_NO_THREAD_STATE (1ULL << 63)
#define PY_NO_THREAD_STATE_TTL_S 2
/* An LRU map is allocated whole: sized by the loader (one entry when
 * Python is off). A thread evicted is looked up again. */
struct bpf_map_def SEC("maps") py_threads = {
	.type = BPF_MAP_TYPE_LRU_HASH,
	.key_size = sizeof(__u32),
	.value_size = sizeof(__u64),
	.max_entries = 16384,
};

struct bpf_map_def SEC("maps") py_walks = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = sizeof(struct py_walk),
	.max_entries = SCRATCH_SLOTS,
};

/* A frame's first PY_FRAME_READ bytes (per CPU). */
struct bpf_map_def SEC("maps") py_frame_buf = {
	.type = BPF_MAP_TYPE_PERCPU_ARRAY,
	.key_size = sizeof(__u32),
	.value_size = PY_FRAME_READ,
	.max_entries = SCRATCH_SLOTS,
};

/* The u64 at `off` of a frame read into `buf`; offsets past the read
 * were refused by the receiver, the mask keeps the verifier sure. */
static __always_inline __u64 py_u64(__u8 *buf, __u16 off)
{
	__u32 o = off;
	if (o > PY_FRAME_READ - 8)
		return 0;
	return *(__u64 *)(buf + o);
}

static __always_inline __u8 py_u8(__u8 *buf, __u16 off)
{
	return buf[off & (PY_FRAME_READ - 1)];
}

static __always_inline __u64 py_read_ptr(__u64 addr)
{
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		return 0;
	return v;
}

/* The thread state whose thread_id is `fsbase`: the cached one if it
 * still is, else found in the interpreters' thread lists. 0: none. */
static __always_inline __u64 py_thread_state(struct py_proc *p, __u32 tid, __u64 fsbase)
{
	__u64 now_s = bpf_ktime_get_ns() >> 30;
	__u64 *cached = bpf_map_lookup_elem(&py_threads, &tid);
	if (cached && (*cached & PY_NO_THREAD_STATE)) {
		/* A native thread of a Python process: not searched again
		 * for a while (it may yet get a thread state). */
		if (now_s - (*cached & ~PY_NO_THREAD_STATE) < PY_NO_THREAD_STATE_TTL_S)
			return 0;
	} else if (cached && *cached && py_read_ptr(*cached + p->tstate_thread_id) == fsbase) {
		return *cached;
	}
	__u64 interp = py_read_ptr(p->runtime + p->runtime_interpreters_head);
	for (int i = 0; i < PY_MAX_INTERPS; i++) {
		if (!interp)
			break;
		__u64 ts = py_read_ptr(interp + p->interp_threads_head);
		for (int j = 0; j < PY_MAX_THREADS; j++) {
			if (!ts)
				break;
			if (py_read_ptr(ts + p->tstate_thread_id) == fsbase) {
				bpf_map_update_elem(&py_threads, &tid, &ts, BPF_ANY);
				return ts;
			}
			ts = py_read_ptr(ts + p->tstate_next);
		}
		interp = py_read_ptr(interp + p->interp_next);
	}
	__u64 none = PY_NO_THREAD_STATE | now_s;
	bpf_map_update_elem(&py_threads, &tid, &none, BPF_ANY);
	return 0;
}

/* The current frame of the sampled thread, or 0 (`end` says why). */
static __always_inline __u64 py_current_frame(struct py_proc *p, __u32 tid, __u32 *end)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 fsbase = 0;
	if (bpf_probe_read_kernel(&fsbase, sizeof(fsbase), (void *)task + cfg_off_task_fsbase) || !fsbase) {
		*end = PY_END_READ_ERROR;
		return 0;
	}
	__u64 ts = py_thread_state(p, tid, fsbase);
	if (!ts) {
		*end = PY_END_NO_THREAD;
		return 0;
	}
	__u64 f = py_read_ptr(ts + p->tstate_frame);
	if (f && p->cframe_current_frame != PY_NO_OFFSET)
		f = py_read_ptr(f + p->cframe_current_frame);
	if (!f)
		*end = PY_END_NO_FRAME;
	return f;
}

/* Ends the walk: the record out. */
static __always_inline int py_finish(struct unwind_state *st, struct sample *s, struct py_walk *w, __u32 end)
{
	s->py_len = w->frames;
	s->py_end = end;
	output_sample(s, st->wake, 1);
	return 0;
}

/* The Python walk, `progs`' copy (as unwind_walk), of the record in
 * scratch slot `slot`. */
static __always_inline int py_walk_frames(void *ctx, void *progs, __u32 slot)
{
	struct unwind_state *st = bpf_map_lookup_elem(&unwind_states, &slot);
	struct sample *s = bpf_map_lookup_elem(&scratch, &slot);
	struct py_walk *w = bpf_map_lookup_elem(&py_walks, &slot);
	__u8 *buf = bpf_map_lookup_elem(&py_frame_buf, &slot);
	if (!st || !s || !w || !buf)
		return 0;
	__u32 pid = st->pid;
	struct py_proc *p = bpf_map_lookup_elem(&py_procs, &pid);
	if (!p) {
		w->frames = 0;
		return py_finish(st, s, w, PY_END_NONE);
	}
	__u32 end = 0;
	if (w->calls == 0) {
		__u64 now = bpf_ktime_get_ns();
		if ((__u32)(now >> 20) - p->born < PY_YOUNG && now - st->last_wake_ns >= PY_WAKE_PERIOD_NS) {
			st->wake = 1;
			st->last_wake_ns = now;
		}
		w->frames = 0;
		w->frame = py_current_frame(p, s->tid, &end);
		if (!w->frame)
			return py_finish(st, s, w, end);
	}
	/* Where Python frames go: after the native ones. */
	__u32 base = (__u32)s->kstack_len + s->ustack_len;
	__u32 is_311 = p->frame_is_entry != PY_NO_OFFSET;
	__u32 has_owner = p->frame_owner != PY_NO_OFFSET;
	for (int i = 0; i < PY_FRAMES_PER_CALL; i++) {
		if (!w->frame) {
			end = PY_END_COMPLETE;
			break;
		}
		if (w->frames >= PY_MAX_FRAMES) {
			end = PY_END_DEPTH;
			break;
		}
		if (bpf_probe_read_user(buf, PY_FRAME_READ, (void *)w->frame)) {
			end = PY_END_READ_ERROR;
			break;
		}
		w->frame = py_u64(buf, p->frame_previous);
		if (has_owner && py_u8(buf, p->frame_owner) == p->cstack_owner) {
			/* A shim: the frame recorded before it was its eval
			 * call's outermost. */
			__u32 last = base + 2 * (w->frames - 1);
			if (w->frames && last < MAX_RECORD_FRAMES)
				s->ips[last] |= PY_FRAME_ENTRY;
			continue;
		}
		__u64 entry = has_owner ? (is_311 && py_u8(buf, p->frame_is_entry) ? PY_FRAME_ENTRY : 0)
					: PY_FRAME_ENTRY;
		__u32 at = base + 2 * w->frames;
		if (at > MAX_RECORD_FRAMES - 2) {
			end = PY_END_DEPTH;
			break;
		}
		s->ips[at] = py_u64(buf, p->frame_code) | (PY_KIND_CPYTHON << 56) | entry;
		s->ips[at + 1] = py_u64(buf, p->frame_instr);
		w->frames++;
	}
	if (!end) {
		w->calls++;
		if (w->calls < PY_MAX_FRAMES / PY_FRAMES_PER_CALL + 1)
			bpf_tail_call(ctx, progs, UNWIND_PROG_PYTHON);
		end = PY_END_DEPTH;
	}
	/* The outermost Python frame ran in the outermost eval call. */
	if (end == PY_END_COMPLETE && w->frames) {
		__u32 last = base + 2 * (w->frames - 1);
		if (last < MAX_RECORD_FRAMES)
			s->ips[last] |= PY_FRAME_ENTRY;
	}
	return py_finish(st, s, w, end);
}

SEC("perf_event")
int profcol_python(struct bpf_perf_event_data *ctx)
{
	return py_walk_frames(ctx, &unwind_progs, SCRATCH_CPU);
}

/* Whether process `pid` maps interpreter file `key` and is not walked
 * yet: the reader is to be woken (at most every UNWIND_WAKE_PERIOD_NS
 * per CPU) to find it. */
static __always_inline int py_unknown_process(struct unwind_state *st, struct unwind_file_key *key)
{
	__u32 pid = st->pid;
	if (!cfg_off_task_fsbase || !bpf_map_lookup_elem(&py_files, key) || bpf_map_lookup_elem(&py_procs, &pid))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (now - st->last_wake_ns < UNWIND_WAKE_PERIOD_NS)
		return 0;
	st->last_wake_ns = now;
	return 1;
}

/* Hands a finished native walk to the Python walker when the process is a
 * Python one; returns when it is not (or the program is not loaded). */
static __always_inline void py_start(void *ctx, void *progs, __u32 slot, __u32 pid)
{
	if (!cfg_off_task_fsbase || !bpf_map_lookup_elem(&py_procs, &pid))
		return;
	struct py_walk *w = bpf_map_lookup_elem(&py_walks, &slot);
	if (!w)
		return;
	w->calls = 0;
	w->frames = 0;
	w->frame = 0;
	bpf_tail_call(ctx, progs, UNWIND_PROG_PYTHON);
}

#endif
