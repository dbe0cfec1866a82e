/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * The records profcol's BPF programs write, shared by every program that
 * writes them. Mirrored by `profcol_ebpf::record` (Rust); change both
 * together.
 */
#ifndef PROFCOL_RECORD_H
#define PROFCOL_RECORD_H

#define MAX_STACK_DEPTH 127 /* kernel.perf_event_max_stack default */
#define TASK_COMM_LEN 16
/* Interpreter frames per sample, two words each, after the native ones. */
#define PY_MAX_FRAMES 96
#define MAX_RECORD_FRAMES (2 * MAX_STACK_DEPTH + 1 + 2 * PY_MAX_FRAMES)

/* What made a `struct sample` (its `kind`). */
enum sample_kind {
	SAMPLE_CPU = 0,   /* cpu-clock perf event: an on-CPU sample */
	SAMPLE_PROBE = 1, /* uprobe hit: one call; `probe` = attach cookie */
	/* The first on-CPU sample of a stack counted in the kernel (`counts`
	 * map, key `count_key`, its count in `count_slots[probe]`): later
	 * samples only add to the count, which the reader reads at reports. */
	SAMPLE_CPU_COUNTED = 2,
	/* A thread back on CPU after at least the off-CPU threshold: its
	 * time off CPU in `count_key` (ns), its state then in `probe` (enum
	 * off_cpu_state), the stacks it left the CPU with. */
	SAMPLE_OFF_CPU = 3,
	/* A thread woke one followed off CPU for at least the threshold so
	 * far: the waker's stacks, `link` the id the woken thread's
	 * SAMPLE_OFF_CPU record repeats, `probe` enum wakeup_context. */
	SAMPLE_WAKEUP = 4,
};

/* Where a wakeup came from (a SAMPLE_WAKEUP's `probe`). */
enum wakeup_context {
	WAKEUP_TASK = 0,      /* a thread (pid, tid, comm and stacks its own) */
	WAKEUP_INTERRUPT = 1, /* an interrupt (a timer, a device): kernel frames
	                       * up to its entry, in the woken thread's process */
};

/* How a thread left the CPU (a SAMPLE_OFF_CPU's `probe`). */
enum off_cpu_state {
	OFF_CPU_SLEEPING = 0,        /* waiting, interruptibly (locks, sockets, timers) */
	OFF_CPU_UNINTERRUPTIBLE = 1, /* waiting uninterruptibly (disk I/O, some locks) */
	OFF_CPU_RUNNABLE = 2,        /* preempted: runnable, waiting for a CPU */
};

/* How a user stack ended (`user_end`). UNWIND_END_UNKNOWN: the kernel's
 * frame-pointer walk (bpf_get_stack) made it, which does not say. */
enum unwind_end {
	UNWIND_END_UNKNOWN = 0,
	UNWIND_END_OUTERMOST = 1,   /* reached the outermost frame */
	UNWIND_END_NO_TABLE = 2,    /* code without unwind info (or not loaded yet) */
	UNWIND_END_UNSUPPORTED = 3, /* a rule outside the supported subset */
	UNWIND_END_DEPTH = 4,       /* max_stack_depth frames */
	UNWIND_END_READ_ERROR = 5,  /* reading the user stack failed */
};

/* One sample, CPU or probe, in the `events` ring buffer. Only the used
 * part of `ips` is written. */
struct sample {
	__u64 ktime_ns;          /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 pid;               /* tgid */
	__u32 tid;
	__u32 cpu;
	__u16 kstack_len;        /* frames in ips[0 .. kstack_len) */
	__u16 ustack_len;        /* frames in ips[kstack_len .. +ustack_len) */
	char comm[TASK_COMM_LEN];
	__u16 kind;              /* enum sample_kind */
	__u16 user_end;          /* enum unwind_end: how the user stack ended */
	__u32 probe;             /* SAMPLE_PROBE: index of the configured probe;
	                          * SAMPLE_CPU_COUNTED: the count's slot;
	                          * SAMPLE_OFF_CPU: enum off_cpu_state;
	                          * SAMPLE_WAKEUP: enum wakeup_context */
	__u64 count_key;         /* SAMPLE_CPU_COUNTED: its key in `counts`;
	                          * SAMPLE_OFF_CPU: ns off CPU */
	__u16 py_len;            /* interpreter frames after the user frames (python.h) */
	__u16 py_end;            /* enum py_end: how their walk ended */
	__u32 pad;
	__u64 link;              /* SAMPLE_OFF_CPU: the id of the SAMPLE_WAKEUP
	                          * that ended the wait (0: none recorded);
	                          * SAMPLE_WAKEUP: its id */
	/* One spare slot: a probe hit inserts its return address; then two
	 * words per interpreter frame. */
	__u64 ips[MAX_RECORD_FRAMES];
};

#define SAMPLE_HEADER_SIZE (__builtin_offsetof(struct sample, ips))

/* What a `struct proc_event` reports. */
enum proc_event_kind {
	PROC_EXEC = 1, /* sched_process_exec: pid now runs a new image */
	PROC_EXIT = 2, /* sched_process_exit of the thread-group leader */
};

/* One process event in the `proc_events` ring buffer. */
struct proc_event {
	__u64 ktime_ns;
	__u32 pid;               /* tgid */
	__u32 kind;              /* enum proc_event_kind */
	char comm[TASK_COMM_LEN];
	__u64 cgroup_id;         /* the task's cgroup v2 id: its container, once per cgroup */
};

/* What a `struct target_ask` asks about. */
enum target_ask_kind {
	TARGET_ASK_CGROUP = 1,  /* a cgroup with no verdict yet */
	TARGET_ASK_PROCESS = 2, /* a process whose executable decides */
};

/* A sample of a cgroup (or process) `targets` has no verdict for yet: the
 * reader decides and writes the verdict into target_cgroups/target_procs. */
struct target_ask {
	__u64 cgroup_id;
	__u32 pid;
	__u32 kind;              /* enum target_ask_kind */
};

#endif
