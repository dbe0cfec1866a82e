//! What the receiver knows about sampled processes: identity, executable,
//! container, and executable mappings with build IDs.
//!
//! A process that exec'd since the receiver started is known from the
//! kernel's exec and mapping records ([`image_records`]): no /proc
//! read but its cgroup, and its samples are named even when it exited
//! before they were read. Others are read from /proc.
//!
//! Bounded: at most `capacity` processes; the least recently sampled one is
//! evicted first, processes not sampled for [`IDLE_TTL`] are forgotten, and
//! exited processes are dropped on the next sweep. A process whose /proc
//! entry cannot be read is remembered as unreadable (one counted drop) so
//! its later samples cost nothing and log nothing.
//!
//! Submodules, what the table is fed from:
//!
//! - [`procfs`]: readers and parsers of the /proc files (maps, stat, cgroup, ...).
//! - [`exec_maps`]: a process's executable file mappings (`PROCMAP_QUERY`, or the maps text).
//! - [`mmap_events`]: the kernel's exec and mapping records, read from per-CPU perf rings.
//! - [`image_records`]: process images as those records tell them, kept past the exit.
//! - [`buildid`]: GNU build IDs of mapped files, cached per file.
//! - [`containers`]: container and pod identity from the runtime's files, cached per container.
//! - [`service_name`]: each process's `service.name`.

pub(crate) mod buildid;
pub mod containers;
pub(crate) mod exec_maps;
pub(crate) mod image_records;
pub mod mmap_events;
pub mod procfs;
pub mod service_name;

use buildid::{BuildIdCache, FileIds};
use containers::{Container, ContainerTable};
use image_records::{ImageRecords, RecordedMap};
use mmap_events::FileMap;
use profcol_api::services::{FilePins, PinnedFile};
use rustc_hash::FxHashMap;
use service_name::ServiceNamer;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Processes not sampled for this long are forgotten (re-read on next sample).
pub(crate) const IDLE_TTL: Duration = Duration::from_secs(120);
/// A process's maps are re-read at most this often on address misses.
pub(crate) const REFRESH_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Unreadable processes are retried after this long (the pid may be reused).
pub(crate) const UNREADABLE_TTL: Duration = Duration::from_secs(30);
/// At most this many maps refreshes per second across all processes.
pub(crate) const REFRESH_BUDGET_PER_SEC: u32 = 100;
/// A file's ids, checked against the file (a `stat` of its path, or
/// through a live process's `map_files`) this recently, are taken for a new
/// mapping of the same (device, inode) without a system call: a program
/// started again and again costs none per mapped file.
pub(crate) const RECORD_IDS_TTL: Duration = Duration::from_secs(1);
/// Files remembered by (device, inode) for [`RECORD_IDS_TTL`].
const MAX_RECORD_IDS: usize = 4096;

/// An executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// Path in the process's mount namespace, or `[vdso]`-style name, or
    /// `[anon]` for anonymous executable memory (JIT code).
    pub path: Arc<str>,
    /// Lower-case hex GNU build ID, when the file has one.
    pub build_id: Option<Arc<str>>,
    /// File id of an ELF file without a build ID (`profcol_elf::file_id`).
    pub file_id: Option<Arc<str>>,
}

/// Resource-level facts about a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub start_time: u64,
    /// `process.executable.name`: base name of the executable, or comm.
    pub exe_name: String,
    pub exe_path: Option<String>,
    /// The container it runs in (`container.id`, `k8s.*` attributes).
    pub container: Option<Arc<Container>>,
    /// `service.name`, from the configured sources (see `service_name`).
    pub service_name: String,
}

/// Mappings as of one read of /proc/PID/maps, sorted by start.
#[derive(Debug)]
pub struct MappingSet {
    pub generation: u32,
    pub mappings: Vec<Mapping>,
}

impl MappingSet {
    /// The mapping holding `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }
}

/// One known process.
pub(crate) struct ProcessState {
    /// `start_time` is 0 for a process known from the kernel's records.
    pub info: Arc<ProcessInfo>,
    pub mappings: Arc<MappingSet>,
    last_refresh: Instant,
    last_seen: Instant,
    /// CLOCK_MONOTONIC ns when /proc was read: an exec after it means the
    /// executable, build ID and mappings read are the old image's.
    loaded_ktime: u64,
}

