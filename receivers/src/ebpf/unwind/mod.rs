//! User-stack unwinding with `.eh_frame` tables (`unwind:` config): the
//! receiver's half of `ebpf/bpf/unwind.h`.
//!
//! When a process is first sampled (and again when its mappings change),
//! every file-backed executable mapping gets its file's unwind table
//! (built once per build id by `profcol_elf::unwind`, shared by every
//! process, kept by [`store::TableStore`] within `max_table_bytes`), and
//! the process gets one entry of `unwind_procs`: pid → its mappings with a
//! table, sorted ((start, end) → (table, bias)); the BPF program walks the
//! code of a known process outside them (vdso, JIT code, files without
//! `.eh_frame`) by frame pointers. One map update per process, one delete
//! per drain for the processes that exited in it (an LPM trie of address
//! prefixes, as before, took tens of updates per short-lived process).
//! A process's samples before that (its first ones) take the kernel's
//! frame-pointer walk, reported as `no_table`.

pub mod kernel;
pub mod store;

use super::process::MappingSet;
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge};
use profcol_ebpf::unwind::{MappedRange, PROC_RANGES};
use profcol_ebpf::UnwindEnd;
use profcol_elf::unwind::CompactTable;
use profcol_elf::{ElfFile, LoadSegment};
use rustc_hash::FxHashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::{LoadRefused, Sink, TableKey, TableStore};

/// Files remembered (segments, or "no table"); cleared when full.
const MAX_FILES: usize = 4096;

/// What the BPF maps are asked to hold, besides tables.
pub trait MappingSink: Sink {
    /// `pid`'s mappings with a table (sorted by start; the first
    /// [`PROC_RANGES`] are kept), replacing what it had.
    fn set_process(&mut self, pid: u32, ranges: &[MappedRange]) -> Result<(), String>;
    /// Removes the entries of `pids` (each written before).
    fn remove_processes(&mut self, pids: &[u32]);
}

/// Self-telemetry of unwinding (`profcol_receiver_ebpf_unwind_*`).
#[derive(Clone)]
pub struct UnwindCounters {
    /// Per reason (indexed by `UnwindEnd as usize`), `unknown` unused.
    pub stack_end: Vec<Counter>,
    pub table_builds: Counter,
    pub table_build_failures: Counter,
    pub table_build_micros: Counter,
    pub table_evictions: Counter,
    pub ranges_over_capacity: Counter,
    pub tables_loaded: Gauge,
    pub table_bytes: Gauge,
}

impl UnwindCounters {
    pub fn new(t: &ComponentTelemetry) -> Self {
        UnwindCounters {
            stack_end: UnwindEnd::ALL
                .iter()
                .map(|e| {
                    t.counter_labeled(
                        "ebpf_unwind_stack_end_total",
                        "User stacks by how they ended (outermost frame, no table, unsupported rule, depth limit, \
                         read error); frame-pointer-only stacks (mode frame_pointers) are not counted",
                        ("reason", e.name()),
                    )
                })
                .collect(),
            table_builds: t
                .counter("ebpf_unwind_table_builds_total", "Unwind tables built from .eh_frame/.debug_frame"),
            table_build_failures: t.counter(
                "ebpf_unwind_table_build_failures_total",
                "Files whose unwind table could not be built or loaded (no CFI, not x86-64, over max_table_bytes, \
                 map update failed); their code is walked by frame pointers in mode auto",
            ),
            table_build_micros: t
                .counter("ebpf_unwind_table_build_microseconds_total", "Time spent building and loading unwind tables"),
            table_evictions: t.counter(
                "ebpf_unwind_table_evictions_total",
                "Unwind tables evicted to stay within unwind.max_table_bytes (least recently used first)",
            ),
            ranges_over_capacity: t.counter(
                "ebpf_unwind_ranges_over_capacity_total",
                "Processes loaded with more mappings that have a table than the kernel keeps per process (64); \
                 code in the ones past it is walked by frame pointers",
            ),
            tables_loaded: t.gauge("ebpf_unwind_tables_loaded", "Unwind tables loaded into the kernel"),
            table_bytes: t.gauge(
                "ebpf_unwind_table_bytes",
                "Bytes of unwind tables loaded into the kernel (rows and page entries; at most max_table_bytes)",
            ),
        }
    }

    /// Counts one sample's stack end.
    pub fn count_end(&self, end: UnwindEnd) {
        self.count_ends(end, 1);
    }

