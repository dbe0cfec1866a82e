//! profcol's eBPF programs: the built object bytes and the records shared
//! with the C code in `ebpf/bpf/`.
//!
//! The object is built by `ebpf/build.sh` (clang-16, `-target bpf -O2 -g`,
//! DWARF stripped) and committed as `ebpf/obj/cpu_sample.bpf.o`, so building
//! profcol needs no clang. Its `.BTF`/`.BTF.ext` give the kernel the
//! func_info that `bpf_find_vma`'s callback needs; it has no CO-RE
//! relocations, so loading it never parses the kernel's whole BTF (the few
//! kernel struct offsets the unwinder reads come from [`btf`]).
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
    /// `u32`s: byte offsets of the kernel members the unwinder reads (in
    /// the order of [`crate::btf::VmaOffsets`]'s fields).
    pub const VMA_OFFSETS: [&str; 8] = [
        "cfg_off_vm_start",
        "cfg_off_vm_end",
        "cfg_off_vm_pgoff",
        "cfg_off_vm_file",
        "cfg_off_f_inode",
        "cfg_off_i_ino",
        "cfg_off_i_sb",
        "cfg_off_s_dev",
    ];
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
    /// `u32`: slots for counts in [`super::COUNT_SLOTS_MAP`].
    pub const COUNT_SLOTS: &str = "cfg_count_slots";
}

/// `BPF_MAP_TYPE_HASH` `u64` count key → `u32` slot: the stacks counted in
/// the kernel (see `SampleKind::CpuCounted`).
pub const COUNTS_MAP: &str = "counts";
/// `BPF_MAP_TYPE_ARRAY` (`BPF_F_MMAPABLE`) of `u64`: the count in each
/// slot, then (last element) the next slot never handed out.
pub const COUNT_SLOTS_MAP: &str = "count_slots";
/// `BPF_MAP_TYPE_QUEUE` of `u32`: slots freed by the reader, zeroed.
pub const FREE_SLOTS_MAP: &str = "free_slots";

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
    /// Samples of processes outside `pids` or `targets`, skipped.
    Filtered = 5,
    /// Per-CPU scratch lookup failed (not expected).
    NoScratch = 6,
    /// Uprobe hits (written to the ring or not).
    ProbeHits = 7,
    /// On-CPU samples only counted in [`COUNT_SLOTS_MAP`] (no record).
    Counted = 8,
    /// On-CPU samples written as records because no count slot was left.
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
    ProcEvent, ProcEventKind, Sample, SampleHeader, SampleKind, UnwindEnd, WakeupContext, PROC_EVENT_SIZE,
    SAMPLE_HEADER_SIZE,
};

pub mod unwind;

pub mod python;

/// Off-CPU time (`off_cpu:`): the programs, maps and globals, loaded and
/// attached only when configured.
pub mod off_cpu {
    /// tp_btf program on `sched_switch`: notes sampled threads leaving the
    /// CPU; takes the kernel stack of one back after the threshold.
    pub const SWITCH_PROGRAM: &str = "profcol_off_cpu_switch";
    /// Raw tracepoint program on `sys_exit`: the record of a thread back
    /// from a wait, its user stack walked in its own context.
    pub const PROGRAM: &str = "profcol_off_cpu";
    /// The table walker's, its fill's and the Python walker's raw
    /// tracepoint copies, at their `unwind_progs` indexes in [`PROGS_MAP`].
    pub const WALKERS: [(&str, u32); 3] = [
        ("profcol_off_cpu_unwind", 0),
        ("profcol_off_cpu_unwind_fill", crate::unwind::FILL_INDEX),
        ("profcol_off_cpu_python", crate::python::PROGRAM_INDEX),
    ];
    /// `BPF_MAP_TYPE_PROG_ARRAY` of [`WALKERS`].
    pub const PROGS_MAP: &str = "off_cpu_progs";
    /// tp_btf program on `sched_waking`, run by the waker: the wakeup
    /// record of a followed thread that has waited the threshold.
    pub const WAKING_PROGRAM: &str = "profcol_off_cpu_waking";
    /// The walkers' tp_btf copies for `sched_waking`, as [`WALKERS`].
    pub const WAKER_WALKERS: [(&str, u32); 3] = [
        ("profcol_waker_unwind", 0),
        ("profcol_waker_unwind_fill", crate::unwind::FILL_INDEX),
        ("profcol_waker_python", crate::python::PROGRAM_INDEX),
    ];
    /// `BPF_MAP_TYPE_PROG_ARRAY` of [`WAKER_WALKERS`].
    pub const WAKER_PROGS_MAP: &str = "waker_progs";
    /// `u64`s: `[start, end)` of the kernel's interrupt entry text
    /// (`__irqentry_text_*`), then of its softirq entry text
    /// (`__softirqentry_text_*`); zeros when unknown.
    pub const IRQ_TEXT_GLOBALS: [&str; 4] =
        ["cfg_irq_text_start", "cfg_irq_text_end", "cfg_softirq_text_start", "cfg_softirq_text_end"];
    /// `u64`s: `[start, end)` of `try_to_wake_up` (zeros when unknown): a
    /// waker's kernel stack starts there.
    pub const WAKE_TEXT_GLOBALS: [&str; 2] = ["cfg_wake_text_start", "cfg_wake_text_end"];
    /// `BPF_MAP_TYPE_HASH`, task → when and how it left the CPU.
    pub const STARTS_MAP: &str = "off_cpu_starts";
    /// Threads followed off CPU at once at most ([`STARTS_MAP`]'s entries,
    /// ~100 bytes each, allocated as threads are first followed).
    pub const THREADS: u32 = 65_536;
    /// `u64`: ns off CPU for a record.
    pub const THRESHOLD_GLOBAL: &str = "cfg_off_cpu_threshold_ns";
    /// `u32`: the chance a switch-out is followed, scaled to `u32::MAX`.
    pub const PROBABILITY_GLOBAL: &str = "cfg_off_cpu_probability";
    /// `u32`s: `task_struct.pid`, `.tgid`, `.comm` offsets.
    pub const TASK_GLOBALS: [&str; 3] = ["cfg_off_task_pid", "cfg_off_task_tgid", "cfg_off_task_comm"];
}

