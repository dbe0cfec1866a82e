//! profcol's eBPF programs: the built object bytes and the records shared
//! with the C code in `ebpf/bpf/`.
//!
//! The object is built by `ebpf/build.sh` (clang-16, `-target bpf -O2`, no
//! `-g`) and committed as `ebpf/obj/cpu_sample.bpf.o`, so building profcol
//! needs no clang. It has no `.BTF`/`.BTF.ext` sections and therefore no CO-RE
//! relocations: loading it never needs the kernel's BTF.
//!
//! Everything here mirrors `ebpf/bpf/cpu_sample.bpf.c` and
//! `ebpf/bpf/record.h` (the records, in [`record`]); change both together.
//! [`sys`] is the kernel ABI (bpf(2), perf_event_open(2) and their structs
//! from generated bindings) for the rest of profcol.

#![deny(unsafe_code)]

#[allow(unsafe_code)] // syscalls and the kernel's structs
pub mod sys;

#[allow(unsafe_code)] // clock_gettime
pub mod clock;

/// 8-byte aligned wrapper so the ELF parser can read headers in place.
#[repr(C, align(8))]
struct Aligned<B: ?Sized> {
    bytes: B,
}

static CPU_SAMPLE_ALIGNED: &Aligned<[u8]> = &Aligned { bytes: *include_bytes!("../obj/cpu_sample.bpf.o") };

/// The built `cpu_sample.bpf.o` object (8-byte aligned).
pub fn cpu_sample_object() -> &'static [u8] {
    &CPU_SAMPLE_ALIGNED.bytes
}

/// Name of the `perf_event` program in the object.
pub const PROGRAM_NAME: &str = "profcol_cpu_sample";
/// Name of the `uprobe` program (loaded only when probes are configured).
pub const UPROBE_PROGRAM: &str = "profcol_uprobe";
/// Raw tracepoint program on `sched_process_exec`.
pub const EXEC_PROGRAM: &str = "profcol_exec";
/// Raw tracepoint program on `sched_process_exit`.
pub const EXIT_PROGRAM: &str = "profcol_exit";
/// `BPF_MAP_TYPE_RINGBUF` of [`ProcEvent`] records.
pub const PROC_EVENTS_MAP: &str = "proc_events";
/// `BPF_MAP_TYPE_PERCPU_ARRAY`, one `u64`: process events lost (ring full).
pub const PROC_EVENT_LOST_MAP: &str = "proc_event_lost";
/// The `BPF_MAP_TYPE_RINGBUF` that carries [`SampleHeader`] records.
pub const EVENTS_MAP: &str = "events";
/// `BPF_MAP_TYPE_PERCPU_ARRAY` of `u64` counters indexed by [`Stat`].
pub const STATS_MAP: &str = "stats";
/// `BPF_MAP_TYPE_HASH` of `u32` tgid -> `u8`, used when `pids` is set.
pub const PID_FILTER_MAP: &str = "pid_filter";
/// Capacity of [`PID_FILTER_MAP`].
pub const PID_FILTER_CAPACITY: usize = 1024;

/// `.rodata` globals set by the loader before the program is loaded.
pub mod globals {
    /// `u32`: frames per stack (kernel and user each), 1..=127.
    pub const MAX_STACK_DEPTH: &str = "cfg_max_stack_depth";
    /// `u32`: nonzero to skip samples of the idle task (tid 0).
    pub const EXCLUDE_IDLE: &str = "cfg_exclude_idle";
    /// `u32`: nonzero to keep only tgids present in the pid filter map.
    pub const FILTER_PIDS: &str = "cfg_filter_pids";
    /// `u32`: the receiver's own tgid, whose probe hits are ignored.
    pub const SELF_TGID: &str = "cfg_self_tgid";
    /// `u32`: [`crate::unwind::Mode`] of user-stack unwinding.
    pub const UNWIND_MODE: &str = "cfg_unwind_mode";
    /// `u32`: nonzero to count on-CPU samples per stack in [`super::COUNTS_MAP`].
    pub const COUNT_IN_KERNEL: &str = "cfg_count_in_kernel";
    /// `u64`s: the kernel's own text, `[_text, _etext)`; samples with kernel
    /// frames outside it are never counted (their names may change).
    pub const KTEXT_START: &str = "cfg_ktext_start";
    pub const KTEXT_END: &str = "cfg_ktext_end";
    /// `u32`: [`super::count_by`] bits: fields that split counts.
    pub const COUNT_BY: &str = "cfg_count_by";
    /// `u64`: seed of the count key.
    pub const COUNT_SEED: &str = "cfg_count_seed";
}

