//! JIT code named from the maps runtimes write (`/tmp/perf-PID.map`):
//! a namer with no walker in the kernel. The native walk already reaches
//! JIT frames (runtimes keep frame pointers in their code, or the frame
//! is the leaf); what no ELF file describes is their names.
//!
//! A sampled process with anonymous executable memory gets its map opened
//! ([`perf_map::open`]: inside its root, no symlink, its owner only) and
//! read as it grows, at most every [`REFRESH`] while it is sampled and
//! once more before each report. Frames are named when the report is
//! built, so stacks counted in the kernel and frames sampled before the
//! runtime wrote their line are named too. A process that exits keeps its
//! table until the report holding its samples is built, and its file is
//! read once more before that report (a runtime may write it as it exits).
//!
//! - [`perf_map`]: the map file and its lines.
//! - [`jitdump`]: the jitdump file (`jit-PID.dump`) and its records:
//!   code ranges named down to the line of each instruction. A process
//!   that maps one is read from it rather than from its perf map.
//! - [`files`]: a process's file opened safely; named code ranges.
//! - [`names`]: each runtime's names (V8, HotSpot, .NET, wasmtime).
//! - [`jvm_attach`]: asks a JVM to write its map (`jit.jvm_perfmap: attach`).

pub(crate) mod files;
pub(crate) mod jitdump;
pub(crate) mod jvm_attach;
pub(crate) mod names;
pub(crate) mod perf_map;

use crate::ebpf::metrics as m;
use crate::ebpf::process::procfs;
use crate::ebpf::process::{MappingSet, ProcessInfo};
use jitdump::JitDump;
use names::{JitName, Runtime};
use perf_map::{LineCounts, Open, PerfMap, Refused};
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge};
use rustc_hash::FxHashMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A sampled process's map is read again at most this often between
/// reports (each report reads what it gained first): the work of reading a
/// growing map is spread, and no sample pays for it.
const REFRESH: Duration = Duration::from_secs(5);
/// A JVM asked for its map is looked at again after this.
const ASKED_RETRY: Duration = Duration::from_millis(250);
/// Reads (each at most a chunk) one report's refresh makes per map.
const REPORT_READS: usize = 4;
/// A process with JIT code and no map is looked at again after this.
const MISSING_RETRY: Duration = Duration::from_secs(2);
/// Bytes all processes' tables hold at most.
const TOTAL_BYTES: usize = 64 << 20;
/// Processes whose maps are followed at most.
const MAX_PROCESSES: usize = 1024;
/// A JVM is asked again for its map at most this often while frames in its
/// JIT code stay unnamed (its map is a snapshot).
const ATTACH_EVERY: Duration = Duration::from_secs(60);
/// How long one attach may take.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);

/// `jit:` section of the ebpf receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JitConfig {
    /// Name frames in anonymous executable memory from the perf map the
    /// process's runtime writes (`/tmp/perf-PID.map`: Node
    /// `--perf-basic-prof`, Java `jcmd PID Compiler.perfmap`, .NET
    /// `DOTNET_PerfMapEnabled=1`, wasmtime `--profile=perfmap`). A map is
    /// read only if it is a regular file owned by the process's user. A
    /// jitdump the process maps (`jit-PID.dump`: Node `--perf-prof`,
    /// wasmtime `--profile=jitdump`) is read in its place, with a line per
    /// instruction.
    pub perf_maps: bool,
    /// `attach`: ask a JVM that has no perf map to write one, through its
    /// attach mechanism (what `jcmd PID Compiler.perfmap` does: a SIGQUIT
    /// to a JVM that handles it, then a request on its attach socket; the
    /// JVM starts its attach listener thread and writes the map of its
    /// code cache), and again at most once a minute while its JIT frames
    /// stay unnamed. `none` (default): only maps the runtime writes itself.
    pub jvm_perfmap: JvmPerfMap,
}

