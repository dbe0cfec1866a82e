//! Loading the BPF object with aya and attaching it to one software
//! cpu-clock perf event per online CPU.
//!
//! The object has no BTF and no CO-RE relocations, so aya 0.16 never reads
//! `/sys/kernel/btf/vmlinux` (it parses kernel BTF lazily, only for programs
//! that need relocating); `tests/ebpf_btf.rs` checks that it is not opened.

use super::privileges::{perf_open_hint, Privileges};
use crate::ebpf::config::{proc_event_ring_bytes, EbpfConfig};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{
    PerfEventConfig, PerfEventGroup, PerfEventLink, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope};
use aya::programs::{PerfEvent, ProgramError, RawTracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
use profcol_ebpf as obj;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// A loaded and attached sampler. Dropping it detaches every perf event and
/// unloads the program.
pub(crate) struct Loaded {
    /// Live perf event of each sampled CPU (dropping one detaches it).
    events: BTreeMap<u32, CpuEvent>,
    /// CPUs whose attach failed, with the time of the next attempt.
    retry: BTreeMap<u32, Retry>,
    sample_frequency: u64,
    /// Owns the program.
    ebpf: Ebpf,
    pub ring: RingBuf<MapData>,
    pub stats: PerCpuArray<MapData, u64>,
    /// Exec/exit events (`None` when the raw tracepoints could not be
    /// attached and no probe needs them).
    pub proc_events: Option<ProcEvents>,
    /// Whether the uprobe program is loaded (probes configured).
    pub uprobes_loaded: bool,
    /// The unwinder's maps (`None` with `unwind.mode: frame_pointers`).
    pub unwind_maps: Option<crate::ebpf::unwind::kernel::KernelMaps>,
    /// Samples counted in the kernel (`None` unless `count_in_kernel`).
    pub counts: Option<crate::ebpf::stacks::counted::KernelCounts>,
    /// The Python walker's maps the receiver writes (`None` when it is off
    /// or did not load).
    pub python_procs: Option<crate::ebpf::interp::processes::WalkerMaps>,
    /// Whether the Python walker program is loaded, or waits for the first
    /// Python process.
    python_walker: PythonWalker,
    /// `targets`' verdict maps and asks (`None` unless configured).
    pub targets: Option<crate::ebpf::targets::kernel::TargetMaps>,
}

/// The Python walker program's state. The kernel's verifier spends about
/// 90 ms of the agent's start-up CPU on it, so it is loaded when the first
/// Python process is found (a host without Python never pays for it), or
/// at start with `off_cpu` (whose walker copies are loaded there and then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PythonWalker {
    Off,
    Deferred,
    Loaded,
    Failed,
}

/// The process-discovery ring and its loss counter.
pub(crate) struct ProcEvents {
    pub ring: RingBuf<MapData>,
    pub lost: PerCpuArray<MapData, u64>,
}

impl ProcEvents {
    /// Events lost so far because the ring was full.
    pub(crate) fn lost(&self) -> u64 {
        self.lost.get(&0, 0).map_or(0, |v| v.iter().copied().fold(0u64, u64::wrapping_add))
    }
}

/// Why the sampler could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error("{0}")]
    Privileges(#[from] super::privileges::PrivilegeError),
    #[error("{0}")]
    Other(String),
}

/// `err` and its sources, joined with ": ".
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let m = e.to_string();
        if !s.contains(&m) {
            let _ = write!(s, ": {m}");
        }
        cur = e.source();
    }
    s
}

fn other(context: &str, err: &dyn std::error::Error) -> LoadError {
    LoadError::Other(format!("{context}: {}", chain(err)))
}

/// Raises RLIMIT_MEMLOCK for kernels that still charge BPF memory to it
/// (before 5.11); harmless elsewhere. Best effort.
fn raise_memlock() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: lim is a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK (fine on kernels >= 5.11)");
    }
}