    /// Counts `n` samples' stack end (samples counted in the kernel).
    pub fn count_ends(&self, end: UnwindEnd, n: u64) {
        if end != UnwindEnd::Unknown {
            if let Some(c) = self.stack_end.get(end as usize) {
                c.add(n);
            }
        }
    }
}

/// A file as far as unwinding is concerned.
enum FileState {
    /// Its table is being built by the worker.
    Pending,
    /// Its segments (for the bias of each mapping); the table is in the
    /// store while it is loaded.
    Table(Arc<[LoadSegment]>),
    /// No usable table (no CFI, or refused): frame pointers.
    NoTable,
}

struct PidEntry {
    generation: u32,
    /// What its `unwind_procs` entry holds (each range holds its table).
    ranges: Vec<MappedRange>,
    /// Installed (its entry written); false while tables it needs are
    /// being built.
    complete: bool,
    /// [`Unwinder::epoch`] at the last attempt: an incomplete process is
    /// tried again only once a build has finished since.
    epoch: u64,
}

/// What the worker built for a file.
struct Built {
    key: TableKey,
    result: Result<(CompactTable, Arc<[LoadSegment]>), String>,
    micros: u64,
}

/// Builds waiting for the worker at most (more are asked for again later).
const MAX_QUEUED_BUILDS: usize = 64;

/// How long a file whose table was evicted to make room is not built
/// again (its code is walked by frame pointers meanwhile), doubled at each
/// further eviction up to [`MAX_REBUILD_BACKOFF`]. Without it, a working
/// set of tables larger than `max_table_bytes` (a build host: rustc's
/// librustc_driver and LLVM tables alone are ~11 MB) is rebuilt and
/// evicted in turn by every new process: the worker parsed the same files
/// ~30 times in 25 s.
const REBUILD_BACKOFF: Duration = Duration::from_secs(30);
const MAX_REBUILD_BACKOFF: Duration = Duration::from_secs(600);

/// A file evicted to make room: not built again before `until`.
#[derive(Clone, Copy)]
struct Backoff {
    until: Instant,
    evictions: u32,
}

/// Per-process tables in the kernel. Tables are built on a worker thread
/// (`profcol-unwind`), so a large binary never holds up the sampling loop;
/// the loop loads finished tables ([`Unwinder::poll`]) and installs a
/// process once every table it needs is in.
pub struct Unwinder {
    store: TableStore,
    files: FxHashMap<TableKey, FileState>,
    pids: FxHashMap<u32, PidEntry>,
    counters: UnwindCounters,
    last_evictions: u64,
    jobs: SyncSender<(TableKey, File)>,
    built: Receiver<Built>,
    /// Finished builds so far.
    epoch: u64,
    /// Files evicted to make room, by key (at most MAX_FILES).
    backoff: FxHashMap<TableKey, Backoff>,
    /// Processes sampled once so far (live pids only).
    sampled_once: rustc_hash::FxHashSet<u32>,
}

impl Unwinder {
    pub fn new(store: TableStore, counters: UnwindCounters) -> std::io::Result<Self> {
        let (jobs, job_rx) = sync_channel::<(TableKey, File)>(MAX_QUEUED_BUILDS);
        let (built_tx, built) = channel();
        // Not joined: dropping the sender ends it after the build at hand.
        std::thread::Builder::new().name("profcol-unwind".into()).spawn(move || {
            while let Ok((key, file)) = job_rx.recv() {
                let started = Instant::now();
                let result = build(&file);
                let micros = started.elapsed().as_micros() as u64;
                if built_tx.send(Built { key, result, micros }).is_err() {
                    break;
                }
            }
        })?;
        Ok(Unwinder {
            store,
            files: FxHashMap::default(),
            pids: FxHashMap::default(),
            counters,
            last_evictions: 0,
            jobs,
            built,
            epoch: 0,
            backoff: FxHashMap::default(),
            sampled_once: Default::default(),
        })
    }

    pub fn counters(&self) -> &UnwindCounters {
        &self.counters
    }