/// `BPF_MAP_TYPE_HASH` `u64` count key → `u64` samples: on-CPU samples
/// counted in the kernel this interval (see `SampleKind::CpuCounted`).
pub const COUNTS_MAP: &str = "counts";

/// Bits of [`globals::COUNT_BY`] (`COUNT_BY_*` in C).
pub mod count_by {
    pub const TID: u32 = 1;
    pub const COMM: u32 = 2;
    pub const CPU: u32 = 4;
}

pub use record::{MAX_STACK_DEPTH, TASK_COMM_LEN};

/// Counter slots of [`STATS_MAP`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Stat {
    /// Records written to the ring buffer.
    Samples = 0,
    /// Records dropped because the ring buffer was full.
    LostRingbuf = 1,
    /// `bpf_get_stack` for the kernel stack failed (record still sent).
    KernelStackError = 2,
    /// `bpf_get_stack` for the user stack failed (record still sent).
    UserStackError = 3,
    /// Samples of the idle task, skipped (`exclude_idle`).
    Idle = 4,
    /// Samples of processes not in `pids`, skipped.
    Filtered = 5,
    /// Per-CPU scratch lookup failed (not expected).
    NoScratch = 6,
    /// Uprobe hits (written to the ring or not).
    ProbeHits = 7,
    /// On-CPU samples only counted in [`COUNTS_MAP`] (no record).
    Counted = 8,
    /// On-CPU samples written as records because [`COUNTS_MAP`] was full.
    CountsFull = 9,
    /// On-CPU samples written as records because a kernel frame was
    /// outside the kernel's own text (BPF programs, modules, trampolines).
    DynamicText = 10,
}

impl Stat {
    /// All slots, in index order.
    pub const ALL: [Stat; 11] = [
        Stat::Samples,
        Stat::LostRingbuf,
        Stat::KernelStackError,
        Stat::UserStackError,
        Stat::Idle,
        Stat::Filtered,
        Stat::NoScratch,
        Stat::ProbeHits,
        Stat::Counted,
        Stat::CountsFull,
        Stat::DynamicText,
    ];
    /// Number of slots in the map (`STAT_MAX` in C).
    pub const SLOTS: u32 = 11;
}

pub mod record;
pub use record::{
    ProcEvent, ProcEventKind, Sample, SampleHeader, SampleKind, UnwindEnd, PROC_EVENT_SIZE, SAMPLE_HEADER_SIZE,
};

pub mod unwind;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_has_no_btf_and_expected_symbols() {
        let obj = cpu_sample_object();
        assert_eq!(&obj[..4], b"\x7fELF");
        assert_eq!(obj.as_ptr() as usize % 8, 0);
        let has = |needle: &[u8]| obj.windows(needle.len()).any(|w| w == needle);
        // No BTF: no CO-RE relocations are possible, so no vmlinux BTF is needed.
        assert!(!has(b".BTF"), "object must not carry .BTF/.BTF.ext");
        for name in [
            PROGRAM_NAME,
            EVENTS_MAP,
            STATS_MAP,
            PID_FILTER_MAP,
            globals::MAX_STACK_DEPTH,
            globals::EXCLUDE_IDLE,
            globals::FILTER_PIDS,
            globals::SELF_TGID,
            UPROBE_PROGRAM,
            EXEC_PROGRAM,
            EXIT_PROGRAM,
            PROC_EVENTS_MAP,
            PROC_EVENT_LOST_MAP,
            unwind::PROGRAM,
            unwind::ROWS_MAP,
            unwind::PAGES_MAP,
            unwind::RULES_MAP,
            unwind::PROCS_MAP,
            unwind::PROGS_MAP,
            globals::UNWIND_MODE,
            globals::COUNT_IN_KERNEL,
            globals::KTEXT_START,
            globals::KTEXT_END,
            globals::COUNT_BY,
            globals::COUNT_SEED,
            COUNTS_MAP,
        ] {
            assert!(has(name.as_bytes()), "{name} missing from object");
        }
    }
}