/// Loads the program and its maps, without attaching; the sample ring is
/// sized for `cpus` online CPUs.
pub(crate) fn load_program(cfg: &EbpfConfig, cpus: usize) -> Result<(Ebpf, PythonWalker), LoadError> {
    let privs = Privileges::current();
    privs.check()?;
    raise_memlock();

    let depth = cfg.max_stack_depth;
    let exclude_idle = u32::from(cfg.exclude_idle);
    let filter_pids = u32::from(!cfg.pids.is_empty());
    let targets = u32::from(cfg.targets.is_set());
    let self_tgid = std::process::id();
    let unwind = unwind_sizes(cfg);
    let counting = CountingGlobals::new(cfg);
    let off_cpu = cfg.off_cpu;
    // What the off-CPU program reads of a thread coming back on CPU.
    let task_ids = match off_cpu {
        None => [0u32; 3],
        Some(_) => obj::btf::VmaOffsets::from_kernel()
            .map_err(LoadError::Other)?
            .task_ids
            .ok_or_else(|| LoadError::Other("off_cpu: the kernel's BTF has no task_struct pid, tgid or comm".into()))?,
    };
    // Where interrupts enter the kernel: a wakeup from one is not the
    // interrupted thread's.
    let texts = match off_cpu {
        None => Default::default(),
        Some(_) => crate::ebpf::off_cpu::wake_texts(),
    };
    // The kernel members the unwinder reads, from the kernel's BTF.
    // `task_struct.thread.fsbase` for the Python walker (0: off).
    let mut fsbase = 0u32;
    let offsets = if unwind.mode == obj::unwind::Mode::FramePointers {
        [0u32; 8]
    } else {
        match obj::btf::VmaOffsets::from_kernel() {
            Ok(o) => {
                if cfg.interpreters.contains(&crate::ebpf::config::Interpreter::Python) {
                    fsbase = o.task_fsbase.unwrap_or_else(|| {
                        tracing::warn!(
                            "ebpf receiver: the kernel's BTF has no task_struct.thread.fsbase; Python frames are \
                             not walked"
                        );
                        0
                    });
                }
                [o.vm_start, o.vm_end, o.vm_pgoff, o.vm_file, o.f_inode, o.i_ino, o.i_sb, o.s_dev]
            }
            Err(e) if cfg.unwind.mode == crate::ebpf::config::UnwindMode::Auto => {
                tracing::warn!(
                    "ebpf receiver: unwind tables need the kernel's BTF ({e}); user stacks by frame pointers only"
                );
                let mut fp = cfg.clone();
                fp.unwind.mode = crate::ebpf::config::UnwindMode::FramePointers;
                return load_program(&fp, cpus);
            }
            Err(e) => {
                return Err(LoadError::Other(format!(
                    "unwind: mode tables needs the kernel's BTF: {e}; set `unwind: {{ mode: auto }}` or \
                     `frame_pointers`"
                )))
            }
        }
    };
    let mut loader = EbpfLoader::new();
    for (name, value) in obj::globals::VMA_OFFSETS.iter().zip(&offsets) {
        loader.override_global(name, value, true);
    }
    let mut ebpf = loader
        .override_global(obj::python::FSBASE_OFFSET_GLOBAL, &fsbase, true)
        .map_max_entries(obj::python::THREADS_MAP, if fsbase != 0 { obj::python::THREADS_CAPACITY } else { 1 })
        .override_global(obj::globals::UNWIND_MODE, &(unwind.mode as u32), true)
        .map_max_entries(obj::unwind::ROWS_MAP, unwind.row_elems.div_ceil(obj::unwind::CHUNK_ELEMS))
        .map_max_entries(obj::unwind::PAGES_MAP, unwind.pages)
        .override_global(obj::globals::MAX_STACK_DEPTH, &depth, true)
        .override_global(obj::globals::EXCLUDE_IDLE, &exclude_idle, true)
        .override_global(obj::globals::FILTER_PIDS, &filter_pids, true)
        // Preallocated: one entry when no `pids` are set (never read then).
        .map_max_entries(obj::PID_FILTER_MAP, if filter_pids != 0 { obj::PID_FILTER_CAPACITY as u32 } else { 1 })
        .override_global(obj::targets::ENABLED_GLOBAL, &targets, true)
        // LRU maps are allocated whole: one entry each when unused.
        .map_max_entries(obj::targets::CGROUPS_MAP, if targets != 0 { obj::targets::CAPACITY } else { 1 })
        .map_max_entries(obj::targets::PROCS_MAP, if targets != 0 { obj::targets::CAPACITY } else { 1 })
        .map_max_entries(
            obj::targets::ASKS_MAP,
            if targets != 0 { 1 << 14 } else { profcol_ebpf::sys::page_size() as u32 },
        )
        .override_global(obj::globals::SELF_TGID, &self_tgid, true)
        .map_max_entries(obj::EVENTS_MAP, cfg.ring_bytes(cpus))
        .map_max_entries(obj::PROC_EVENTS_MAP, proc_event_ring_bytes(cpus))
        .override_global(obj::globals::COUNT_IN_KERNEL, &counting.enabled, true)
        .override_global(obj::globals::KTEXT_START, &counting.ktext.0, true)
        .override_global(obj::globals::KTEXT_END, &counting.ktext.1, true)
        .override_global(obj::globals::COUNT_BY, &counting.by, true)
        .override_global(obj::globals::COUNT_SEED, &counting.seed, true)
        .override_global(obj::globals::COUNT_SLOTS, &counting.slots, true)
        .map_max_entries(obj::COUNTS_MAP, counting.slots)
        .map_max_entries(obj::COUNT_SLOTS_MAP, counting.slots + 1)
        .map_max_entries(obj::FREE_SLOTS_MAP, counting.slots)
        .override_global(obj::off_cpu::TASK_GLOBALS[0], &task_ids[0], true)
        .override_global(obj::off_cpu::TASK_GLOBALS[1], &task_ids[1], true)
        .override_global(obj::off_cpu::TASK_GLOBALS[2], &task_ids[2], true)
        .override_global(obj::off_cpu::THRESHOLD_GLOBAL, &off_cpu.map_or(0, |o| o.threshold_ns()), true)
        .map_max_entries(obj::off_cpu::STARTS_MAP, if off_cpu.is_some() { obj::off_cpu::THREADS } else { 1 })
        .override_global(obj::off_cpu::PROBABILITY_GLOBAL, &off_cpu.map_or(0, |o| o.probability_scaled()), true)
        .override_global(obj::off_cpu::IRQ_TEXT_GLOBALS[0], &texts.irq.0, true)
        .override_global(obj::off_cpu::IRQ_TEXT_GLOBALS[1], &texts.irq.1, true)
        .override_global(obj::off_cpu::IRQ_TEXT_GLOBALS[2], &texts.softirq.0, true)
        .override_global(obj::off_cpu::IRQ_TEXT_GLOBALS[3], &texts.softirq.1, true)
        .override_global(obj::off_cpu::WAKE_TEXT_GLOBALS[0], &texts.wake.0, true)
        .override_global(obj::off_cpu::WAKE_TEXT_GLOBALS[1], &texts.wake.1, true)
        .load(obj::cpu_sample_object())
        .map_err(|e| other("loading the BPF object (maps)", &e))?;

    if !cfg.pids.is_empty() {
        let map = ebpf
            .map_mut(obj::PID_FILTER_MAP)
            .ok_or_else(|| LoadError::Other("BPF object lacks the pid_filter map".into()))?;
        let mut filter: BpfHashMap<_, u32, u8> = BpfHashMap::try_from(map).map_err(|e| other("pid_filter map", &e))?;
        for pid in &cfg.pids {
            filter.insert(pid, &1u8, 0).map_err(|e| other(&format!("adding pid {pid} to the pid filter"), &e))?;
        }
    }

    let prog: &mut PerfEvent = ebpf
        .program_mut(obj::PROGRAM_NAME)
        .ok_or_else(|| LoadError::Other(format!("BPF object lacks program {}", obj::PROGRAM_NAME)))?
        .try_into()
        .map_err(|e: ProgramError| other("BPF program type", &e))?;
    prog.load().map_err(|e| other("the kernel refused the BPF program", &e))?;
    if unwind.mode != obj::unwind::Mode::FramePointers {
        if let Err(e) = load_unwind_program(&mut ebpf) {
            if cfg.unwind.mode != crate::ebpf::config::UnwindMode::Auto {
                return Err(e);
            }
            // The default must not stop a kernel without it from profiling.
            tracing::warn!("ebpf receiver: {e}; user stacks by frame pointers only");
            let mut fp = cfg.clone();
            fp.unwind.mode = crate::ebpf::config::UnwindMode::FramePointers;
            return load_program(&fp, cpus);
        }
        if fsbase != 0 && cfg.off_cpu.is_some() {
            if let Err(e) = load_python_program(&mut ebpf) {
                // Profiling goes on without Python frames.
                tracing::warn!("ebpf receiver: {e}; Python frames are not walked");
                let mut off = cfg.clone();
                off.interpreters.clear();
                return load_program(&off, cpus);
            }
        }
    }
    if !cfg.uprobes.is_empty() {
        load_uprobe_program(&mut ebpf)?;
    }
    let python = if unwind.mode == obj::unwind::Mode::FramePointers || fsbase == 0 {
        PythonWalker::Off
    } else if cfg.off_cpu.is_some() {
        PythonWalker::Loaded
    } else {
        PythonWalker::Deferred
    };
    Ok((ebpf, python))
}

