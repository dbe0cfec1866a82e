//! User-stack unwinding with `.eh_frame` tables (`unwind:` config): the
//! receiver's half of `ebpf/bpf/unwind.h`.
//!
//! The receiver keeps nothing per process in the kernel. The BPF program
//! finds the mapping of each pc itself (`bpf_find_vma`) and looks its file
//! up in `unwind_files` by the kernel's device and inode; a file it does
//! not find goes into `unwind_wanted`. [`Unwinder::read_wanted`] reads
//! those at each drain: a file met by two samples gets its table built
//! once per build id (by `profcol_elf::unwind`, on a worker thread, kept
//! by [`store::TableStore`] within `max_table_bytes`) and its
//! `unwind_files` entry written, or an entry saying it has none (frame
//! pointers there). New processes of known programs cost the receiver
//! nothing; a new program's first samples take frame pointers until its
//! tables are in, reported as `no_table`.
//!
//! - [`store`]: the tables loaded into the kernel's maps, shared per build id, within `max_table_bytes`.
//! - [`kernel`]: those BPF maps, as the store's sink.

pub(crate) mod kernel;
pub(crate) mod store;

use super::metrics as m;
use crate::ebpf::process::{Mapping, MappingSet};
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge};
use profcol_ebpf::unwind::{FileSegment, KernelFile, Want, FILES_CAPACITY, NO_TABLE, PENDING};
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

/// A wanted file met by one sample only is forgotten after this (asked
/// for again if met again): most short-lived programs are sampled once or
/// never, and their tables would be built for nothing.
const WANT_TTL_NS: u64 = 10_000_000_000;

/// The kernel's per-file maps, besides the tables.
pub(crate) trait FileSink: Sink {
    /// `file`'s entry of `unwind_files`: its table ([`NO_TABLE`]: none)
    /// and executable segments.
    fn set_file(&mut self, file: KernelFile, table: u32, segs: &[FileSegment]) -> Result<(), String>;
    fn remove_files(&mut self, files: &[KernelFile]);
    /// The entries of `unwind_wanted`, appended to `out`.
    fn wanted(&mut self, out: &mut Vec<(KernelFile, Want)>);
    fn remove_wanted(&mut self, files: &[KernelFile]);
}

/// Self-telemetry of unwinding (`profcol_receiver_ebpf_unwind_*`).
#[derive(Clone)]
pub(crate) struct UnwindCounters {
    /// Per reason (indexed by `UnwindEnd as usize`), `unknown` unused.
    pub stack_end: Vec<Counter>,
    pub table_builds: Counter,
    pub table_build_failures: Counter,
    pub table_build_micros: Counter,
    pub table_evictions: Counter,
    pub tables_loaded: Gauge,
    pub table_bytes: Gauge,
}

impl UnwindCounters {
    pub(crate) fn new(t: &ComponentTelemetry) -> Self {
        UnwindCounters {
            stack_end: UnwindEnd::ALL.iter().map(|e| t.counter_by(&m::UNWIND_STACK_END, e.name())).collect(),
            table_builds: t.counter_of(&m::UNWIND_TABLE_BUILDS),
            table_build_failures: t.counter_of(&m::UNWIND_TABLE_BUILD_FAILURES),
            table_build_micros: t.counter_of(&m::UNWIND_TABLE_BUILD_MICROS),
            table_evictions: t.counter_of(&m::UNWIND_TABLE_EVICTIONS),
            tables_loaded: t.gauge_of(&m::UNWIND_TABLES_LOADED),
            table_bytes: t.gauge_of(&m::UNWIND_TABLE_BYTES),
        }
    }

    /// Counts one sample's stack end.
    pub(crate) fn count_end(&self, end: UnwindEnd) {
        self.count_ends(end, 1);
    }