enum Slot {
    Live(ProcessState),
    Unreadable { since: Instant },
}

/// Counters the table keeps for self-telemetry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Processes whose /proc entry could not be read (one per process).
    pub unreadable: u64,
    /// Re-reads of /proc/PID/maps after an address miss.
    pub refreshes: u64,
    /// Refreshes skipped: too soon, or over the global budget.
    pub refreshes_skipped: u64,
    /// Processes dropped because they exited.
    pub exited: u64,
    /// Processes evicted to stay within capacity or after IDLE_TTL.
    pub evicted: u64,
    /// Processes read again because they exec'd after they were read.
    pub exec_reloads: u64,
    /// Processes known from the kernel's records rather than /proc.
    pub from_records: u64,
}

/// Known processes, bounded.
pub(crate) struct ProcessTable {
    procs: FxHashMap<u32, Slot>,
    namer: ServiceNamer,
    capacity: usize,
    build_ids: BuildIdCache,
    next_generation: u32,
    budget_window: Instant,
    budget_used: u32,
    /// Known processes that exec'd since they were read: pid → the exec's
    /// CLOCK_MONOTONIC ns. At most one entry per known process.
    execs: FxHashMap<u32, u64>,
    /// Where mapped files are pinned for `user_symbols` (by build id or
    /// file id) while their processes live.
    pins: Option<Arc<FilePins>>,
    /// Images of processes exec'd since the receiver started.
    images: ImageRecords,
    /// The time of the sample being read ([`Self::sample_at`]): which
    /// image of the records it belongs to.
    sample_ktime: u64,
    /// File ids by the (device, inode) the records name, and when they
    /// were last checked against the file.
    record_ids: FxHashMap<(u32, u32, u64), (FileIds, Instant)>,
    /// Container ids by cgroup v2 id, read from a process of the cgroup.
    cgroup_containers: FxHashMap<u64, Option<String>>,
    /// Containers by id: who they are, read once each.
    containers: ContainerTable,
    pub stats: TableStats,
}

impl ProcessTable {
    pub(crate) fn new(capacity: usize) -> Self {
        ProcessTable {
            procs: FxHashMap::default(),
            namer: ServiceNamer::new(vec![service_name::Source::Executable]),
            capacity: capacity.max(1),
            build_ids: BuildIdCache::new(4096),
            next_generation: 1,
            budget_window: Instant::now(),
            budget_used: 0,
            execs: FxHashMap::default(),
            pins: None,
            images: ImageRecords::new(capacity.max(1)),
            sample_ktime: u64::MAX,
            record_ids: FxHashMap::default(),
            cgroup_containers: FxHashMap::default(),
            containers: ContainerTable::new(),
            stats: TableStats::default(),
        }
    }

    /// Pins every mapped ELF file in `pins` from now on.
    pub(crate) fn set_file_pins(&mut self, pins: Arc<FilePins>) {
        self.pins = Some(pins);
    }

    /// Names processes loaded from now on by these sources.
    pub(crate) fn set_service_namer(&mut self, namer: ServiceNamer) {
        self.namer = namer;
    }

    /// How a sample whose process /proc cannot tell about is named.
    pub(crate) fn namer(&self) -> &ServiceNamer {
        &self.namer
    }

    pub(crate) fn len(&self) -> usize {
        self.procs.len()
    }

    /// The containers of sampled processes, by id (shared by everything
    /// that asks who a container is).
    pub(crate) fn containers(&mut self) -> &mut ContainerTable {
        &mut self.containers
    }