/// Off-CPU time (`off_cpu:`): the walkers' copies into their tail-call
/// arrays (those whose perf-event copy loaded), then the sys_exit program,
/// the sched_waking one and the sched_switch one.
fn attach_off_cpu(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    use aya::programs::BtfTracePoint;
    let btf = aya::Btf::from_sys_fs().map_err(|e| {
        other(
            "off_cpu: it needs the kernel's BTF (/sys/kernel/btf/vmlinux); remove `off_cpu` to profile without it",
            &e,
        )
    })?;
    set_walkers(ebpf, &obj::off_cpu::WALKERS, obj::off_cpu::PROGS_MAP, |ebpf, name| {
        let prog: &mut RawTracePoint = program_of(ebpf, name)?;
        prog.load().map_err(|e| other(&format!("off_cpu: the kernel refused the walker {name}"), &e))?;
        prog.fd().map_err(|e| other("off-CPU walker fd", &e))?.try_clone().map_err(|e| other("off-CPU walker fd", &e))
    })?;
    // A tracing program tail-calls only programs loaded for its own
    // attach point: these copies are loaded for sched_waking, never attached.
    set_walkers(ebpf, &obj::off_cpu::WAKER_WALKERS, obj::off_cpu::WAKER_PROGS_MAP, |ebpf, name| {
        let prog: &mut BtfTracePoint = program_of(ebpf, name)?;
        prog.load("sched_waking", &btf)
            .map_err(|e| other(&format!("off_cpu: the kernel refused the waker walker {name}"), &e))?;
        prog.fd().map_err(|e| other("waker walker fd", &e))?.try_clone().map_err(|e| other("waker walker fd", &e))
    })?;
    let prog: &mut RawTracePoint = program_of(ebpf, obj::off_cpu::PROGRAM)?;
    prog.load().map_err(|e| other("off_cpu: the kernel refused the sys_exit program", &e))?;
    prog.attach("sys_exit").map_err(|e| other("off_cpu: attaching the raw tracepoint sys_exit", &e))?;
    let prog: &mut BtfTracePoint = program_of(ebpf, obj::off_cpu::WAKING_PROGRAM)?;
    prog.load("sched_waking", &btf).map_err(|e| other("off_cpu: the kernel refused the sched_waking program", &e))?;
    prog.attach().map_err(|e| other("off_cpu: attaching to the sched_waking tracepoint (tp_btf)", &e))?;
    let prog: &mut BtfTracePoint = program_of(ebpf, obj::off_cpu::SWITCH_PROGRAM)?;
    prog.load("sched_switch", &btf).map_err(|e| other("off_cpu: the kernel refused the sched_switch program", &e))?;
    prog.attach().map_err(|e| other("off_cpu: attaching to the sched_switch tracepoint (tp_btf)", &e))?;
    Ok(())
}

/// Program `name` of the object, as type `P`.
fn program_of<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P, LoadError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| LoadError::Other(format!("BPF object lacks program {name}")))?
        .try_into()
        .map_err(|e: ProgramError| other("BPF program type", &e))
}