    /// Counts `n` samples' stack end (samples counted in the kernel).
    pub(crate) fn count_ends(&self, end: UnwindEnd, n: u64) {
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

/// What `unwind_files` holds for a file.
enum Written {
    /// The table of this key.
    Table(TableKey),
    /// No table (frame pointers); until the instant, when it was evicted
    /// recently, else for good.
    NoTable(Option<Instant>),
    /// Its table is being built: the BPF program walks it by frame
    /// pointers and does not ask for it again meanwhile.
    Pending,
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

/// Per-file tables in the kernel. Tables are built on a worker thread
/// (`profcol-unwind`), so a large binary never holds up the sampling loop;
/// the loop loads finished tables ([`Unwinder::poll`]) and writes the
/// entries of the files that wait for them.
pub(crate) struct Unwinder {
    store: TableStore,
    files: FxHashMap<TableKey, FileState>,
    counters: UnwindCounters,
    last_evictions: u64,
    jobs: SyncSender<(TableKey, File)>,
    built: Receiver<Built>,
    /// Signalled by the worker after each build (an eventfd), so the
    /// sampling thread loads the table at once rather than at its next
    /// drain: until then the BPF program looks the file up at every
    /// sample that meets it.
    built_fd: Arc<std::os::fd::OwnedFd>,
    /// Files evicted to make room, by key (at most MAX_FILES).
    backoff: FxHashMap<TableKey, Backoff>,
    /// The entries of `unwind_files`.
    written: FxHashMap<KernelFile, Written>,
    /// Files whose table is being built.
    waiting: FxHashMap<TableKey, Vec<KernelFile>>,
    /// Reused by [`Unwinder::read_wanted`].
    wants: Vec<(KernelFile, Want)>,
    done: Vec<KernelFile>,
    /// The agent's own executable, which gets no table (see
    /// [`Unwinder::no_table_for`]).
    own_exe: Option<OwnExe>,
}

/// An executable the unwinder builds no table for: its file, and its GNU
/// build id (lower-case hex), which also finds it where a container's
/// overlay shows another device and inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnExe {
    pub file: KernelFile,
    pub build_id: Option<Arc<str>>,
}

impl OwnExe {
    /// This process's executable (`/proc/self/exe`), if it can be read.
    pub(crate) fn current() -> Option<Self> {
        let f = File::open("/proc/self/exe").ok()?;
        let md = f.metadata().ok()?;
        let file = KernelFile::new(libc::major(md.dev()), libc::minor(md.dev()), md.ino());
        let build_id = crate::ebpf::process::buildid::read_build_id(&f)
            .ok()
            .flatten()
            .map(|b| Arc::from(profcol_elf::notes::hex(&b)));
        Some(OwnExe { file, build_id })
    }

    fn is(&self, file: KernelFile, m: &Mapping) -> bool {
        file == self.file || (self.build_id.is_some() && m.build_id == self.build_id)
    }
}

impl Unwinder {
    pub(crate) fn new(store: TableStore, counters: UnwindCounters) -> std::io::Result<Self> {
        let (jobs, job_rx) = sync_channel::<(TableKey, File)>(MAX_QUEUED_BUILDS);
        let (built_tx, built) = channel();
        let built_fd = Arc::new(profcol_ebpf::sys::eventfd()?);
        let signal_fd = built_fd.clone();
        // Not joined: dropping the sender ends it after the build at hand.
        std::thread::Builder::new().name("profcol-unwind".into()).spawn(move || {
            use std::os::fd::AsFd;
            while let Ok((key, file)) = job_rx.recv() {
                let started = Instant::now();
                let result = build(&file);
                let micros = started.elapsed().as_micros() as u64;
                if built_tx.send(Built { key, result, micros }).is_err() {
                    break;
                }
                profcol_ebpf::sys::eventfd_signal(signal_fd.as_fd());
            }
        })?;
        Ok(Unwinder {
            store,
            files: FxHashMap::default(),
            counters,
            last_evictions: 0,
            jobs,
            built,
            built_fd,
            backoff: FxHashMap::default(),
            written: FxHashMap::default(),
            waiting: FxHashMap::default(),
            wants: Vec::new(),
            done: Vec::new(),
            own_exe: None,
        })
    }

    /// Builds no table for `exe` (the agent's own executable): its frames
    /// are walked by frame pointers. A node agent samples itself from its
    /// first second; the table of its own ~30 MB of code took ~150 ms of
    /// CPU and ~16 MiB of transient heap at every start, and 3 MB of the
    /// table budget for as long as it runs (docs/PERFORMANCE.md).
    pub(crate) fn no_table_for(&mut self, exe: OwnExe) {
        self.own_exe = Some(exe);
    }

    #[cfg(test)]
    pub(crate) fn counters(&self) -> &UnwindCounters {
        &self.counters
    }

    /// The eventfd the worker signals after each build (for poll(2)).
    pub(crate) fn built_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.built_fd.as_raw_fd()
    }

    /// Loads the tables the worker finished into the kernel and writes the
    /// entries of the files waiting for them.
    pub(crate) fn poll(&mut self, sink: &mut dyn FileSink, now: Instant) {
        // Reset the eventfd first: a build finished after this read
        // signals it again.
        profcol_ebpf::sys::eventfd_take(std::os::fd::AsFd::as_fd(&*self.built_fd));
        let mut any = false;
        while let Ok(b) = self.built.try_recv() {
            any = true;
            self.counters.table_build_micros.add(b.micros);
            let loaded = b.result.and_then(|(compact, segments)| {
                let id = self.store.load(b.key.clone(), &compact, sink, now).map_err(|e| match e {
                    LoadRefused::TooLarge => {
                        format!("{} bytes of table do not fit unwind.max_table_bytes", compact.bytes())
                    }
                    LoadRefused::RulesFull => "the rule dictionary is full".to_owned(),
                    LoadRefused::Map(m) => m,
                })?;
                Ok((id, segments))
            });
            for key in self.store.take_evicted() {
                self.unwrite(&key, sink);
                self.back_off(key, now);
            }
            let waiting = self.waiting.remove(&b.key).unwrap_or_default();
            let state = match loaded {
                Ok((id, segments)) => {
                    self.counters.table_builds.inc();
                    tracing::debug!(key = ?b.key, micros = b.micros, bytes = self.store.bytes(), "ebpf receiver: unwind table built");
                    for f in waiting {
                        self.write_table(f, &b.key, id, &segments, sink);
                    }
                    FileState::Table(segments)
                }
                Err(e) => {
                    self.counters.table_build_failures.inc();
                    tracing::debug!(key = ?b.key, error = %e, "ebpf receiver: no unwind table (frame pointers there)");
                    for f in waiting {
                        self.write_none(f, None, sink);
                    }
                    FileState::NoTable
                }
            };
            self.remember(b.key, state);
        }
        if any {
            release_freed_memory();
        }
        self.publish();
    }

    /// Reads the files the BPF program asked for: each met by two samples
    /// gets its entry, or its table built first. `mappings_of` gives a
    /// process's mappings (the process table, which the kernel's records
    /// keep for processes that exited a moment ago).
    pub(crate) fn read_wanted(
        &mut self,
        sink: &mut dyn FileSink,
        mut mappings_of: impl FnMut(u32) -> Option<Arc<MappingSet>>,
        now: Instant,
    ) {
        let mut wants = std::mem::take(&mut self.wants);
        wants.clear();
        sink.wanted(&mut wants);
        if wants.is_empty() {
            self.wants = wants;
            return;
        }
        let now_ns = profcol_ebpf::clock::now_ns(libc::CLOCK_MONOTONIC);
        let mut done = std::mem::take(&mut self.done);
        done.clear();
        for &(file, w) in &wants {
            if self.written.contains_key(&file) {
                done.push(file);
                continue;
            }
            if w.count < 2 {
                if now_ns.saturating_sub(w.first_ns) > WANT_TTL_NS {
                    done.push(file);
                }
                continue;
            }
            // Asked for again by a later sample if nothing comes of it.
            done.push(file);
            let Some(set) = mappings_of(w.pid) else { continue };
            let Some(m) = set.find(w.start) else { continue };
            if !m.path.starts_with('/') || self.own_exe.as_ref().is_some_and(|own| own.is(file, m)) {
                self.write_none(file, None, sink);
                continue;
            }
            match self.table_for(w.pid, m, now) {
                Lookup::Ready(key, id, segments) => self.write_table(file, &key, id, &segments, sink),
                Lookup::None(until) => self.write_none(file, until, sink),
                Lookup::Waiting(key) => {
                    if self.written.len() < FILES_CAPACITY && sink.set_file(file, PENDING, &[]).is_ok() {
                        self.written.insert(file, Written::Pending);
                    }
                    let files = self.waiting.entry(key).or_default();
                    if !files.contains(&file) {
                        files.push(file);
                    }
                }
                Lookup::Retry => {}
            }
        }
        sink.remove_wanted(&done);
        self.wants = wants;
        self.done = done;
    }

    /// Once per interval: tables of files mapped by the processes sampled
    /// in it stay; tables no such process mapped for `store::UNUSED_GRACE`
    /// are dropped with their files' entries; "no table for now" entries
    /// whose backoff is over are removed (the file may be asked for again).
    pub(crate) fn sweep(
        &mut self,
        sink: &mut dyn FileSink,
        sampled: impl FnOnce(&mut dyn FnMut(&Mapping)),
        now: Instant,
    ) {
        let store = &mut self.store;
        sampled(&mut |m: &Mapping| {
            if let Some(k) = m.build_id.as_ref().or(m.file_id.as_ref()) {
                if let Some(id) = store.id(&TableKey::BuildId(k.clone())) {
                    store.touch(id, now);
                }
            }
        });
        for key in self.store.drop_unused(now, sink) {
            self.unwrite(&key, sink);
            self.files.remove(&key);
        }
        let expired: Vec<KernelFile> = self
            .written
            .iter()
            .filter(|(_, w)| matches!(w, Written::NoTable(Some(until)) if *until <= now))
            .map(|(f, _)| *f)
            .collect();
        if !expired.is_empty() {
            sink.remove_files(&expired);
            for f in &expired {
                self.written.remove(f);
            }
        }
        self.publish();
    }

    /// Removes the entries of the files that use `key`'s table.
    fn unwrite(&mut self, key: &TableKey, sink: &mut dyn FileSink) {
        let gone: Vec<KernelFile> =
            self.written.iter().filter(|(_, w)| matches!(w, Written::Table(k) if k == key)).map(|(f, _)| *f).collect();
        if !gone.is_empty() {
            sink.remove_files(&gone);
            for f in &gone {
                self.written.remove(f);
            }
        }
    }

    fn write_table(
        &mut self,
        file: KernelFile,
        key: &TableKey,
        id: u32,
        segments: &[LoadSegment],
        sink: &mut dyn FileSink,
    ) {
        if self.written.len() >= FILES_CAPACITY && !self.written.contains_key(&file) {
            return;
        }
        let segs: Vec<FileSegment> = segments
            .iter()
            .filter(|s| s.executable)
            .map(|s| FileSegment {
                off_lo: s.offset,
                off_hi: s.offset + s.filesz,
                delta: s.vaddr.wrapping_sub(s.offset),
            })
            .collect();
        match sink.set_file(file, id, &segs) {
            Ok(()) => {
                self.written.insert(file, Written::Table(key.clone()));
            }
            Err(e) => self.unwrite_file(file, &e, sink),
        }
    }

    /// An entry could not be written: any pending one goes too, so the BPF
    /// program asks for the file again.
    fn unwrite_file(&mut self, file: KernelFile, e: &str, sink: &mut dyn FileSink) {
        tracing::debug!(?file, error = %e, "ebpf receiver: unwind file entry not written");
        if self.written.remove(&file).is_some() {
            sink.remove_files(&[file]);
        }
    }

    fn write_none(&mut self, file: KernelFile, until: Option<Instant>, sink: &mut dyn FileSink) {
        if self.written.len() >= FILES_CAPACITY && !self.written.contains_key(&file) {
            return;
        }
        match sink.set_file(file, NO_TABLE, &[]) {
            Ok(()) => {
                self.written.insert(file, Written::NoTable(until));
            }
            Err(e) => self.unwrite_file(file, &e, sink),
        }
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

    /// The loaded table of mapping `m` of `pid`; a file seen for the first
    /// time (or evicted since) goes to the worker.
    fn table_for(&mut self, pid: u32, m: &Mapping, now: Instant) -> Lookup {
        let open = || {
            File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
                .or_else(|_| File::open(format!("/proc/{pid}/root{}", m.path)))
                .ok()
        };
        let mut file = None;
        // The build id, or profcol's file id for a file without one.
        let key = match m.build_id.as_ref().or(m.file_id.as_ref()) {
            Some(b) => TableKey::BuildId(b.clone()),
            None => {
                let Some(f) = open() else { return Lookup::Retry };
                let Ok(md) = f.metadata() else { return Lookup::Retry };
                file = Some(f);
                TableKey::File { dev: md.dev(), inode: md.ino(), size: md.size(), mtime: (md.mtime(), md.mtime_nsec()) }
            }
        };
        match (self.files.get(&key), self.store.id(&key)) {
            (Some(FileState::NoTable), _) => return Lookup::None(None),
            (Some(FileState::Pending), _) => return Lookup::Waiting(key),
            (Some(FileState::Table(segs)), Some(id)) => {
                let segs = segs.clone();
                return Lookup::Ready(key, id, segs);
            }
            // Never seen, or evicted since: build it (unless evicted
            // recently: then frame pointers for now).
            _ => {}
        }
        if let Some(b) = self.backoff.get(&key).filter(|b| now < b.until) {
            return Lookup::None(Some(b.until));
        }
        let Some(file) = file.or_else(open) else { return Lookup::Retry };
        match self.jobs.try_send((key.clone(), file)) {
            Ok(()) => {
                self.remember(key.clone(), FileState::Pending);
                Lookup::Waiting(key)
            }
            // The queue is full: asked again at a later sample.
            Err(TrySendError::Full(_)) => Lookup::Retry,
            Err(TrySendError::Disconnected(_)) => Lookup::None(None),
        }
    }

    fn remember(&mut self, key: TableKey, state: FileState) {
        if self.files.len() >= MAX_FILES && !self.files.contains_key(&key) {
            // Pending entries stay: their builds are on their way.
            self.files.retain(|_, s| matches!(s, FileState::Pending));
        }
        self.files.insert(key, state);
    }
}

/// What [`Unwinder::table_for`] found for a mapping.
enum Lookup {
    /// Its key, table id and segments.
    Ready(TableKey, u32, Arc<[LoadSegment]>),
    /// No table (frame pointers), until the instant or for good.
    None(Option<Instant>),
    /// Its table is being built.
    Waiting(TableKey),
    /// Not now (the file could not be opened, the build queue is full):
    /// asked for again by a later sample.
    Retry,
}

/// The compact table and segments of `file` (on the worker thread).
fn build(file: &File) -> Result<(CompactTable, Arc<[LoadSegment]>), String> {
    let elf = ElfFile::open(file).map_err(|e| e.to_string())?;
    let (compact, _) = elf.compact_unwind_table().map_err(|e| e.to_string())?;
    Ok((compact, elf.load_segments().into()))
}

/// Hands the heap the allocator keeps free back to the kernel. A table
/// build of a large binary allocates MiBs for a moment (its FDEs, the
/// compact table until it is in the kernel); glibc keeps what was freed in
/// the worker's arena, so a node agent's RSS would stay at its largest
/// build for good.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
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

    fn unwinder(store: TableStore) -> Unwinder {
        let id: ComponentId = "ebpf".parse().unwrap();
        let counters = UnwindCounters::new(&ComponentTelemetry::detached(Kind::Receiver, &id));
        Unwinder::new(store, counters).unwrap()
    }

    /// The kernel's name of mapping `m`'s file (`n` tells copies apart).
    fn kernel_file(m: &Mapping, n: u64) -> KernelFile {
        let md = std::fs::metadata(&*m.path).unwrap();
        KernelFile::new(libc::major(md.dev()), libc::minor(md.dev()), md.ino() + (n << 40))
    }

    /// This process: its pid, its mappings, the address of [`marker`] and
    /// the mapping holding it (this test binary's code).
    fn own_code(now: Instant) -> (u32, Arc<MappingSet>, u64, Mapping) {
        let me = std::process::id();
        let mut procs = ProcessTable::new(4);
        let set = procs.get(me, now).expect("self is readable").mappings.clone();
        let addr = marker as *const () as usize as u64;
        let m = set.find(addr).expect("a mapping holds the test's code").clone();
        (me, set, addr, m)
    }

    /// What the BPF program would put in `unwind_wanted` for `m` of `pid`.
    fn want(pid: u32, m: &Mapping, count: u32) -> Want {
        let first_ns = profcol_ebpf::clock::now_ns(libc::CLOCK_MONOTONIC);
        Want { pid, count, start: m.start, end: m.end, pgoff: m.file_offset / 4096, first_ns }
    }

    /// Polls until `files` all have an entry that is not "being built".
    fn settle(u: &mut Unwinder, sink: &mut MemSink, files: &[KernelFile], at: Instant) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !files.iter().all(|f| sink.files.get(f).is_some_and(|(t, _)| *t != PENDING)) {
            assert!(Instant::now() < deadline, "entries written within 60 s");
            std::thread::sleep(Duration::from_millis(20));
            u.poll(sink, at);
        }
    }