    /// Loads the tables the worker finished into the kernel.
    pub fn poll(&mut self, sink: &mut dyn MappingSink, now: Instant) {
        let epoch = self.epoch;
        while let Ok(b) = self.built.try_recv() {
            self.epoch += 1;
            self.counters.table_build_micros.add(b.micros);
            let loaded = b.result.and_then(|(compact, segments)| {
                let (_, evicted) = self.store.load(b.key.clone(), &compact, sink, now).map_err(|e| match e {
                    LoadRefused::TooLarge => {
                        format!("{} bytes of table do not fit unwind.max_table_bytes", compact.bytes())
                    }
                    LoadRefused::RulesFull => "the rule dictionary is full".to_owned(),
                    LoadRefused::Map(m) => m,
                })?;
                for (id, pids) in evicted {
                    self.unpoint(id, &pids, sink);
                }
                Ok(segments)
            });
            for key in self.store.take_evicted() {
                self.back_off(key, now);
            }
            let state = match loaded {
                Ok(segments) => {
                    self.counters.table_builds.inc();
                    tracing::debug!(key = ?b.key, micros = b.micros, bytes = self.store.bytes(), "ebpf receiver: unwind table built");
                    FileState::Table(segments)
                }
                Err(e) => {
                    self.counters.table_build_failures.inc();
                    tracing::debug!(key = ?b.key, error = %e, "ebpf receiver: no unwind table (frame pointers there)");
                    FileState::NoTable
                }
            };
            self.remember(b.key, state);
        }
        if self.epoch != epoch {
            release_freed_memory();
        }
        self.publish();
    }

    /// Makes the kernel's view of `pid` match `mappings`: nothing to do
    /// when this generation is installed already, or still waits for a
    /// build that has not finished.
    pub fn sync(&mut self, pid: u32, mappings: &MappingSet, sink: &mut dyn MappingSink, now: Instant) {
        if let Some(p) = self.pids.get(&pid) {
            if p.generation == mappings.generation && (p.complete || p.epoch == self.epoch) {
                return;
            }
        } else if self.sampled_once.insert(pid) {
            // Tables from a process's second sample on: most short-lived
            // processes (a build host's compilers, scripts, build scripts)
            // are sampled once or never, and their tables would be built
            // for nothing.
            return;
        }
        self.forget(pid, sink, now);
        // Every table first; the process is installed only when all are in.
        let mut ranges = Vec::new();
        let mut ready = true;
        for m in &mappings.mappings {
            if !m.path.starts_with('/') {
                continue;
            }
            match self.table_for(pid, m, now) {
                Lookup::Ready(table, bias) => ranges.push(MappedRange { start: m.start, end: m.end, bias, table }),
                Lookup::None => {}
                Lookup::Waiting => ready = false,
            }
        }
        let mut entry =
            PidEntry { generation: mappings.generation, ranges: Vec::new(), complete: false, epoch: self.epoch };
        if ready {
            // Sorted already (a MappingSet is); the BPF program's binary
            // search relies on it.
            ranges.sort_unstable_by_key(|r| r.start);
            if ranges.len() > PROC_RANGES {
                self.counters.ranges_over_capacity.inc();
                ranges.truncate(PROC_RANGES);
            }
            // Until its entry is in, the BPF program does not know the
            // process (the kernel's frame-pointer walk for all of it); with
            // it, what has no table is walked by frame pointers.
            match sink.set_process(pid, &ranges) {
                Ok(()) => {
                    for r in &ranges {
                        self.store.hold(r.table, pid, now);
                    }
                    entry.ranges = ranges;
                    entry.complete = true;
                }
                Err(e) => tracing::debug!(pid, error = %e, "ebpf receiver: process not loaded for unwinding"),
            }
        }
        self.pids.insert(pid, entry);
    }

    /// Removes `pid` from the kernel's maps and releases its tables.
    pub fn forget(&mut self, pid: u32, sink: &mut dyn MappingSink, now: Instant) {
        self.forget_all(std::iter::once(pid), sink, now);
    }

    /// [`Unwinder::forget`] for many processes (the exits of a drain): one
    /// map operation for all of them.
    pub fn forget_all(&mut self, pids: impl IntoIterator<Item = u32>, sink: &mut dyn MappingSink, now: Instant) {
        let mut installed = Vec::new();
        for pid in pids {
            self.sampled_once.remove(&pid);
            let Some(p) = self.pids.remove(&pid) else { continue };
            if p.complete {
                installed.push(pid);
            }
            for r in &p.ranges {
                self.store.release(r.table, pid, now);
            }
        }
        if !installed.is_empty() {
            sink.remove_processes(&installed);
        }
    }