/// Loads each copy in `walkers` (by `load`, which returns its fd) whose
/// on-CPU walker loaded, and puts it at its index of tail-call array `map`.
fn set_walkers(
    ebpf: &mut Ebpf,
    walkers: &[(&str, u32)],
    map: &str,
    mut load: impl FnMut(&mut Ebpf, &str) -> Result<aya::programs::ProgramFd, LoadError>,
) -> Result<(), LoadError> {
    use aya::maps::ProgramArray;
    let mut fds = Vec::new();
    for &(name, index) in walkers {
        let on_cpu = match index {
            0 => obj::unwind::PROGRAM,
            i if i == obj::unwind::FILL_INDEX => obj::unwind::FILL_PROGRAM,
            _ => obj::python::PROGRAM,
        };
        if ebpf.program(on_cpu).is_none_or(|p| p.fd().is_err()) {
            continue;
        }
        fds.push((index, load(ebpf, name)?));
    }
    let mut progs = ProgramArray::try_from(
        ebpf.map_mut(map).ok_or_else(|| LoadError::Other(format!("BPF object lacks the {map} map")))?,
    )
    .map_err(|e| other(&format!("{map} map"), &e))?;
    for (index, fd) in &fds {
        progs.set(*index, fd, 0).map_err(|e| other(&format!("{map}: setting the tail call"), &e))?;
    }
    Ok(())
}

/// The `.rodata` of counting in the kernel (`count_in_kernel`).
struct CountingGlobals {
    enabled: u32,
    /// The kernel's own text, `(0, 0)` when unknown: then only samples
    /// without kernel frames are counted.
    ktext: (u64, u64),
    by: u32,
    seed: u64,
    /// Count slots (`max_counted_stacks`; 1 when off: maps need one).
    slots: u32,
}

impl CountingGlobals {
    fn new(cfg: &EbpfConfig) -> Self {
        use crate::ebpf::config::SampleAttribute;
        if !cfg.count_in_kernel {
            return CountingGlobals { enabled: 0, ktext: (0, 0), by: 0, seed: 0, slots: 1 };
        }
        let ktext = crate::ebpf::stacks::kernel_text::read().unwrap_or_else(|| {
            tracing::info!(
                "ebpf receiver: the kernel's text range is not visible (kallsyms/iomem show zeros); samples with \
                 kernel frames are sent one by one, only user-only stacks are counted in the kernel"
            );
            (0, 0)
        });
        let mut by = 0;
        for a in &cfg.sample_attributes {
            by |= match a {
                SampleAttribute::ThreadId => obj::count_by::TID,
                SampleAttribute::ThreadName => obj::count_by::COMM,
                SampleAttribute::CpuLogicalNumber => obj::count_by::CPU,
            };
        }
        let mut seed = [0u8; 8];
        // SAFETY: getrandom writes at most seed.len() bytes into seed.
        let got = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
        if got != seed.len() as isize {
            // Not secret, only unpredictable to a sampled program shaping
            // its stacks: the time will do.
            seed = profcol_ebpf::clock::now_ns(libc::CLOCK_MONOTONIC).to_ne_bytes();
        }
        CountingGlobals { enabled: 1, ktext, by, seed: u64::from_ne_bytes(seed), slots: cfg.max_counted_stacks }
    }
}

/// Map sizes and mode of the unwinder, from `unwind:`.
pub(crate) struct UnwindSizes {
    pub mode: obj::unwind::Mode,
    /// Elements (two rows, 8 bytes) of the row array.
    pub row_elems: u32,
    /// Entries of the page map.
    pub pages: u32,
}

/// One page entry per this many bytes of the budget. The hash map's
/// buckets (16 bytes per entry) are kernel memory from the start, entries
/// or not. C, C++ and Rust tables take 3.5–8 KiB per page (hundreds of
/// rows); Go binaries far less (their Go code is frame-pointer code, a row
/// or two per page: 26–81 bytes), so the default 16 MiB still holds 16,384
/// pages: 1 GiB of code. Past that, least recently used tables go.
const BYTES_PER_PAGE_ENTRY: u64 = 1024;

pub(crate) fn unwind_sizes(cfg: &EbpfConfig) -> UnwindSizes {
    use crate::ebpf::config::UnwindMode;
    let mode = match cfg.unwind.mode {
        UnwindMode::Auto => obj::unwind::Mode::Auto,
        UnwindMode::FramePointers => obj::unwind::Mode::FramePointers,
        UnwindMode::Tables => obj::unwind::Mode::Tables,
    };
    if mode == obj::unwind::Mode::FramePointers {
        // Nothing is loaded: the smallest maps the kernel accepts.
        return UnwindSizes { mode, row_elems: 1, pages: 1 };
    }
    let bytes = cfg.unwind.max_table_bytes;
    UnwindSizes {
        mode,
        row_elems: (bytes / 8).clamp(1, u64::from(u32::MAX)) as u32,
        pages: (bytes / BYTES_PER_PAGE_ENTRY).clamp(1024, 1 << 22) as u32,
    }
}

/// Loads the table-walking programs and puts them in the tail-call array.
fn load_unwind_program(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    use aya::maps::ProgramArray;
    let mut fds = Vec::with_capacity(2);
    for (name, index) in [(obj::unwind::PROGRAM, 0), (obj::unwind::FILL_PROGRAM, obj::unwind::FILL_INDEX)] {
        let prog: &mut PerfEvent = ebpf
            .program_mut(name)
            .ok_or_else(|| LoadError::Other(format!("BPF object lacks program {name}")))?
            .try_into()
            .map_err(|e: ProgramError| other("BPF program type", &e))?;
        prog.load().map_err(|e| {
            other(
                &format!(
                    "unwind: the kernel refused the table-walking BPF program {name} (it needs bpf_task_pt_regs and \
                     bpf_find_vma, Linux >= 5.17, and kernel BTF); set `unwind: {{ mode: frame_pointers }}` to \
                     profile without it"
                ),
                &e,
            )
        })?;
        let fd = prog
            .fd()
            .map_err(|e| other("unwind program fd", &e))?
            .try_clone()
            .map_err(|e| LoadError::Other(format!("unwind program fd: {e}")))?;
        fds.push((index, fd));
    }
    let mut progs = ProgramArray::try_from(
        ebpf.map_mut(obj::unwind::PROGS_MAP)
            .ok_or_else(|| LoadError::Other("BPF object lacks the unwind_progs map".into()))?,
    )
    .map_err(|e| other("unwind_progs map", &e))?;
    for (index, fd) in &fds {
        progs.set(*index, fd, 0).map_err(|e| other("unwind_progs: setting the tail call", &e))?;
    }
    Ok(())
}