    /// This test binary's file, asked for the way the BPF program asks:
    /// nothing at its first sample, its table built at its second and its
    /// entry written; the entry takes the BPF program from a pc to the
    /// rule of its function. A second file with the same build id shares
    /// the table at once; when no sampled process maps it any more, the
    /// table and both entries go.
    #[test]
    fn a_file_met_twice_gets_its_table_and_entry() {
        let now = Instant::now();
        let (me, set, addr, m) = own_code(now);
        let mut u = unwinder(TableStore::new(256 << 20, 32 << 20, 1 << 20, 16384));
        let mut sink = MemSink::default();
        let file = kernel_file(&m, 0);
        sink.wanted.insert(file, want(me, &m, 1));
        u.read_wanted(&mut sink, |_| Some(set.clone()), now);
        assert!(sink.files.is_empty() && sink.wanted.contains_key(&file), "one sample: nothing built, still asked");
        sink.wanted.insert(file, want(me, &m, 2));
        u.read_wanted(&mut sink, |_| Some(set.clone()), now);
        assert!(sink.wanted.is_empty(), "taken");
        assert_eq!(sink.files.get(&file), Some(&(PENDING, Vec::new())), "being built: not asked for again");
        settle(&mut u, &mut sink, &[file], now);
        assert_eq!(u.counters().table_builds.get(), 1);
        let (table, segs) = sink.files[&file].clone();
        assert_ne!(table, NO_TABLE);
        // As unwind_range_from does: file offset, segment, table address.
        let off = addr - m.start + m.file_offset;
        let seg = segs.iter().find(|g| g.off_lo <= off && off < g.off_hi).expect("an executable segment holds it");
        let rule = sink.rule_at(table, off.wrapping_add(seg.delta)).expect("a rule");
        assert_eq!((rule.kind, rule.cfa_offset), (kind::CFA_RSP, 8), "{rule:?}");
        // A copy of the file (same build id, another inode): no build.
        let copy = kernel_file(&m, 1);
        sink.wanted.insert(copy, want(me, &m, 2));
        u.read_wanted(&mut sink, |_| Some(set.clone()), now);
        assert_eq!(sink.files.get(&copy), Some(&(table, segs)), "written at once");
        assert_eq!(u.counters().table_builds.get(), 1);
        // Sampled: kept; then unmapped for longer than the grace: gone.
        u.sweep(&mut sink, |f| set.mappings.iter().for_each(f), now + store::UNUSED_GRACE);
        assert_eq!(u.store.len(), 1);
        u.sweep(&mut sink, |_| {}, now + store::UNUSED_GRACE * 3);
        assert_eq!(u.store.len(), 0);
        assert!(sink.files.is_empty(), "{:?}", sink.files);
    }