    /// Once per interval: forget pids `alive` says are gone, drop tables
    /// nobody maps any more.
    pub fn sweep(&mut self, alive: impl Fn(u32) -> bool, sink: &mut dyn MappingSink, now: Instant) {
        self.sampled_once.retain(|&p| alive(p));
        let gone: Vec<u32> = self.pids.keys().copied().filter(|&p| !alive(p)).collect();
        self.forget_all(gone, sink, now);
        self.store.drop_unused(now, sink);
        self.publish();
    }

    /// `key`'s table was evicted to make room: no rebuild for a while.
    fn back_off(&mut self, key: TableKey, now: Instant) {
        if self.backoff.len() >= MAX_FILES && !self.backoff.contains_key(&key) {
            self.backoff.retain(|_, b| b.until > now);
        }
        let evictions = self.backoff.get(&key).map_or(0, |b| b.evictions).saturating_add(1);
        let wait = REBUILD_BACKOFF.saturating_mul(1 << (evictions - 1).min(8)).min(MAX_REBUILD_BACKOFF);
        self.backoff.insert(key, Backoff { until: now + wait, evictions });
    }

    fn publish(&mut self) {
        self.counters.tables_loaded.set(self.store.len() as i64);
        self.counters.table_bytes.set(self.store.bytes() as i64);
        self.counters.table_evictions.add(self.store.evictions - self.last_evictions);
        self.last_evictions = self.store.evictions;
    }

    /// The loaded table and bias of mapping `m` of `pid`; a file seen for
    /// the first time (or evicted since) goes to the worker.
    fn table_for(&mut self, pid: u32, m: &super::process::Mapping, now: Instant) -> Lookup {
        let open = || {
            File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
                .or_else(|_| File::open(format!("/proc/{pid}/root{}", m.path)))
                .ok()
        };
        let mut file = None;
        let key = match &m.build_id {
            Some(b) => TableKey::BuildId(b.clone()),
            None => {
                let Some(f) = open() else { return Lookup::None };
                let Ok(md) = f.metadata() else { return Lookup::None };
                file = Some(f);
                TableKey::File { dev: md.dev(), inode: md.ino(), size: md.size(), mtime: (md.mtime(), md.mtime_nsec()) }
            }
        };
        match (self.files.get(&key), self.store.id(&key)) {
            (Some(FileState::NoTable), _) => return Lookup::None,
            (Some(FileState::Pending), _) => return Lookup::Waiting,
            (Some(FileState::Table(segs)), Some(id)) => {
                return match bias(segs, m.file_offset, m.start) {
                    Some(b) => Lookup::Ready(id, b),
                    None => Lookup::None,
                };
            }
            // Never seen, or evicted since: build it (unless evicted
            // recently: then frame pointers for now).
            _ => {}
        }
        if self.backoff.get(&key).is_some_and(|b| now < b.until) {
            return Lookup::None;
        }
        let Some(file) = file.or_else(open) else { return Lookup::None };
        match self.jobs.try_send((key.clone(), file)) {
            Ok(()) => {
                self.remember(key, FileState::Pending);
                Lookup::Waiting
            }
            // The queue is full: asked again at a later sample.
            Err(TrySendError::Full(_)) => {
                self.epoch = self.epoch.wrapping_add(1);
                Lookup::Waiting
            }
            Err(TrySendError::Disconnected(_)) => Lookup::None,
        }
    }

    fn remember(&mut self, key: TableKey, state: FileState) {
        if self.files.len() >= MAX_FILES && !self.files.contains_key(&key) {
            // Pending entries stay: their builds are on their way.
            self.files.retain(|_, s| matches!(s, FileState::Pending));
        }
        self.files.insert(key, state);
    }

    /// Table `id` was evicted: the ranges of `pids` that used it now have
    /// no table (their entries written again without them).
    fn unpoint(&mut self, id: u32, pids: &[u32], sink: &mut dyn MappingSink) {
        for pid in pids {
            let Some(p) = self.pids.get_mut(pid) else { continue };
            p.ranges.retain(|r| r.table != id);
            if p.complete && sink.set_process(*pid, &p.ranges).is_err() {
                // Not rewritten: no entry rather than one naming a table
                // that is gone; installed again at its next sample.
                sink.remove_processes(&[*pid]);
                p.complete = false;
                p.generation = 0;
            }
        }
    }
}

/// What [`Unwinder::table_for`] found for a mapping.
enum Lookup {
    /// Table id and bias.
    Ready(u32, u64),
    /// No table for this mapping (walked by frame pointers in `auto`).
    None,
    /// Its table is being built.
    Waiting,
}