/// Loads the Python walker and puts it in the tail-call array.
fn load_python_program(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    use aya::maps::ProgramArray;
    let name = obj::python::PROGRAM;
    let prog: &mut PerfEvent = ebpf
        .program_mut(name)
        .ok_or_else(|| LoadError::Other(format!("BPF object lacks program {name}")))?
        .try_into()
        .map_err(|e: ProgramError| other("BPF program type", &e))?;
    prog.load().map_err(|e| other(&format!("the kernel refused the Python walker {name}"), &e))?;
    let fd = prog
        .fd()
        .map_err(|e| other("python program fd", &e))?
        .try_clone()
        .map_err(|e| LoadError::Other(format!("python program fd: {e}")))?;
    let mut progs = ProgramArray::try_from(
        ebpf.map_mut(obj::unwind::PROGS_MAP)
            .ok_or_else(|| LoadError::Other("BPF object lacks the unwind_progs map".into()))?,
    )
    .map_err(|e| other("unwind_progs map", &e))?;
    progs.set(obj::python::PROGRAM_INDEX, &fd, 0).map_err(|e| other("unwind_progs: the Python walker", &e))
}

/// Takes the unwinder's maps from the loaded object.
fn take_unwind_maps(ebpf: &mut Ebpf) -> Result<crate::ebpf::unwind::kernel::KernelMaps, LoadError> {
    let mut take =
        |name: &str| ebpf.take_map(name).ok_or_else(|| LoadError::Other(format!("BPF object lacks the {name} map")));
    let rows = match take(obj::unwind::ROWS_MAP)? {
        aya::maps::Map::ArrayOfMaps(data) => {
            let slots = data.info().map_err(|e| other("unwind_rows", &e))?.max_entries();
            crate::ebpf::unwind::kernel::RowChunks::new(data, slots)
        }
        _ => return Err(LoadError::Other("unwind_rows is not an array of maps".into())),
    };
    let pages = BpfHashMap::try_from(take(obj::unwind::PAGES_MAP)?).map_err(|e| other("unwind_pages", &e))?;
    let rules = aya::maps::Array::try_from(take(obj::unwind::RULES_MAP)?).map_err(|e| other("unwind_rules", &e))?;
    let files = BpfHashMap::try_from(take(obj::unwind::FILES_MAP)?).map_err(|e| other("unwind_files", &e))?;
    let wanted = BpfHashMap::try_from(take(obj::unwind::WANTED_MAP)?).map_err(|e| other("unwind_wanted", &e))?;
    Ok(crate::ebpf::unwind::kernel::KernelMaps { rows, pages, rules, files, wanted })
}

/// The maps of counting in the kernel, the slots' counts mapped into memory.
fn take_count_maps(ebpf: &mut Ebpf, slots: u32) -> Result<crate::ebpf::stacks::counted::KernelCounts, LoadError> {
    let mut take =
        |name: &str| ebpf.take_map(name).ok_or_else(|| LoadError::Other(format!("BPF object lacks the {name} map")));
    let keys = match take(obj::COUNTS_MAP)? {
        aya::maps::Map::HashMap(d) => d,
        _ => return Err(LoadError::Other("the counts map is not a hash map".into())),
    };
    let counts = match take(obj::COUNT_SLOTS_MAP)? {
        aya::maps::Map::Array(d) => d,
        _ => return Err(LoadError::Other("the count_slots map is not an array".into())),
    };
    let free = match take(obj::FREE_SLOTS_MAP)? {
        aya::maps::Map::Queue(d) => d,
        _ => return Err(LoadError::Other("the free_slots map is not a queue".into())),
    };
    crate::ebpf::stacks::counted::KernelCounts::new(keys, counts, free, slots)
        .map_err(|e| LoadError::Other(format!("mapping the count slots into memory: {e}")))
}

/// Loads the uprobe program; the error names what the kernel lacks.
fn load_uprobe_program(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    const PMU_TYPE: &str = "/sys/bus/event_source/devices/uprobe/type";
    if !std::path::Path::new(PMU_TYPE).exists() {
        return Err(LoadError::Other(format!(
            "uprobes: this kernel has no uprobe PMU ({PMU_TYPE} is missing): it needs CONFIG_UPROBE_EVENTS=y; \
             remove `uprobes` from the config to profile without them"
        )));
    }
    let prog: &mut UProbe = ebpf
        .program_mut(obj::UPROBE_PROGRAM)
        .ok_or_else(|| LoadError::Other(format!("BPF object lacks program {}", obj::UPROBE_PROGRAM)))?
        .try_into()
        .map_err(|e: ProgramError| other("BPF program type", &e))?;
    prog.load().map_err(|e| {
        other("uprobes: the kernel refused the uprobe BPF program (it needs bpf_get_attach_cookie, Linux >= 5.15)", &e)
    })
}