pub mod targets;

pub mod btf;

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of ELF64 section `name` of `obj`.
    fn section<'a>(obj: &'a [u8], name: &str) -> Option<&'a [u8]> {
        let u16_at = |at: usize| u16::from_le_bytes(obj[at..at + 2].try_into().unwrap()) as usize;
        let u64_at = |at: usize| u64::from_le_bytes(obj[at..at + 8].try_into().unwrap()) as usize;
        let (shoff, shentsize, shnum, shstrndx) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
        let header = |i: usize| shoff + i * shentsize;
        let strtab = u64_at(header(shstrndx) + 0x18);
        (0..shnum).find_map(|i| {
            let h = header(i);
            let name_at = strtab + u32::from_le_bytes(obj[h..h + 4].try_into().unwrap()) as usize;
            let end = obj[name_at..].iter().position(|&b| b == 0)?;
            (&obj[name_at..name_at + end] == name.as_bytes()).then(|| &obj[u64_at(h + 0x18)..][..u64_at(h + 0x20)])
        })
    }

    #[test]
    fn object_has_btf_without_core_relocations_and_expected_symbols() {
        let obj = cpu_sample_object();
        assert_eq!(&obj[..4], b"\x7fELF");
        assert_eq!(obj.as_ptr() as usize % 8, 0);
        let has = |needle: &[u8]| obj.windows(needle.len()).any(|w| w == needle);
        // BTF for func_info, but no CO-RE relocations: the loader never
        // parses the kernel's BTF.
        let ext = section(obj, ".BTF.ext").expect("the object carries .BTF.ext (bpf_find_vma's callback)");
        assert!(section(obj, ".BTF").is_some());
        let word = |at: usize| u32::from_le_bytes(ext[at..at + 4].try_into().unwrap());
        assert_eq!(&ext[..2], &0xeb9fu16.to_le_bytes(), ".BTF.ext magic");
        assert!(word(16) > 0, "func_info present");
        if word(4) >= 32 {
            assert_eq!(word(28), 0, "no CO-RE relocations");
        }
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
            unwind::FILES_MAP,
            unwind::WANTED_MAP,
            unwind::FILL_PROGRAM,
            python::PROGRAM,
            python::PROCS_MAP,
            python::FILES_MAP,
            python::THREADS_MAP,
            python::FSBASE_OFFSET_GLOBAL,
            globals::UNWIND_MODE,
            globals::COUNT_IN_KERNEL,
            globals::KTEXT_START,
            globals::KTEXT_END,
            globals::COUNT_BY,
            globals::COUNT_SEED,
            globals::COUNT_SLOTS,
            COUNTS_MAP,
            COUNT_SLOTS_MAP,
            FREE_SLOTS_MAP,
        ] {
            assert!(has(name.as_bytes()), "{name} missing from object");
        }
    }
}