/// The compact table and segments of `file` (on the worker thread).
fn build(file: &File) -> Result<(CompactTable, Arc<[LoadSegment]>), String> {
    let elf = ElfFile::open(file).map_err(|e| e.to_string())?;
    let (table, _) = elf.unwind_table().map_err(|e| e.to_string())?;
    let compact = table.compact().map_err(|e| e.to_string())?;
    Ok((compact, elf.load_segments().into()))
}

/// Hands the heap the allocator keeps free back to the kernel. A table
/// build of a large binary allocates tens of MiB for a moment (the parsed
/// `.eh_frame`, the full table before compaction, the compact table until
/// it is in the kernel); glibc keeps what was freed in the worker's arena,
/// so a node agent's RSS would stay at its largest build for good.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Process address minus file virtual address for a mapping of file
/// offset `offset` at `start`.
fn bias(segments: &[LoadSegment], offset: u64, start: u64) -> Option<u64> {
    let page = super::config::page_size();
    let seg = segments.iter().filter(|s| s.vaddr_of(offset, page).is_some()).max_by_key(|s| s.executable)?;
    Some(start.wrapping_sub(seg.vaddr_of(offset, page)?))
}

#[cfg(test)]
mod tests {
    use super::store::tests::MemSink;
    use super::*;
    use crate::ebpf::process::ProcessTable;
    use profcol_api::component::{ComponentId, Kind};
    use profcol_elf::unwind::kind;

    #[inline(never)]
    fn marker() -> u64 {
        std::hint::black_box(7)
    }