/// Attaches the raw tracepoint programs on sched_process_exec and
/// sched_process_exit (no tracefs and no BTF needed) and takes their ring.
fn attach_proc_events(ebpf: &mut Ebpf) -> Result<ProcEvents, LoadError> {
    for (name, tp) in [(obj::EXEC_PROGRAM, "sched_process_exec"), (obj::EXIT_PROGRAM, "sched_process_exit")] {
        let prog: &mut RawTracePoint = ebpf
            .program_mut(name)
            .ok_or_else(|| LoadError::Other(format!("BPF object lacks program {name}")))?
            .try_into()
            .map_err(|e: ProgramError| other("BPF program type", &e))?;
        prog.load().map_err(|e| other(&format!("the kernel refused the {tp} program"), &e))?;
        prog.attach(tp).map_err(|e| other(&format!("attaching the raw tracepoint {tp}"), &e))?;
    }
    let ring = RingBuf::try_from(
        ebpf.take_map(obj::PROC_EVENTS_MAP)
            .ok_or_else(|| LoadError::Other("BPF object lacks the proc_events map".into()))?,
    )
    .map_err(|e| other("proc_events ring buffer", &e))?;
    let lost = PerCpuArray::try_from(
        ebpf.take_map(obj::PROC_EVENT_LOST_MAP)
            .ok_or_else(|| LoadError::Other("BPF object lacks the proc_event_lost map".into()))?,
    )
    .map_err(|e| other("proc_event_lost map", &e))?;
    Ok(ProcEvents { ring, lost })
}

/// The maps of `targets`, which the reader writes verdicts into.
fn take_target_maps(ebpf: &mut Ebpf) -> Result<crate::ebpf::targets::kernel::TargetMaps, LoadError> {
    use obj::targets::{ASKS_MAP, CGROUPS_MAP, PROCS_MAP};
    let mut take =
        |name: &str| ebpf.take_map(name).ok_or_else(|| LoadError::Other(format!("BPF object lacks the {name} map")));
    let cgroups = BpfHashMap::try_from(take(CGROUPS_MAP)?).map_err(|e| other(CGROUPS_MAP, &e))?;
    let procs = BpfHashMap::try_from(take(PROCS_MAP)?).map_err(|e| other(PROCS_MAP, &e))?;
    let asks = RingBuf::try_from(take(ASKS_MAP)?).map_err(|e| other(ASKS_MAP, &e))?;
    Ok(crate::ebpf::targets::kernel::TargetMaps { cgroups, procs, asks })
}

/// Attaches uprobes through the loaded uprobe program.
pub(crate) struct KernelAttacher<'a> {
    prog: Option<&'a mut UProbe>,
}

impl crate::ebpf::uprobes::Attacher for KernelAttacher<'_> {
    type Link = UProbeLink;

    fn attach(&mut self, file: &std::fs::File, offset: u64, cookie: u32) -> Result<UProbeLink, UprobeAttachError> {
        use crate::ebpf::uprobes::FailureReason;
        use std::os::fd::AsRawFd;
        let Some(prog) = self.prog.as_deref_mut() else {
            return Err(UprobeAttachError {
                reason: FailureReason::Other,
                message: "uprobe program not loaded".into(),
            });
        };
        // The kernel resolves the magic link to the file we opened (in the
        // target's mount namespace), so the probe lands on that inode.
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let point =
            UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(cookie.into()) };
        let fail = |e: &(dyn std::error::Error + 'static)| UprobeAttachError {
            reason: FailureReason::from_errno(errno_of(e)),
            message: format!("{} (offset {offset:#x}): {}", path, chain(e)),
        };
        let id = prog.attach([point], &path, UProbeScope::AllProcesses).map_err(|e| fail(&e))?;
        prog.take_link(id).map_err(|e| fail(&e))
    }
}

use crate::ebpf::uprobes::AttachError as UprobeAttachError;

/// The first OS error in `e`'s source chain.
fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        if let Some(sys) = err.downcast_ref::<aya::sys::SyscallError>() {
            return sys.io_error.raw_os_error();
        }
        cur = err.source();
    }
    None
}

/// Loads the program, attaches one cpu-clock perf event per online CPU, and
/// takes the maps the reader needs. Start fails only when no CPU could be
/// attached (with the explained reason of the first failure); CPUs that
/// failed while others worked are in the returned [`CpuSync`] and are
/// retried by [`Loaded::sync_cpus`].
pub(crate) fn load_and_attach(cfg: &EbpfConfig) -> Result<(Loaded, CpuSync), LoadError> {
    let online =
        profcol_ebpf::sys::online_cpus().map_err(|e| LoadError::Other(format!("reading the online CPUs: {e}")))?;
    // Samples come from every online CPU; the ring is sized for them.
    let (mut ebpf, python_walker) = load_program(cfg, online.len())?;
    let ring = RingBuf::try_from(
        ebpf.take_map(obj::EVENTS_MAP).ok_or_else(|| LoadError::Other("BPF object lacks the events map".into()))?,
    )
    .map_err(|e| other("events ring buffer", &e))?;
    let stats = PerCpuArray::try_from(
        ebpf.take_map(obj::STATS_MAP).ok_or_else(|| LoadError::Other("BPF object lacks the stats map".into()))?,
    )
    .map_err(|e| other("stats map", &e))?;
    // Process discovery is always on; only probes need it to work.
    let proc_events = match attach_proc_events(&mut ebpf) {
        Ok(p) => Some(p),
        Err(e) if cfg.uprobes.is_empty() => {
            tracing::warn!("ebpf receiver: no exec/exit events ({e}); processes are found from samples only");
            None
        }
        Err(e) => return Err(LoadError::Other(format!("uprobes need exec/exit events: {e}"))),
    };
    if cfg.off_cpu.is_some() {
        attach_off_cpu(&mut ebpf)?;
    }
    // Tables only when the table-walking program loaded (`auto` falls
    // back to frame pointers without it).
    let unwind_loaded = ebpf.program(obj::unwind::PROGRAM).is_some_and(|p| p.fd().is_ok());
    let unwind_maps = if unwind_loaded { Some(take_unwind_maps(&mut ebpf)?) } else { None };
    let counts = if cfg.count_in_kernel { Some(take_count_maps(&mut ebpf, cfg.max_counted_stacks)?) } else { None };
    let python_walker = if unwind_loaded { python_walker } else { PythonWalker::Off };
    let python_procs = if python_walker != PythonWalker::Off {
        let mut take = |name: &str| {
            let map =
                ebpf.take_map(name).ok_or_else(|| LoadError::Other(format!("BPF object lacks the {name} map")))?;
            BpfHashMap::try_from(map).map_err(|e| other(name, &e))
        };
        let procs = take(obj::python::PROCS_MAP)?;
        let map = ebpf
            .take_map(obj::python::FILES_MAP)
            .ok_or_else(|| LoadError::Other("BPF object lacks the py_files map".into()))?;
        let files = BpfHashMap::try_from(map).map_err(|e| other("py_files", &e))?;
        Some(crate::ebpf::interp::processes::WalkerMaps { procs, files })
    } else {
        None
    };
    let targets = if cfg.targets.is_set() { Some(take_target_maps(&mut ebpf)?) } else { None };
    let mut loaded = Loaded {
        targets,
        unwind_maps,
        counts,
        python_procs,
        python_walker,
        events: BTreeMap::new(),
        retry: BTreeMap::new(),
        sample_frequency: cfg.sample_frequency,
        ebpf,
        ring,
        stats,
        proc_events,
        uprobes_loaded: !cfg.uprobes.is_empty(),
    };
    let sync = loaded.sync_cpus(&online, Instant::now())?;
    if loaded.events.is_empty() {
        return Err(LoadError::Other(match sync.failed.first() {
            Some(f) => f.message.clone(),
            None => "no online CPU could be sampled".into(),
        }));
    }
    Ok((loaded, sync))
}