    /// The agent's own executable gets a "no table" entry at its second
    /// sample, without a build, whether it is known by its file or, as in
    /// a container's overlay, only by its build id; another file is built.
    #[test]
    fn the_agents_own_executable_gets_no_table() {
        let now = Instant::now();
        let (me, set, _, m) = own_code(now);
        let own = OwnExe::current().expect("/proc/self/exe is readable");
        assert_eq!(own.file, kernel_file(&m, 0), "the mapping of this code is this executable");
        assert!(own.build_id.is_some() && own.build_id == m.build_id, "{:?} vs {:?}", own.build_id, m.build_id);
        for (n, by) in [(0, "file"), (1, "build id")] {
            let mut u = unwinder(TableStore::new(256 << 20, 32 << 20, 1 << 20, 16384));
            u.no_table_for(own.clone());
            let mut sink = MemSink::default();
            // n = 1: another device and inode (an overlay), the same build id.
            let file = kernel_file(&m, n);
            sink.wanted.insert(file, want(me, &m, 2));
            u.read_wanted(&mut sink, |_| Some(set.clone()), now);
            assert_eq!(sink.files.get(&file), Some(&(NO_TABLE, Vec::new())), "known by its {by}: no table");
            assert!(sink.wanted.is_empty(), "taken");
            std::thread::sleep(Duration::from_millis(50));
            u.poll(&mut sink, now);
            assert_eq!(u.counters().table_builds.get(), 0, "nothing built");
        }
        // Another executable (libc here) is built as before.
        let libc = set.mappings.iter().find(|m| m.path.contains("libc.so")).expect("libc is mapped").clone();
        let mut u = unwinder(TableStore::new(256 << 20, 32 << 20, 1 << 20, 16384));
        u.no_table_for(own);
        let mut sink = MemSink::default();
        let file = kernel_file(&libc, 0);
        sink.wanted.insert(file, want(me, &libc, 2));
        u.read_wanted(&mut sink, |_| Some(set.clone()), now);
        settle(&mut u, &mut sink, &[file], now);
        assert_ne!(sink.files[&file].0, NO_TABLE);
        assert_eq!(u.counters().table_builds.get(), 1);
    }