    /// Whether process `pid` is in the table.
    pub(crate) fn knows(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Files whose build ID was read from disk so far.
    pub(crate) fn build_id_reads(&self) -> u64 {
        self.build_ids.reads
    }

    /// A kernel exec record (`PERF_RECORD_COMM` with the exec flag).
    pub(crate) fn on_exec_record(&mut self, pid: u32, time_ns: u64) {
        self.images.on_exec(pid, time_ns);
    }

    /// An exec event (BPF) of `pid` in cgroup `cgroup_id`: the container
    /// id of a process known from the records is read once per cgroup.
    pub(crate) fn on_exec_event(&mut self, pid: u32, ktime_ns: u64, cgroup_id: u64) {
        self.images.on_exec_event(pid, ktime_ns, cgroup_id);
    }

    /// A kernel mapping record (`PERF_RECORD_MMAP2` of an executable file).
    pub(crate) fn on_map_record(&mut self, pid: u32, m: &FileMap, path: &[u8], time_ns: u64) {
        self.images.on_map(pid, m, path, time_ns);
    }

    /// `pid` exited at `ktime_ns` (a `sched_process_exit` event).
    pub(crate) fn on_exit(&mut self, pid: u32, ktime_ns: u64) {
        self.images.on_exit(pid, ktime_ns);
    }

    /// Kernel records were lost: processes are read from /proc until their
    /// next exec is recorded.
    pub(crate) fn on_records_lost(&mut self) {
        self.images.on_lost();
    }

    /// `pid` exec'd at `ktime_ns` (a `sched_process_exec` event). If it was
    /// read before that, its first sample taken after the exec reads it
    /// again; samples taken before keep the old image.
    pub(crate) fn exec(&mut self, pid: u32, ktime_ns: u64) {
        if let Some(Slot::Live(st)) = self.procs.get(&pid) {
            if st.loaded_ktime < ktime_ns {
                let e = self.execs.entry(pid).or_insert(ktime_ns);
                *e = (*e).max(ktime_ns);
            }
        }
    }

    /// Called with each sample before [`Self::get`] / [`Self::resolve`]:
    /// forgets `pid`'s old image when the sample was taken after an exec
    /// the table has not read yet.
    pub(crate) fn sample_at(&mut self, pid: u32, ktime_ns: u64) {
        self.sample_ktime = ktime_ns;
        let Some(&exec) = self.execs.get(&pid) else { return };
        if ktime_ns < exec {
            return;
        }
        self.execs.remove(&pid);
        if matches!(self.procs.get(&pid), Some(Slot::Live(st)) if st.loaded_ktime < exec) {
            self.procs.remove(&pid);
            self.stats.exec_reloads += 1;
        }
    }

    /// The state of `pid`, loading it on first sight; `None` when its /proc
    /// entry is unreadable (counted once per process).
    pub(crate) fn get(&mut self, pid: u32, now: Instant) -> Option<&mut ProcessState> {
        let reload = match self.procs.get(&pid) {
            None => true,
            // Unreadable from /proc (a sample of it taken before its exec,
            // by then gone): the records may hold the image of this one.
            Some(Slot::Unreadable { since }) => {
                now.duration_since(*since) >= UNREADABLE_TTL || self.images.at(pid, self.sample_ktime).is_some()
            }
            Some(Slot::Live(_)) => false,
        };
        if reload {
            if !self.procs.contains_key(&pid) && self.procs.len() >= self.capacity {
                self.evict_one();
            }
            let slot = match self.load(pid, now) {
                Some(st) => Slot::Live(st),
                None => {
                    if !matches!(self.procs.get(&pid), Some(Slot::Unreadable { .. })) {
                        self.stats.unreadable += 1;
                    }
                    tracing::debug!(pid, "cannot read /proc/{pid}: samples keep raw addresses");
                    Slot::Unreadable { since: now }
                }
            };
            self.procs.insert(pid, slot);
        }
        match self.procs.get_mut(&pid) {
            Some(Slot::Live(st)) => {
                st.last_seen = now;
                Some(st)
            }
            _ => None,
        }
    }

    /// Makes sure every address in `addrs` is covered by the process's
    /// mappings, re-reading /proc/PID/maps (rate-limited) when one is not.
    /// Returns the state to use for this sample.
    pub(crate) fn resolve(&mut self, pid: u32, addrs: &[u64], now: Instant) -> Option<&mut ProcessState> {
        let miss = {
            let st = self.get(pid, now)?;
            addrs.iter().any(|&a| st.mappings.find(a).is_none())
                && now.duration_since(st.last_refresh) >= REFRESH_MIN_INTERVAL
        };
        if miss {
            if now.duration_since(self.budget_window) >= Duration::from_secs(1) {
                self.budget_window = now;
                self.budget_used = 0;
            }
            if self.budget_used < REFRESH_BUDGET_PER_SEC {
                self.budget_used += 1;
                self.refresh(pid, now);
            } else {
                self.stats.refreshes_skipped += 1;
            }
        }
        match self.procs.get_mut(&pid) {
            Some(Slot::Live(st)) => Some(st),
            _ => None,
        }
    }

    fn refresh(&mut self, pid: u32, now: Instant) {
        self.stats.refreshes += 1;
        let same_process = match (self.procs.get_mut(&pid), procfs::read_start_time(pid)) {
            // Known from the records: a new image would have come as an
            // exec; its maps are read from /proc (a library mapped since).
            (Some(Slot::Live(st)), Ok(_)) if st.info.start_time == 0 => true,
            (Some(Slot::Live(st)), Ok(t)) => t == st.info.start_time,
            // Gone (its last samples, taken while it exited, are drained
            // after it): they keep the image it had; the sweep drops it.
            (Some(Slot::Live(st)), Err(_)) => {
                st.last_refresh = now;
                return;
            }
            _ => false,
        };
        if !same_process {
            // The pid now names another process, or was unreadable: start over.
            self.procs.remove(&pid);
            self.execs.remove(&pid);
            if let Some(st) = self.load(pid, now) {
                self.procs.insert(pid, Slot::Live(st));
            } else {
                self.stats.unreadable += 1;
                self.procs.insert(pid, Slot::Unreadable { since: now });
            }
            return;
        }
        let set = self.read_mappings(pid);
        if let Some(Slot::Live(st)) = self.procs.get_mut(&pid) {
            st.last_refresh = now;
            if let Some(set) = set {
                st.mappings = Arc::new(set);
            }
        }
    }

    fn load(&mut self, pid: u32, now: Instant) -> Option<ProcessState> {
        if let Some(st) = self.load_from_records(pid, now) {
            self.stats.from_records += 1;
            return Some(st);
        }
        // Before the reads: an exec while reading counts as after them.
        let loaded_ktime = profcol_ebpf::clock::now_ns(libc::CLOCK_MONOTONIC);
        let facts = procfs::read_facts(pid).ok()?;
        let mappings = self.read_mappings(pid)?;
        let exe_name = facts
            .exe_path
            .as_deref()
            .map(procfs::base_name)
            .filter(|n| !n.is_empty())
            .unwrap_or(&facts.comm)
            .to_owned();
        let container = facts.container_id.as_deref().and_then(|id| self.containers.get(id));
        let service_name = self.namer.name(pid, &exe_name, container.as_deref());
        Some(ProcessState {
            info: Arc::new(ProcessInfo {
                pid,
                start_time: facts.start_time,
                exe_name,
                exe_path: facts.exe_path,
                container,
                service_name,
            }),
            mappings: Arc::new(mappings),
            last_refresh: now,
            last_seen: now,
            loaded_ktime,
        })
    }

    /// The process as the kernel's records tell it, if they hold the image
    /// the current sample ran: its mappings in address order, each file's
    /// ids checked through the live process (or, once it is gone, opened
    /// by path and matched by inode), its cgroup from /proc if still there.
    fn load_from_records(&mut self, pid: u32, now: Instant) -> Option<ProcessState> {
        let img = self.images.at(pid, self.sample_ktime)?;
        let exe = img.executable()?;
        let exe_path = exe.path.to_string();
        let loaded_ktime = img.exec_ns;
        let cgroup_id = img.cgroup_id();
        // In the order they were made: a mapping over an earlier one's
        // addresses replaces it (an unmapping has no record).
        let mut maps: Vec<RecordedMap> = Vec::new();
        for m in img.maps() {
            maps.retain(|e| e.end <= m.start || m.end <= e.start);
            maps.push(m.clone());
        }
        maps.sort_unstable_by_key(|m| m.start);
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        let mut mappings = Vec::with_capacity(maps.len());
        for m in &maps {
            let ids = self.ids_of_record(pid, m, now);
            mappings.push(Mapping {
                start: m.start,
                end: m.end,
                file_offset: m.offset,
                path: m.path.clone(),
                build_id: ids.build_id,
                file_id: ids.file_id,
            });
        }
        let container_id = match cgroup_id.and_then(|id| self.cgroup_containers.get(&id)) {
            Some(c) => c.clone(),
            None => {
                let c = procfs::read_cgroup(pid).map(|cg| procfs::container_id(&cg));
                // Kept only when read (a process gone says nothing of its cgroup).
                if let (Some(id), Some(c)) = (cgroup_id, &c) {
                    if self.cgroup_containers.len() >= MAX_RECORD_IDS {
                        self.cgroup_containers.clear();
                    }
                    self.cgroup_containers.insert(id, c.clone());
                }
                c.flatten()
            }
        };
        let exe_name = procfs::base_name(&exe_path).to_owned();
        let container = container_id.as_deref().and_then(|id| self.containers.get(id));
        let service_name = self.namer.name(pid, &exe_name, container.as_deref());
        Some(ProcessState {
            info: Arc::new(ProcessInfo {
                pid,
                start_time: 0,
                exe_name,
                exe_path: Some(exe_path),
                container,
                service_name,
            }),
            mappings: Arc::new(MappingSet { generation, mappings }),
            last_refresh: now,
            last_seen: now,
            loaded_ktime,
        })
    }

    /// The ids of a recorded mapping's file.
    fn ids_of_record(&mut self, pid: u32, m: &RecordedMap, now: Instant) -> FileIds {
        let key = (m.dev.0, m.dev.1, m.ino);
        if let Some((ids, checked)) = self.record_ids.get(&key) {
            // Still pinned for user_symbols, or it is opened again below.
            let pinned = match (&self.pins, ids.key()) {
                (Some(pins), Some(k)) => pins.touch(k),
                _ => true,
            };
            if pinned && now.duration_since(*checked) < RECORD_IDS_TTL {
                return ids.clone();
            }
        }
        // The path as the host sees it names the same file (the device and
        // inode the kernel reported; the common case outside containers):
        // one stat, no /proc lookup.
        let same_file = |md: &std::fs::Metadata| md.ino() == m.ino && md.dev() == libc::makedev(m.dev.0, m.dev.1);
        let by_path = std::fs::metadata(&*m.path).ok().filter(same_file);
        let cached = by_path.and_then(|md| self.build_ids.cached(&md)).filter(|ids| match (&self.pins, ids.key()) {
            (Some(pins), Some(k)) => pins.touch(k),
            _ => true,
        });
        let ids = match cached.or_else(|| self.ids_of(pid, m.start, m.end, &m.path)) {
            Some(ids) => ids,
            // Gone: the last ids seen for the file, else the file by its
            // path if it is still the same one (pinned from there).
            None => match self.record_ids.get(&key) {
                Some((ids, _)) => return ids.clone(),
                None => match File::open(&*m.path) {
                    Ok(f) if f.metadata().is_ok_and(|md| same_file(&md)) => {
                        let ids = self.build_ids.ids(&f).unwrap_or_default();
                        if let (Some(pins), Some(k)) = (&self.pins, ids.key()) {
                            if !pins.touch(k) {
                                let file = PinnedFile { file: Arc::new(f), path: m.path.clone(), root: None };
                                pins.pin(k.clone(), file);
                            }
                        }
                        ids
                    }
                    _ => return FileIds::default(),
                },
            },
        };
        if self.record_ids.len() >= MAX_RECORD_IDS {
            self.record_ids.clear();
        }
        self.record_ids.insert(key, (ids.clone(), now));
        ids
    }

    fn read_mappings(&mut self, pid: u32) -> Option<MappingSet> {
        let entries = procfs::read_maps(pid).ok()?;
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        let mut by_file: FxHashMap<(u32, u32, u64), FileIds> = FxHashMap::default();
        let mut paths: FxHashMap<String, Arc<str>> = FxHashMap::default();
        let mut mappings = Vec::with_capacity(entries.len());
        for e in entries {
            let ids = if e.is_file() {
                let key = (e.dev.0, e.dev.1, e.inode);
                match by_file.get(&key) {
                    Some(b) => b.clone(),
                    None => {
                        let b = self.ids_of(pid, e.start, e.end, &e.path).unwrap_or_default();
                        by_file.insert(key, b.clone());
                        b
                    }
                }
            } else {
                FileIds::default()
            };
            let name = if e.path.is_empty() { "[anon]" } else { e.path.as_str() };
            let path = paths.entry(name.to_owned()).or_insert_with(|| Arc::from(name)).clone();
            mappings.push(Mapping {
                start: e.start,
                end: e.end,
                file_offset: e.offset,
                path,
                build_id: ids.build_id,
                file_id: ids.file_id,
            });
        }
        Some(MappingSet { generation, mappings })
    }

    /// Opens the mapped file the way the process sees it: through
    /// map_files (works across mount namespaces and for deleted files),
    /// else through the process's root.
    ///
    /// With pins set, the opened file is pinned under its build id (or
    /// file id) unless already pinned, so `user_symbols` can read it after
    /// the process is gone, whatever mount namespace it lived in.
    ///
    /// `None` when the file cannot be opened (the process is gone).
    fn ids_of(&mut self, pid: u32, start: u64, end: u64, path: &str) -> Option<FileIds> {
        let via_map_files = procfs::ProcPath::map_file(pid, start, end);
        // A file read before and pinned already: one stat, no open.
        if let Some(ids) = std::fs::metadata(via_map_files.as_path()).ok().and_then(|md| self.build_ids.cached(&md)) {
            let pinned = match (&self.pins, ids.key()) {
                (Some(pins), Some(key)) => pins.touch(key),
                _ => true,
            };
            if pinned {
                return Some(ids);
            }
        }
        let file =
            File::open(via_map_files.as_path()).or_else(|_| File::open(format!("/proc/{pid}/root{path}"))).ok()?;
        let ids = self.build_ids.ids(&file).unwrap_or_default();
        if let (Some(pins), Some(key)) = (&self.pins, ids.key()) {
            if !pins.touch(key) {
                let root = Some(Arc::from(format!("/proc/{pid}/root")));
                pins.pin(key.clone(), PinnedFile { file: Arc::new(file), path: Arc::from(path), root });
            }
        }
        Some(ids)
    }

    fn evict_one(&mut self) {
        let victim = self
            .procs
            .iter()
            .min_by_key(|(_, s)| match s {
                Slot::Unreadable { since } => (0, *since),
                Slot::Live(st) => (1, st.last_seen),
            })
            .map(|(&pid, _)| pid);
        if let Some(pid) = victim {
            self.procs.remove(&pid);
            self.execs.remove(&pid);
            self.stats.evicted += 1;
        }
    }

    /// Calls `f` with each mapping of the processes sampled since `since`.
    pub(crate) fn for_each_sampled_mapping(&self, since: Instant, f: &mut dyn FnMut(&Mapping)) {
        for slot in self.procs.values() {
            if let Slot::Live(st) = slot {
                if st.last_seen >= since {
                    st.mappings.mappings.iter().for_each(&mut *f);
                }
            }
        }
    }

    /// Drops exited processes, idle ones and stale unreadable markers. Call
    /// once per report interval; `seen_since` is the interval start, so only
    /// processes not sampled during it are checked against /proc.
    pub(crate) fn sweep(&mut self, now: Instant, seen_since: Instant) {
        let mut gone = Vec::new();
        for (&pid, slot) in &self.procs {
            match slot {
                Slot::Unreadable { since } => {
                    if now.duration_since(*since) >= UNREADABLE_TTL {
                        gone.push((pid, false));
                    }
                }
                Slot::Live(st) => {
                    if st.last_seen >= seen_since {
                        // Still sampled: its files stay pinned.
                        if let Some(pins) = &self.pins {
                            for m in &st.mappings.mappings {
                                if let Some(k) = m.build_id.as_ref().or(m.file_id.as_ref()) {
                                    pins.touch(k);
                                }
                            }
                        }
                        continue;
                    }
                    if now.duration_since(st.last_seen) >= IDLE_TTL {
                        gone.push((pid, false));
                    } else if st.info.start_time == 0 {
                        // Known from the records, which saw its exit.
                        if self.images.exited(pid) {
                            gone.push((pid, true));
                        }
                    } else if procfs::read_start_time(pid).ok() != Some(st.info.start_time) {
                        gone.push((pid, true));
                    }
                }
            }
        }
        self.images.sweep(profcol_ebpf::clock::now_ns(libc::CLOCK_MONOTONIC));
        self.containers.sweep(now);
        for (pid, exited) in gone {
            self.procs.remove(&pid);
            self.execs.remove(&pid);
            if exited {
                self.stats.exited += 1;
            } else {
                self.stats.evicted += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ranges: &[(u64, u64)]) -> MappingSet {
        MappingSet {
            generation: 1,
            mappings: ranges
                .iter()
                .map(|&(s, e)| Mapping {
                    start: s,
                    end: e,
                    file_offset: 0,
                    path: Arc::from("/x"),
                    build_id: None,
                    file_id: None,
                })
                .collect(),
        }
    }

    #[test]
    fn find_by_address() {
        let s = set(&[(0x1000, 0x2000), (0x3000, 0x4000)]);
        assert_eq!(s.find(0x1000).map(|m| m.start), Some(0x1000));
        assert_eq!(s.find(0x1fff).map(|m| m.start), Some(0x1000));
        assert_eq!(s.find(0x2000), None);
        assert_eq!(s.find(0x3500).map(|m| m.start), Some(0x3000));
        assert_eq!(s.find(0), None);
        assert_eq!(s.find(u64::MAX), None);
        assert_eq!(set(&[]).find(5), None);
    }

    #[test]
    fn an_exec_after_the_read_rereads_for_later_samples_only() {
        let now = Instant::now();
        let mut t = ProcessTable::new(4);
        let me = std::process::id();
        let first = t.get(me, now).unwrap().mappings.generation;
        let loaded = t.get(me, now).unwrap().loaded_ktime;
        // An exec before the read changes nothing.
        t.exec(me, loaded - 1);
        t.sample_at(me, loaded + 10);
        assert_eq!(t.get(me, now).unwrap().mappings.generation, first);
        // An exec after it: earlier samples keep the image, later ones read again.
        t.exec(me, loaded + 100);
        t.sample_at(me, loaded + 99);
        assert_eq!(t.get(me, now).unwrap().mappings.generation, first);
        t.sample_at(me, loaded + 100);
        assert_ne!(t.get(me, now).unwrap().mappings.generation, first);
        assert_eq!(t.stats.exec_reloads, 1);
        // Once read again, the same exec does nothing more.
        t.sample_at(me, loaded + 200);
        assert_eq!(t.stats.exec_reloads, 1);
        // Exec events of unknown processes are not kept.
        t.exec(u32::MAX - 7, 1);
        assert!(t.execs.is_empty());
    }

    #[test]
    fn loads_self_and_counts_unreadable_once() {
        let now = Instant::now();
        let mut t = ProcessTable::new(4);
        let me = std::process::id();
        let st = t.get(me, now).expect("self is readable");
        assert_eq!(st.info.pid, me);
        assert!(!st.mappings.mappings.is_empty());
        let exe = std::env::current_exe().unwrap();
        let m = st.mappings.mappings.iter().find(|m| *m.path == *exe.to_string_lossy()).expect("exe mapped");
        assert!(m.build_id.is_some(), "test binary has a GNU build id");
        // A pid that does not exist: one counted drop, however many samples.
        let ghost = u32::MAX - 7;
        for _ in 0..100 {
            assert!(t.get(ghost, now).is_none());
            assert!(t.resolve(ghost, &[1, 2, 3], now).is_none());
        }
        assert_eq!(t.stats.unreadable, 1);
    }

    #[test]
    fn exited_process_is_dropped_on_sweep() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let t0 = Instant::now();
        let mut t = ProcessTable::new(8);
        let st = t.get(pid, t0).expect("child is readable");
        assert_eq!(st.info.exe_name, "sleep");
        // Still alive and sampled in this interval: kept.
        t.sweep(t0, t0);
        assert_eq!(t.len(), 1);
        child.kill().unwrap();
        child.wait().unwrap();
        // Not sampled since `later` and gone from /proc: dropped.
        let later = t0 + Duration::from_millis(1);
        t.sweep(later, later);
        assert_eq!(t.len(), 0);
        assert_eq!(t.stats.exited, 1);
    }

    /// The kernel's records of an exec of the running test binary by `pid`.
    fn record_exec_of_self(t: &mut ProcessTable, pid: u32, exec_ns: u64) -> String {
        let exe = std::env::current_exe().unwrap();
        let md = std::fs::metadata(&exe).unwrap();
        let mut b = mmap_events::MappingBatch::default();
        let path = exe.to_string_lossy().into_owned();
        b.push_map(
            exec_ns + 1,
            pid,
            0x5000..0x9000,
            0x1000,
            ((libc::major(md.dev()), libc::minor(md.dev())), md.ino()),
            path.as_bytes(),
        );
        t.on_exec_record(pid, exec_ns);
        let e = b.events[0];
        let mmap_events::MappingEventKind::Map(m) = e.kind else { unreachable!() };
        t.on_map_record(pid, &m, b.path(&m), e.time_ns);
        path
    }

    #[test]
    fn a_process_gone_before_its_samples_are_read_is_named_from_the_records() {
        let now = Instant::now();
        let mut t = ProcessTable::new(4);
        let ghost = u32::MAX - 9; // no such process: /proc cannot tell
        let path = record_exec_of_self(&mut t, ghost, 100);
        t.on_exit(ghost, 500);
        // A sample taken before the exit: the image the records hold.
        t.sample_at(ghost, 300);
        let st = t.get(ghost, now).expect("named from the records");
        assert_eq!(st.info.exe_path.as_deref(), Some(path.as_str()));
        assert_eq!(st.info.exe_name, procfs::base_name(&path));
        let m = st.mappings.find(0x6000).expect("the recorded mapping");
        assert_eq!((m.start, m.end, m.file_offset, &*m.path), (0x5000, 0x9000, 0x1000, path.as_str()));
        assert!(m.build_id.is_some(), "the file opened by its path, same inode: its build id");
        assert_eq!((t.stats.from_records, t.stats.unreadable), (1, 0));
        // Gone per the records: dropped on the next sweep it was not sampled in.
        let later = now + Duration::from_millis(1);
        t.sweep(later, later);
        assert_eq!((t.len(), t.stats.exited), (0, 1));
        // A sample after the exit (a reused pid): not the recorded image.
        t.sample_at(ghost, 600);
        assert!(t.get(ghost, now).is_none());
        assert_eq!(t.stats.unreadable, 1);
    }

    #[test]
    fn the_container_id_is_read_once_per_cgroup() {
        let now = Instant::now();
        let mut t = ProcessTable::new(8);
        // Read from a live process of cgroup 42 earlier.
        let known = "c0ffee".repeat(10) + "c0ff";
        t.cgroup_containers.insert(42, Some(known.clone()));
        let (a, b) = (u32::MAX - 11, u32::MAX - 12); // gone: /proc cannot tell
        for (pid, cgroup) in [(a, 42), (b, 43)] {
            record_exec_of_self(&mut t, pid, 100);
            t.on_exec_event(pid, 150, cgroup);
        }
        t.sample_at(a, 300);
        let id_of = |st: &ProcessState| st.info.container.as_ref().map(|c| c.id.clone());
        assert_eq!(id_of(t.get(a, now).unwrap()), Some(known));
        t.sample_at(b, 300);
        assert_eq!(id_of(t.get(b, now).unwrap()), None);
        assert!(!t.cgroup_containers.contains_key(&43), "nothing read: nothing kept");
        // The live test process: its cgroup read and kept.
        let me = std::process::id();
        record_exec_of_self(&mut t, me, 100);
        t.on_exec_event(me, 150, 44);
        t.sample_at(me, 300);
        let cg = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(id_of(t.get(me, now).unwrap()), procfs::container_id(&cg));
        assert_eq!(t.cgroup_containers.get(&44), Some(&procfs::container_id(&cg)));
    }

    #[test]
    fn without_a_recorded_exec_or_after_lost_records_the_process_is_read_from_proc() {
        let now = Instant::now();
        let me = std::process::id();
        let mut t = ProcessTable::new(4);
        record_exec_of_self(&mut t, me, 100);
        t.on_records_lost();
        t.sample_at(me, 300);
        let st = t.get(me, now).expect("self from /proc");
        assert_ne!(st.info.start_time, 0, "read from /proc");
        assert_eq!(t.stats.from_records, 0);
    }

    #[test]
    fn capacity_is_bounded() {
        let now = Instant::now();
        let mut t = ProcessTable::new(2);
        for pid in [u32::MAX - 1, u32::MAX - 2, u32::MAX - 3, std::process::id()] {
            let _ = t.get(pid, now);
            assert!(t.len() <= 2);
        }
        assert!(t.stats.evicted >= 2);
        t.sweep(now + UNREADABLE_TTL, now + UNREADABLE_TTL);
        assert!(t.len() <= 1);
    }
}
