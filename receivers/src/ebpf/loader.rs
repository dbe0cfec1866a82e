//! Loading the BPF object with aya and attaching it to one software
//! cpu-clock perf event per online CPU.
//!
//! The object has no BTF and no CO-RE relocations, so aya 0.16 never reads
//! `/sys/kernel/btf/vmlinux` (it parses kernel BTF lazily, only for programs
//! that need relocating); `tests/ebpf_btf.rs` checks that it is not opened.

use super::config::EbpfConfig;
use super::privileges::{perf_open_hint, Privileges};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{PerfEvent, ProgramError};
use aya::{Ebpf, EbpfLoader};
use profcol_ebpf as obj;
use std::fmt::Write as _;

/// A loaded and attached sampler. Dropping it detaches every perf event and
/// unloads the program.
pub struct Loaded {
    /// Owns the program and its perf links.
    _ebpf: Ebpf,
    pub ring: RingBuf<MapData>,
    pub stats: PerCpuArray<MapData, u64>,
    /// CPUs with an attached perf event.
    pub cpus: Vec<u32>,
}

/// Why the sampler could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Privileges(#[from] super::privileges::PrivilegeError),
    #[error("{0}")]
    Other(String),
}

/// `err` and its sources, joined with ": ".
pub fn chain(err: &dyn std::error::Error) -> String {
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

/// Loads the program and its maps, without attaching.
pub fn load_program(cfg: &EbpfConfig) -> Result<Ebpf, LoadError> {
    let privs = Privileges::current();
    privs.check()?;
    raise_memlock();

    let depth = cfg.max_stack_depth;
    let exclude_idle = u32::from(cfg.exclude_idle);
    let filter_pids = u32::from(!cfg.pids.is_empty());
    let mut ebpf = EbpfLoader::new()
        .override_global(obj::globals::MAX_STACK_DEPTH, &depth, true)
        .override_global(obj::globals::EXCLUDE_IDLE, &exclude_idle, true)
        .override_global(obj::globals::FILTER_PIDS, &filter_pids, true)
        .map_max_entries(obj::EVENTS_MAP, cfg.ring_buffer_size)
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
    Ok(ebpf)
}

/// Loads, attaches one cpu-clock perf event per online CPU, and takes the
/// maps the reader needs.
pub fn load_and_attach(cfg: &EbpfConfig) -> Result<Loaded, LoadError> {
    let mut ebpf = load_program(cfg)?;
    let privs = Privileges::current();
    let cpus = aya::util::online_cpus()
        .map_err(|(path, e)| LoadError::Other(format!("reading online CPUs from {path}: {e}")))?;
    let prog: &mut PerfEvent = ebpf
        .program_mut(obj::PROGRAM_NAME)
        .ok_or_else(|| LoadError::Other(format!("BPF object lacks program {}", obj::PROGRAM_NAME)))?
        .try_into()
        .map_err(|e: ProgramError| other("BPF program type", &e))?;
    let mut attached = Vec::with_capacity(cpus.len());
    for &cpu in &cpus {
        match prog.attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Frequency(cfg.sample_frequency),
            false,
        ) {
            Ok(_) => attached.push(cpu),
            Err(ProgramError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENODEV) => {
                // The CPU went offline since we listed them.
                tracing::warn!(cpu, "CPU went offline; not sampled");
            }
            Err(ProgramError::SyscallError(e)) => {
                return Err(LoadError::Other(format!(
                    "opening the cpu-clock perf event on CPU {cpu}: {} ({})",
                    perf_open_hint(&e.io_error, &privs, cfg.sample_frequency),
                    e.io_error
                )));
            }
            Err(e) => return Err(other(&format!("attaching to CPU {cpu}"), &e)),
        }
    }
    if attached.is_empty() {
        return Err(LoadError::Other("no online CPU could be sampled".into()));
    }
    let ring = RingBuf::try_from(
        ebpf.take_map(obj::EVENTS_MAP).ok_or_else(|| LoadError::Other("BPF object lacks the events map".into()))?,
    )
    .map_err(|e| other("events ring buffer", &e))?;
    let stats = PerCpuArray::try_from(
        ebpf.take_map(obj::STATS_MAP).ok_or_else(|| LoadError::Other("BPF object lacks the stats map".into()))?,
    )
    .map_err(|e| other("stats map", &e))?;
    Ok(Loaded { _ebpf: ebpf, ring, stats, cpus: attached })
}

impl Loaded {
    /// Sum over CPUs of every counter slot, indexed by [`obj::Stat`].
    pub fn read_stats(&self) -> [u64; obj::Stat::SLOTS as usize] {
        let mut out = [0u64; obj::Stat::SLOTS as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            if let Ok(values) = self.stats.get(&(i as u32), 0) {
                *slot = values.iter().copied().fold(0u64, u64::wrapping_add);
            }
        }
        out
    }
}