    /// This test process, unwound the way the BPF program would: its
    /// tables come from the worker, the process is installed with one map
    /// update once all are in, and forgetting it removes its entry.
    #[test]
    fn a_process_is_installed_once_its_tables_are_in() {
        let now = Instant::now();
        let me = std::process::id();
        let mut procs = ProcessTable::new(4);
        let set = procs.get(me, now).expect("self is readable").mappings.clone();
        let id: ComponentId = "ebpf".parse().unwrap();
        let counters = UnwindCounters::new(&ComponentTelemetry::detached(Kind::Receiver, &id));
        let store = TableStore::new(256 << 20, 32 << 20, 1 << 20, 16384);
        let mut u = Unwinder::new(store, counters).unwrap();
        let mut sink = MemSink::default();
        u.sync(me, &set, &mut sink, now);
        assert!(sink.procs.is_empty(), "nothing is written before the tables are built");
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while !u.pids.get(&me).is_some_and(|p| p.complete) {
            assert!(Instant::now() < deadline, "tables built within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
            u.poll(&mut sink, now);
            u.sync(me, &set, &mut sink, now);
        }
        assert!(u.counters().table_builds.get() >= 2, "the test binary and libc");
        assert_eq!(sink.proc_writes, 1, "one map update installs the process");
        let ranges = &sink.procs[&me];
        assert!(ranges.windows(2).all(|w| w[0].end <= w[1].start), "sorted, not overlapping: {ranges:?}");
        // The range holding `marker` names a table whose rule at the
        // function's first instruction is CFA = rsp + 8.
        let addr = marker as *const () as usize as u64;
        let r = ranges.iter().find(|r| r.start <= addr && addr < r.end).expect("a range holds the test's code");
        assert!(r.table != 0);
        let rule = sink.rule_at(r.table, addr - r.bias).expect("a rule");
        assert_eq!((rule.kind, rule.cfa_offset), (kind::CFA_RSP, 8), "{rule:?}");
        // Installed: the same generation costs nothing more.
        u.sync(me, &set, &mut sink, now);
        assert_eq!(sink.proc_writes, 1);
        u.forget(me, &mut sink, now);
        assert!(sink.procs.is_empty());
        assert_eq!(sink.proc_delete_calls, 1);
    }

    /// Processes of files whose tables are loaded already are installed
    /// from their second sample on, with one update each, and the exits of
    /// a drain leave the map in one delete; their tables are then unused.
    #[test]
    fn short_lived_processes_cost_one_update_and_share_one_delete() {
        let now = Instant::now();
        let me = std::process::id();
        let mut procs = ProcessTable::new(4);
        let set = procs.get(me, now).expect("self is readable").mappings.clone();
        let id: ComponentId = "ebpf".parse().unwrap();
        let counters = UnwindCounters::new(&ComponentTelemetry::detached(Kind::Receiver, &id));
        let store = TableStore::new(256 << 20, 32 << 20, 1 << 20, 16384);
        let mut u = Unwinder::new(store, counters).unwrap();
        let mut sink = MemSink::default();
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        u.sync(me, &set, &mut sink, now);
        while !u.pids.get(&me).is_some_and(|p| p.complete) {
            assert!(Instant::now() < deadline, "tables built within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
            u.poll(&mut sink, now);
            u.sync(me, &set, &mut sink, now);
        }
        let builds = u.counters().table_builds.get();
        // Pids no process has (over pid_max): the same files, by build id.
        let others: Vec<u32> = (0..3).map(|i| 0x7fff_0000 + i).collect();
        for &pid in &others {
            u.sync(pid, &set, &mut sink, now);
            assert!(!sink.procs.contains_key(&pid), "not installed at its first sample");
            u.sync(pid, &set, &mut sink, now);
            assert_eq!(sink.procs.get(&pid), sink.procs.get(&me), "installed at its second, like this one");
        }
        assert_eq!(sink.proc_writes, 1 + others.len());
        assert_eq!(u.counters().table_builds.get(), builds, "no table built again");
        let deletes = sink.proc_delete_calls;
        u.forget_all(others.iter().copied().chain([me]), &mut sink, now);
        assert!(sink.procs.is_empty());
        assert_eq!(sink.proc_delete_calls, deletes + 1, "one delete for the drain's exits");
        let loaded = u.store.len();
        u.store.drop_unused(now + Duration::from_secs(3600), &mut sink);
        assert!(u.store.len() < loaded, "their tables are no longer held");
    }

    /// Tables that do not fit `max_table_bytes` together are not rebuilt
    /// by every new process that maps them: an evicted file waits out its
    /// backoff (frame pointers there), then may be built again.
    #[test]
    fn an_evicted_table_is_not_rebuilt_at_once() {
        let now = Instant::now();
        let me = std::process::id();
        let mut procs = ProcessTable::new(4);
        let set = procs.get(me, now).expect("self is readable").mappings.clone();
        let id: ComponentId = "ebpf".parse().unwrap();
        let counters = UnwindCounters::new(&ComponentTelemetry::detached(Kind::Receiver, &id));
        // Room for the largest table this process maps, not for all of them.
        let largest = set
            .mappings
            .iter()
            .filter(|m| m.path.starts_with('/'))
            .filter_map(|m| File::open(&*m.path).ok().and_then(|f| build(&f).ok()))
            .map(|(c, _)| c.rows.len().div_ceil(2) * 8 + c.pages.len() * profcol_elf::unwind::PAGE_ENTRY_BYTES)
            .max()
            .unwrap();
        let store = TableStore::new(largest as u64 + 4096, (largest as u32 / 8) + 512, 1 << 20, 16384);
        let mut u = Unwinder::new(store, counters).unwrap();
        let mut sink = MemSink::default();
        let settle = |u: &mut Unwinder, sink: &mut MemSink, pid: u32, at: Instant| {
            let deadline = Instant::now() + std::time::Duration::from_secs(60);
            u.sync(pid, &set, sink, at);
            while !u.pids.get(&pid).is_some_and(|p| p.complete) {
                assert!(Instant::now() < deadline, "pid {pid} installed within 60 s");
                std::thread::sleep(std::time::Duration::from_millis(20));
                u.poll(sink, at);
                u.sync(pid, &set, sink, at);
            }
        };
        settle(&mut u, &mut sink, me, now);
        let builds = u.counters().table_builds.get();
        assert!(u.counters().table_evictions.get() >= 1, "the tables do not fit together");
        // The process installed anew, again and again (as new processes
        // of the same programs would be): its files are opened through
        // /proc/PID, so it is this one each time.
        for _ in 0..5 {
            u.forget(me, &mut sink, now);
            settle(&mut u, &mut sink, me, now);
        }
        assert_eq!(u.counters().table_builds.get(), builds, "no rebuild within the backoff");
        // After it, a process installed anew (this one: its files are
        // opened through /proc/PID) gets the evicted table built again.
        u.forget(me, &mut sink, now);
        settle(&mut u, &mut sink, me, now + REBUILD_BACKOFF);
        assert!(
            u.counters().table_builds.get() > builds,
            "rebuilt after the backoff: {builds} builds, {} evictions, {} failures, backoff {:?}",
            u.counters().table_evictions.get(),
            u.counters().table_build_failures.get(),
            u.backoff.values().map(|b| (b.until.duration_since(now), b.evictions)).collect::<Vec<_>>()
        );
    }
}