/// Backoff of the retries of a CPU whose perf event could not be attached.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// One CPU's sampling perf event and its liveness probe.
///
/// When a CPU goes offline the kernel tears down every per-CPU perf event
/// of that CPU, and they stay dead when the CPU comes back (checked on 6.18:
/// the count and the enabled time freeze, enabling them again does not
/// revive them; a freshly opened event works). The BPF link hides the
/// sampling event's fd, so a counting cpu-clock event is opened on the same
/// CPU next to it: both die together, and a probe whose enabled time did not
/// move since the last check means the CPU went offline and came back in
/// between (or was suspended), so the pair is replaced.
struct CpuEvent {
    /// Detaches the program and closes the perf event when dropped.
    _link: PerfEventLink,
    /// Counting only (no sample period, so no timer and no interrupts).
    probe: PerfEventGroup,
    enabled_ns: u64,
}

impl CpuEvent {
    /// Whether the probe's enabled time moved since the last call.
    fn alive(&mut self) -> bool {
        match self.probe.read() {
            Ok(r) => {
                let moved = r.enabled_nanos != self.enabled_ns;
                self.enabled_ns = r.enabled_nanos;
                moved
            }
            Err(_) => false,
        }
    }
}

struct Retry {
    at: Instant,
    delay: Duration,
}

/// What [`Loaded::sync_cpus`] changed.
#[derive(Debug, Default)]
pub(crate) struct CpuSync {
    /// CPUs that got a perf event (came online, or failed before).
    pub added: Vec<u32>,
    /// CPUs seen offline: their perf event was detached.
    pub removed: Vec<u32>,
    /// CPUs whose perf event had died although the CPU is online (it went
    /// offline and came back between two checks): replaced by a fresh one.
    pub revived: Vec<u32>,
    /// CPUs that could not be attached (retried later, with backoff).
    pub failed: Vec<AttachFailure>,
}

impl CpuSync {
    /// Whether the set of sampled CPUs changed.
    pub(crate) fn changed(&self) -> bool {
        !self.added.is_empty() || !self.removed.is_empty()
    }
}

/// A CPU whose perf event could not be attached.
#[derive(Debug)]
pub(crate) struct AttachFailure {
    pub cpu: u32,
    /// Explained, as for start-up errors.
    pub message: String,
    /// First failure since the CPU was last sampled or offline (later
    /// retries are not worth a warning each).
    pub first: bool,
}

enum AttachError {
    /// ENODEV: the CPU is offline (it went away since the online list was read).
    Offline,
    Failed(String),
}

fn attach_cpu(prog: &mut PerfEvent, cpu: u32, frequency: u64) -> Result<CpuEvent, AttachError> {
    let explain = |io: &std::io::Error, what: &str| {
        if io.raw_os_error() == Some(libc::ENODEV) {
            return AttachError::Offline;
        }
        AttachError::Failed(format!(
            "opening the cpu-clock perf event{what} on CPU {cpu}: {} ({io})",
            perf_open_hint(io, &Privileges::current(), frequency)
        ))
    };
    let scope = PerfEventScope::AllProcessesOneCpu { cpu };
    // The probe first: if the CPU cycles between the two opens, the probe
    // is the one that dies, and the next check replaces both.
    let mut probe = PerfEventGroup::open(PerfEventConfig::Software(SoftwareEvent::CpuClock), [], scope)
        .map_err(|e| explain(&e.io_error, " (liveness probe)"))?;
    probe.enable().map_err(|e| explain(&e, " (liveness probe)"))?;
    let enabled_ns = probe.read().map(|r| r.enabled_nanos).unwrap_or(0);
    let id = prog
        .attach(PerfEventConfig::Software(SoftwareEvent::CpuClock), scope, SamplePolicy::Frequency(frequency), false)
        .map_err(|e| match e {
            ProgramError::SyscallError(e) => explain(&e.io_error, ""),
            e => AttachError::Failed(chain(&e)).prefixed(cpu),
        })?;
    let link = prog.take_link(id).map_err(|e| AttachError::Failed(chain(&e)).prefixed(cpu))?;
    Ok(CpuEvent { _link: link, probe, enabled_ns })
}

