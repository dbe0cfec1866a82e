//! What the receiver knows about sampled processes: identity, executable,
//! container, and executable mappings with build IDs.
//!
//! Bounded: at most `capacity` processes; the least recently sampled one is
//! evicted first, processes not sampled for [`IDLE_TTL`] are forgotten, and
//! exited processes are dropped on the next sweep. A process whose /proc
//! entry cannot be read is remembered as unreadable (one counted drop) so
//! its later samples cost nothing and log nothing.

use super::buildid::{BuildIdCache, FileIds};
use super::procfs::{self, MapsEntry};
use super::service_name::ServiceNamer;
use profcol_api::services::{FilePins, PinnedFile};
use rustc_hash::FxHashMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Processes not sampled for this long are forgotten (re-read on next sample).
pub const IDLE_TTL: Duration = Duration::from_secs(120);
/// A process's maps are re-read at most this often on address misses.
pub const REFRESH_MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Unreadable processes are retried after this long (the pid may be reused).
pub const UNREADABLE_TTL: Duration = Duration::from_secs(30);
/// At most this many maps refreshes per second across all processes.
pub const REFRESH_BUDGET_PER_SEC: u32 = 100;

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
    pub container_id: Option<String>,
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
pub struct ProcessState {
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
}

/// Known processes, bounded.
pub struct ProcessTable {
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
    pub stats: TableStats,
}

impl ProcessTable {
    pub fn new(capacity: usize) -> Self {
        ProcessTable {
            procs: FxHashMap::default(),
            namer: ServiceNamer::new(vec![super::service_name::Source::Executable]),
            capacity: capacity.max(1),
            build_ids: BuildIdCache::new(4096),
            next_generation: 1,
            budget_window: Instant::now(),
            budget_used: 0,
            execs: FxHashMap::default(),
            pins: None,
            stats: TableStats::default(),
        }
    }

    /// Pins every mapped ELF file in `pins` from now on.
    pub fn set_file_pins(&mut self, pins: Arc<FilePins>) {
        self.pins = Some(pins);
    }

    /// Names processes loaded from now on by these sources.
    pub fn set_service_namer(&mut self, namer: ServiceNamer) {
        self.namer = namer;
    }

    /// How a sample whose process /proc cannot tell about is named.
    pub fn namer(&self) -> &ServiceNamer {
        &self.namer
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// Whether `pid` is known (read, or remembered as unreadable).
    pub fn is_known(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Files whose build ID was read from disk so far.
    pub fn build_id_reads(&self) -> u64 {
        self.build_ids.reads
    }

    /// `pid` exec'd at `ktime_ns` (a `sched_process_exec` event). If it was
    /// read before that, its first sample taken after the exec reads it
    /// again; samples taken before keep the old image.
    pub fn exec(&mut self, pid: u32, ktime_ns: u64) {
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
    pub fn sample_at(&mut self, pid: u32, ktime_ns: u64) {
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
    pub fn get(&mut self, pid: u32, now: Instant) -> Option<&mut ProcessState> {
        let reload = match self.procs.get(&pid) {
            None => true,
            Some(Slot::Unreadable { since }) => now.duration_since(*since) >= UNREADABLE_TTL,
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
    pub fn resolve(&mut self, pid: u32, addrs: &[u64], now: Instant) -> Option<&mut ProcessState> {
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
        // Before the reads: an exec while reading counts as after them.
        let loaded_ktime = super::clock::now_ns(libc::CLOCK_MONOTONIC);
        let facts = procfs::read_facts(pid).ok()?;
        let mappings = self.read_mappings(pid)?;
        let exe_name = facts
            .exe_path
            .as_deref()
            .map(procfs::base_name)
            .filter(|n| !n.is_empty())
            .unwrap_or(&facts.comm)
            .to_owned();
        let service_name = self.namer.name(pid, &exe_name, facts.container_id.as_deref());
        Some(ProcessState {
            info: Arc::new(ProcessInfo {
                pid,
                start_time: facts.start_time,
                exe_name,
                exe_path: facts.exe_path,
                container_id: facts.container_id,
                service_name,
            }),
            mappings: Arc::new(mappings),
            last_refresh: now,
            last_seen: now,
            loaded_ktime,
        })
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
                        let b = self.ids_of(pid, &e);
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
    fn ids_of(&mut self, pid: u32, e: &MapsEntry) -> FileIds {
        let via_map_files = procfs::ProcPath::map_file(pid, e.start, e.end);
        // A file read before and pinned already: one stat, no open.
        if let Some(ids) = std::fs::metadata(via_map_files.as_path()).ok().and_then(|md| self.build_ids.cached(&md)) {
            let pinned = match (&self.pins, ids.key()) {
                (Some(pins), Some(key)) => pins.touch(key),
                _ => true,
            };
            if pinned {
                return ids;
            }
        }
        let Ok(file) =
            File::open(via_map_files.as_path()).or_else(|_| File::open(format!("/proc/{pid}/root{}", e.path)))
        else {
            return FileIds::default();
        };
        let ids = self.build_ids.ids(&file).unwrap_or_default();
        if let (Some(pins), Some(key)) = (&self.pins, ids.key()) {
            if !pins.touch(key) {
                let root = Some(Arc::from(format!("/proc/{pid}/root")));
                pins.pin(key.clone(), PinnedFile { file: Arc::new(file), path: Arc::from(e.path.as_str()), root });
            }
        }
        ids
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

    /// Drops exited processes, idle ones and stale unreadable markers. Call
    /// once per report interval; `seen_since` is the interval start, so only
    /// processes not sampled during it are checked against /proc.
    pub fn sweep(&mut self, now: Instant, seen_since: Instant) {
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
                    } else if procfs::read_start_time(pid).ok() != Some(st.info.start_time) {
                        gone.push((pid, true));
                    }
                }
            }
        }
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