    /// Tables that do not fit `max_table_bytes` together are not rebuilt
    /// each time their files are met again: an evicted file gets a "no
    /// table" entry (frame pointers) until its backoff is over, then may
    /// be built again.
    #[test]
    fn an_evicted_table_is_not_rebuilt_at_once() {
        let now = Instant::now();
        let me = std::process::id();
        let mut procs = ProcessTable::new(4);
        let set = procs.get(me, now).expect("self is readable").mappings.clone();
        let mut seen = std::collections::HashSet::new();
        let maps: Vec<Mapping> =
            set.mappings.iter().filter(|m| m.path.starts_with('/') && seen.insert(m.path.clone())).cloned().collect();
        // Room for the largest table this process maps, not for all of them.
        let largest = maps
            .iter()
            .filter_map(|m| File::open(&*m.path).ok().and_then(|f| build(&f).ok()))
            .map(|(c, _)| c.rows.len().div_ceil(2) * 8 + c.pages.len() * profcol_elf::unwind::PAGE_ENTRY_BYTES)
            .max()
            .unwrap();
        let mut u = unwinder(TableStore::new(largest as u64 + 4096, (largest as u32 / 8) + 512, 1 << 20, 16384));
        let mut sink = MemSink::default();
        let files: Vec<KernelFile> = maps.iter().map(|m| kernel_file(m, 0)).collect();
        let ask = |u: &mut Unwinder, sink: &mut MemSink, at: Instant| {
            for (f, m) in files.iter().zip(&maps) {
                if !sink.files.contains_key(f) {
                    sink.wanted.insert(*f, want(me, m, 2));
                }
            }
            u.read_wanted(sink, |_| Some(set.clone()), at);
        };
        // Until every file has an entry (evicted ones are asked again).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            ask(&mut u, &mut sink, now);
            settle(&mut u, &mut sink, &[], now);
            std::thread::sleep(Duration::from_millis(20));
            u.poll(&mut sink, now);
            if files.iter().all(|f| sink.files.contains_key(f)) && u.waiting.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "every file has an entry within 60 s");
        }
        assert!(u.counters().table_evictions.get() >= 1, "the tables do not fit together");
        let builds = u.counters().table_builds.get();
        let none = sink.files.values().filter(|(t, _)| *t == NO_TABLE).count();
        assert!(none >= 1, "an evicted file walks by frame pointers for now");
        for _ in 0..5 {
            ask(&mut u, &mut sink, now);
            u.poll(&mut sink, now);
        }
        assert_eq!(u.counters().table_builds.get(), builds, "no rebuild within the backoff");
        // After it, the "no table" entries go, and the next ask builds.
        u.sweep(&mut sink, |f| set.mappings.iter().for_each(f), now + REBUILD_BACKOFF);
        ask(&mut u, &mut sink, now + REBUILD_BACKOFF);
        let deadline = Instant::now() + Duration::from_secs(60);
        while u.counters().table_builds.get() == builds {
            assert!(Instant::now() < deadline, "rebuilt after the backoff");
            std::thread::sleep(Duration::from_millis(20));
            u.poll(&mut sink, now + REBUILD_BACKOFF);
        }
    }
}