impl AttachError {
    fn prefixed(self, cpu: u32) -> Self {
        match self {
            AttachError::Failed(m) => AttachError::Failed(format!("attaching to CPU {cpu}: {m}")),
            o => o,
        }
    }
}

impl Loaded {
    /// Whether the Python walker runs, loading it first if it waits for
    /// its first Python process. A kernel that refuses it leaves Python
    /// frames unwalked; profiling goes on.
    pub(crate) fn python_walker_ready(&mut self) -> bool {
        if self.python_walker == PythonWalker::Deferred {
            // The program's instructions name its maps by the fds they had
            // when the object loaded: every map stays open until now, held
            // here (taken) or by `ebpf`. Dropping a taken map early would
            // let its fd be reused under this program.
            self.python_walker = match load_python_program(&mut self.ebpf) {
                Ok(()) => {
                    tracing::info!("ebpf receiver: Python walker loaded for the first Python process");
                    PythonWalker::Loaded
                }
                Err(e) => {
                    tracing::warn!("ebpf receiver: {e}; Python frames are not walked");
                    PythonWalker::Failed
                }
            };
        }
        self.python_walker == PythonWalker::Loaded
    }

    /// Attaches through the uprobe program (which fails every attach when
    /// no probe is configured and the program is not loaded).
    pub(crate) fn attacher(&mut self) -> KernelAttacher<'_> {
        let prog = if self.uprobes_loaded {
            self.ebpf.program_mut(obj::UPROBE_PROGRAM).and_then(|p| <&mut UProbe>::try_from(p).ok())
        } else {
            None
        };
        KernelAttacher { prog }
    }

    /// CPUs with a live perf event, ascending.
    pub(crate) fn cpus(&self) -> Vec<u32> {
        self.events.keys().copied().collect()
    }

    /// Brings the perf events in line with `online` (the CPUs online now):
    /// detaches the events of CPUs that went offline, replaces events that
    /// died while their CPU went offline and came back unseen, and attaches
    /// one to every online CPU without one (a CPU that failed before only
    /// once its backoff has passed). A CPU that fails does not affect the
    /// others. Errors only when the program itself is gone (never expected).
    pub(crate) fn sync_cpus(&mut self, online: &[u32], now: Instant) -> Result<CpuSync, LoadError> {
        let online: BTreeSet<u32> = online.iter().copied().collect();
        let mut sync = CpuSync::default();
        let mut dead = BTreeSet::new();
        self.events.retain(|&cpu, ev| {
            if !online.contains(&cpu) {
                sync.removed.push(cpu);
                false
            } else if !ev.alive() {
                dead.insert(cpu);
                false
            } else {
                true
            }
        });
        self.retry.retain(|cpu, _| online.contains(cpu));
        let prog: &mut PerfEvent = self
            .ebpf
            .program_mut(obj::PROGRAM_NAME)
            .ok_or_else(|| LoadError::Other(format!("BPF object lacks program {}", obj::PROGRAM_NAME)))?
            .try_into()
            .map_err(|e: ProgramError| other("BPF program type", &e))?;
        for &cpu in &online {
            if self.events.contains_key(&cpu) || self.retry.get(&cpu).is_some_and(|r| now < r.at) {
                continue;
            }
            match attach_cpu(prog, cpu, self.sample_frequency) {
                Ok(ev) => {
                    self.events.insert(cpu, ev);
                    self.retry.remove(&cpu);
                    if dead.remove(&cpu) {
                        sync.revived.push(cpu);
                    } else {
                        sync.added.push(cpu);
                    }
                }
                // Went offline since the list was read: the next check sees it.
                Err(AttachError::Offline) => {}
                Err(AttachError::Failed(message)) => {
                    let first = !self.retry.contains_key(&cpu);
                    let delay = self.retry.get(&cpu).map_or(RETRY_FIRST, |r| (r.delay * 2).min(RETRY_MAX));
                    self.retry.insert(cpu, Retry { at: now + delay, delay });
                    sync.failed.push(AttachFailure { cpu, message, first });
                }
            }
        }
        // A dead event not replaced (offline again, or failing) leaves the set.
        sync.removed.extend(dead);
        sync.removed.sort_unstable();
        Ok(sync)
    }

    /// Stops sampling: every CPU's perf event is closed.
    pub(crate) fn stop_sampling(&mut self) {
        self.events.clear();
        self.retry.clear();
    }

    /// Samples at `hz` from now on, on every online CPU (after
    /// [`Self::stop_sampling`]: a cpu-clock event's period is fixed when it
    /// is opened).
    pub(crate) fn set_frequency(&mut self, hz: u64, online: &[u32], now: Instant) -> Result<CpuSync, LoadError> {
        self.sample_frequency = hz;
        self.sync_cpus(online, now)
    }

    /// Run time of the loaded programs so far (with `BPF_ENABLE_STATS`
    /// held; 0 without).
    pub(crate) fn bpf_run_ns(&self) -> u64 {
        self.ebpf.programs().filter_map(|(_, p)| p.info().ok()).map(|i| i.run_time().as_nanos() as u64).sum()
    }

    /// Sum over CPUs of every counter slot, indexed by [`obj::Stat`].
    pub(crate) fn read_stats(&self) -> [u64; obj::Stat::SLOTS as usize] {
        let mut out = [0u64; obj::Stat::SLOTS as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            if let Ok(values) = self.stats.get(&(i as u32), 0) {
                *slot = values.iter().copied().fold(0u64, u64::wrapping_add);
            }
        }
        out
    }
}