impl Default for JitConfig {
    fn default() -> Self {
        JitConfig { perf_maps: true, jvm_perfmap: JvmPerfMap::None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JvmPerfMap {
    None,
    Attach,
}

/// A process's source of names, opened.
enum Opened {
    Source(Source),
    Missing,
    Refused(Refused),
}

/// Opens the jitdump process `pid` maps, or else its perf map (a jitdump
/// names each instruction's line, a perf map only each function's first);
/// with what it is.
fn open_source(pid: u32, p: &JitProc) -> (&'static str, std::io::Result<Opened>) {
    if let Some(path) = p.dump.as_deref() {
        match jitdump::open(pid, path, p.ids.uids, p.runtime) {
            // Unmapped and deleted: the perf map, if any.
            Ok(jitdump::Open::Missing) => {}
            Ok(jitdump::Open::Dump(d)) => return ("jitdump", Ok(Opened::Source(Source::Dump(d)))),
            Ok(jitdump::Open::Refused(r)) => return ("jitdump", Ok(Opened::Refused(r))),
            Err(e) => return ("jitdump", Err(e)),
        }
    }
    let opened = perf_map::open(pid, p.ids.nspid, p.ids.uids, p.runtime).map(|o| match o {
        Open::Map(m) => Opened::Source(Source::Map(m)),
        Open::Missing => Opened::Missing,
        Open::Refused(r) => Opened::Refused(r),
    });
    ("perf map", opened)
}

/// The series of one receiver.
pub(crate) struct JitCounters {
    processes: Vec<Gauge>,
    /// By runtime: named, unnamed.
    frames: Vec<[Counter; 2]>,
    /// read, malformed, dropped.
    lines: [Counter; 3],
    /// By [`Refused::ALL`], then unreadable, too_large.
    refused: Vec<Counter>,
    cache_bytes: Gauge,
    attach: FxHashMap<&'static str, Counter>,
}

/// Outcomes of an attach (the `outcome` label).
const ATTACH_OUTCOMES: [&str; 7] =
    ["ok", "not_hotspot", "attach_disabled", "signal_not_handled", "timeout", "io", "rejected"];

impl JitCounters {
    pub(crate) fn new(t: &ComponentTelemetry) -> Self {
        JitCounters {
            processes: Runtime::ALL.iter().map(|r| t.gauge_by(&m::JIT_PROCESSES, r.label())).collect(),
            frames: Runtime::ALL
                .iter()
                .map(|r| ["named", "unnamed"].map(|o| t.counter_by2(&m::JIT_FRAMES, r.label(), o)))
                .collect(),
            lines: ["read", "malformed", "dropped"].map(|o| t.counter_by(&m::JIT_MAP_LINES, o)),
            refused: Refused::ALL
                .iter()
                .map(|r| r.reason())
                .chain(["unreadable", "too_large"])
                .map(|r| t.counter_by(&m::JIT_MAPS_REFUSED, r))
                .collect(),
            cache_bytes: t.gauge_of(&m::JIT_CACHE_BYTES),
            attach: ATTACH_OUTCOMES.iter().map(|&o| (o, t.counter_by(&m::JIT_ATTACH_REQUESTS, o))).collect(),
        }
    }

    fn refused(&self, reason: &str) {
        let i = Refused::ALL.iter().position(|r| r.reason() == reason).unwrap_or(match reason {
            "unreadable" => Refused::ALL.len(),
            _ => Refused::ALL.len() + 1,
        });
        if let Some(c) = self.refused.get(i) {
            c.inc();
        }
    }
}

/// Where a process's JIT code is named from.
enum Source {
    Map(Box<PerfMap>),
    Dump(Box<JitDump>),
}

impl Source {
    fn bytes(&self) -> usize {
        match self {
            Source::Map(m) => m.bytes(),
            Source::Dump(d) => d.bytes(),
        }
    }

    fn capped(&self) -> bool {
        match self {
            Source::Map(m) => m.capped(),
            Source::Dump(d) => d.capped(),
        }
    }

    fn lookup(&self, addr: u64) -> Option<(u32, &JitName)> {
        match self {
            Source::Map(m) => m.lookup(addr),
            Source::Dump(d) => d.lookup(addr),
        }
    }

    fn refresh(&mut self, room: usize, buf: &mut Vec<u8>, counts: &mut LineCounts) -> std::io::Result<()> {
        match self {
            Source::Map(m) => m.refresh(room, buf, counts),
            Source::Dump(d) => d.refresh(room, buf, counts),
        }
    }
}

enum MapState {
    Open(Source),
    Missing {
        retry_at: Instant,
    },
    /// Refused or unreadable: not looked at again while the process runs.
    Refused,
}

/// A process with JIT code.
struct JitProc {
    state: MapState,
    runtime: Runtime,
    ids: procfs::StatusIds,
    /// The jitdump the process maps (its path in the process's mount
    /// namespace), read rather than its perf map.
    dump: Option<Box<str>>,
    /// The mapping generation last looked at for a jitdump.
    maps_generation: u32,
    last_refresh: Instant,
    /// Exec'd or exited: named from what was read, no longer read...
    gone: bool,
    /// ...but once more before the next report: a runtime may write its
    /// last records only as it exits (V8's jitdump goes through a buffer).
    final_read: bool,
    /// Frames in its JIT code left unnamed in a report (a JVM to ask).
    unnamed: AtomicBool,
    /// When a JVM was last asked for its map; an attach running; the JVM
    /// cannot be asked (not HotSpot, attach off, SIGQUIT not handled).
    asked: Option<Instant>,
    attaching: Arc<AtomicBool>,
    never_ask: Arc<AtomicBool>,
}

/// The JIT side of the receiver.
pub(crate) struct JitMaps {
    procs: FxHashMap<u32, JitProc>,
    /// pid → the mapping generation looked at and found without anonymous
    /// executable memory.
    no_jit: FxHashMap<u32, u32>,
    jvm_attach: bool,
    /// Bytes all tables hold.
    total: usize,
    counters: Arc<JitCounters>,
    /// Read buffer, reused.
    buf: Vec<u8>,
    /// Frames named and unnamed in the report being built, by runtime.
    outcomes: Vec<[AtomicU64; 2]>,
}

/// Whether a mapping may hold JIT code: anonymous executable memory, or a
/// memfd (.NET maps its code twice through one, writable and executable).
pub(crate) fn may_hold_jit_code(path: &str) -> bool {
    path == "[anon]" || path.starts_with("/memfd:")
}

/// Whether a process maps memory that may hold JIT code (or a jitdump:
/// its runtime's code may be mapped from a file of its own).
fn has_jit_code(maps: &MappingSet) -> bool {
    maps.mappings.iter().any(|m| may_hold_jit_code(&m.path)) || jitdump_of(maps).is_some()
}

/// The jitdump a process maps (`jit-PID.dump`): runtimes map it executable
/// for perf to find.
fn jitdump_of(maps: &MappingSet) -> Option<&str> {
    maps.mappings.iter().map(|m| &*m.path).find(|p| jitdump::is_jitdump_name(procfs::base_name(p)))
}

impl JitMaps {
    pub(crate) fn new(cfg: &JitConfig, counters: JitCounters) -> Self {
        JitMaps {
            procs: FxHashMap::default(),
            no_jit: FxHashMap::default(),
            jvm_attach: cfg.jvm_perfmap == JvmPerfMap::Attach,
            total: 0,
            counters: Arc::new(counters),
            buf: Vec::new(),
            outcomes: Runtime::ALL.iter().map(|_| Default::default()).collect(),
        }
    }

    /// A sample of process `pid` (`info`, `maps`) was read: a process with
    /// JIT code gets its map opened, and read as it grows.
    pub(crate) fn observe(&mut self, pid: u32, info: &ProcessInfo, maps: &MappingSet, now: Instant) {
        if let Some(p) = self.procs.get_mut(&pid) {
            if p.maps_generation != maps.generation {
                p.maps_generation = maps.generation;
                // A jitdump mapped after the process was first seen: read
                // it if nothing is read yet.
                if p.dump.is_none() && matches!(p.state, MapState::Missing { .. }) {
                    if let Some(path) = jitdump_of(maps) {
                        p.dump = Some(path.into());
                        p.state = MapState::Missing { retry_at: now };
                    }
                }
            }
            let due = match p.state {
                MapState::Missing { retry_at } => now >= retry_at,
                MapState::Open(_) => now.duration_since(p.last_refresh) >= REFRESH,
                MapState::Refused => false,
            };
            if !p.gone && due {
                self.refresh(pid, now);
            }
            return;
        }
        if self.no_jit.get(&pid) == Some(&maps.generation) {
            return;
        }
        if !has_jit_code(maps) || self.procs.len() >= MAX_PROCESSES {
            self.no_jit.insert(pid, maps.generation);
            return;
        }
        let Ok(ids) = procfs::read_status_ids(pid) else {
            self.no_jit.insert(pid, maps.generation);
            return;
        };
        let files = maps.mappings.iter().map(|m| procfs::base_name(&m.path));
        let runtime = Runtime::of_process(&info.exe_name, files);
        self.procs.insert(
            pid,
            JitProc {
                state: MapState::Missing { retry_at: now },
                runtime,
                ids,
                dump: jitdump_of(maps).map(Box::from),
                maps_generation: maps.generation,
                last_refresh: now,
                gone: false,
                final_read: false,
                unnamed: AtomicBool::new(false),
                asked: None,
                attaching: Arc::new(AtomicBool::new(false)),
                never_ask: Arc::new(AtomicBool::new(false)),
            },
        );
        self.refresh(pid, now);
    }

    /// Opens or reads the map of `pid`; asks a JVM for one.
    fn refresh(&mut self, pid: u32, now: Instant) {
        let Some(p) = self.procs.get_mut(&pid) else { return };
        if p.gone && !std::mem::take(&mut p.final_read) {
            return;
        }
        p.last_refresh = now;
        if let MapState::Missing { retry_at } = p.state {
            if now < retry_at {
                return;
            }
            let (kind, opened) = open_source(pid, p);
            p.state = match opened {
                Ok(Opened::Source(source)) => {
                    tracing::debug!(pid, runtime = p.runtime.label(), "ebpf receiver: reading {kind}");
                    MapState::Open(source)
                }
                Ok(Opened::Missing) => MapState::Missing { retry_at: now + MISSING_RETRY },
                Ok(Opened::Refused(r)) => {
                    tracing::info!(pid, reason = r.reason(), "ebpf receiver: {kind} not read");
                    self.counters.refused(r.reason());
                    MapState::Refused
                }
                Err(e) => {
                    tracing::debug!(pid, "ebpf receiver: {kind} unreadable: {e}");
                    self.counters.refused("unreadable");
                    MapState::Refused
                }
            };
        }
        let ask = self.jvm_attach
            && !p.gone
            && p.runtime == Runtime::Jvm
            && !p.attaching.load(Relaxed)
            && !p.never_ask.load(Relaxed)
            && match &p.state {
                MapState::Missing { .. } => p.asked.is_none_or(|t| now.duration_since(t) >= ATTACH_EVERY),
                MapState::Open(_) => {
                    p.unnamed.load(Relaxed) && p.asked.is_none_or(|t| now.duration_since(t) >= ATTACH_EVERY)
                }
                MapState::Refused => false,
            };
        if ask {
            p.asked = Some(now);
            p.unnamed.store(false, Relaxed);
            p.attaching.store(true, Relaxed);
            // The JVM writes its map anew: it is opened and read from the
            // start once written.
            if let MapState::Open(old) = &p.state {
                self.total = self.total.saturating_sub(old.bytes());
            }
            p.state = MapState::Missing { retry_at: now + ASKED_RETRY };
            spawn_attach(pid, p.attaching.clone(), p.never_ask.clone(), self.counters.clone());
            return;
        }
        let MapState::Open(map) = &mut p.state else { return };
        let before = map.bytes();
        let room = TOTAL_BYTES.saturating_sub(self.total);
        let mut counts = LineCounts::default();
        let was_capped = map.capped();
        match map.refresh(room, &mut self.buf, &mut counts) {
            Ok(()) => {
                if map.capped() && !was_capped {
                    self.counters.refused("too_large");
                }
            }
            Err(e) => {
                tracing::debug!(pid, "ebpf receiver: perf map read: {e}");
                self.counters.refused("unreadable");
            }
        }
        self.total = self.total.saturating_sub(before) + map.bytes();
        for (c, n) in self.counters.lines.iter().zip([counts.read, counts.malformed, counts.dropped]) {
            if n > 0 {
                c.add(n);
            }
        }
    }

    /// Before a report is built: reads what every live process's map
    /// gained since its last sample, and what a process gone since the
    /// last report wrote as it went.
    pub(crate) fn refresh_all(&mut self, now: Instant) {
        let live: Vec<u32> = self.procs.iter().filter(|(_, p)| !p.gone || p.final_read).map(|(&pid, _)| pid).collect();
        for pid in live {
            for _ in 0..REPORT_READS {
                self.refresh(pid, now);
            }
        }
    }

    /// The name of JIT code at `addr` in process `pid` (an address in its
    /// anonymous executable memory), with an id unique within the process;
    /// counted named or unnamed.
    pub(crate) fn name(&self, pid: u32, addr: u64) -> Option<(u32, &JitName)> {
        let p = self.procs.get(&pid)?;
        let found = match &p.state {
            MapState::Open(map) => map.lookup(addr),
            _ => None,
        };
        let i = Runtime::ALL.iter().position(|&r| r == p.runtime).unwrap_or(0);
        self.outcomes[i][usize::from(found.is_none())].fetch_add(1, Relaxed);
        if found.is_none() {
            p.unnamed.store(true, Relaxed);
        }
        found
    }

    /// Process `pid` exec'd or exited: its map is no longer read; its
    /// table names the samples already taken until the next report.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.no_jit.remove(&pid);
        if let Some(p) = self.procs.get_mut(&pid) {
            p.final_read = !p.gone && matches!(p.state, MapState::Open(_));
            p.gone = true;
        }
    }

    /// After a report is built: drops the tables of processes gone or no
    /// longer known, and sets the gauges.
    pub(crate) fn retain(&mut self, known: impl Fn(u32) -> bool) {
        self.no_jit.retain(|&pid, _| known(pid));
        let mut freed = 0;
        self.procs.retain(|&pid, p| {
            let keep = !p.gone && known(pid);
            if !keep {
                if let MapState::Open(m) = &p.state {
                    freed += m.bytes();
                }
            }
            keep
        });
        self.total = self.total.saturating_sub(freed);
        let c = &self.counters;
        for (i, r) in Runtime::ALL.iter().enumerate() {
            let n = self.procs.values().filter(|p| p.runtime == *r && matches!(p.state, MapState::Open(_))).count();
            c.processes[i].set(n as i64);
            for (o, counter) in self.outcomes[i].iter().zip(&c.frames[i]) {
                let n = o.swap(0, Relaxed);
                if n > 0 {
                    counter.add(n);
                }
            }
        }
        c.cache_bytes.set(self.total as i64);
    }
}

/// Asks JVM `pid` for its perf map on a thread of its own (it may take
/// seconds), counting the outcome.
fn spawn_attach(pid: u32, running: Arc<AtomicBool>, never: Arc<AtomicBool>, counters: Arc<JitCounters>) {
    let flag = running.clone();
    let spawned = std::thread::Builder::new().name("profcol-jvm-attach".into()).spawn(move || {
        let outcome = match jvm_attach::request_perf_map(pid, ATTACH_TIMEOUT) {
            Ok(()) => {
                tracing::info!(pid, "ebpf receiver: asked the JVM for its perf map");
                "ok"
            }
            Err(e) => {
                let permanent = matches!(
                    e,
                    jvm_attach::Refused::NotHotspot
                        | jvm_attach::Refused::AttachDisabled
                        | jvm_attach::Refused::SignalNotHandled
                );
                never.store(permanent, Relaxed);
                tracing::info!(pid, permanent, "ebpf receiver: JVM not asked for its perf map: {e}");
                e.reason()
            }
        };
        if let Some(c) = counters.attach.get(outcome) {
            c.inc();
        }
        running.store(false, Relaxed);
    });
    if spawned.is_err() {
        // No thread: tried again at the next chance.
        flag.store(false, Relaxed);
    }
}
