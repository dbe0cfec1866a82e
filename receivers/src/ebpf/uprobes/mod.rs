//! Uprobes: counting calls of chosen user-space functions in every process
//! that runs them.
//!
//! [`Uprobes`] follows processes (the ones running at start from /proc,
//! then the kernel's exec and mapping records, [`crate::ebpf::process::mmap_events`], and
//! the exit events of the BPF process-discovery programs) and, for each
//! executable and executable mapping that a probe's `binary:` pattern
//! selects, decides once per file whether anything is to be attached.
//! From the kernel's records ([`Uprobes::on_image`],
//! [`Uprobes::on_kernel_mapping`]) a mapping's path decides whether any
//! probe selects it (no system call when none does), and a `stat` of that
//! path, checked against the device and inode the kernel reported, keys
//! and validates the verdict. Without those records (or when some were
//! lost) new processes are looked at through /proc ([`Uprobes::on_exec_at`]):
//!
//! - an executable costs one `stat` of `/proc/PID/exe` (the process's
//!   view: works across mount namespaces and for deleted files) and a
//!   lookup in the [`cache::AttachmentCache`] by (st_dev, st_ino),
//!   validated by size and mtime; the file is opened only on a miss;
//! - a library is found in the process's executable mappings
//!   ([`crate::ebpf::process::exec_maps`]); its (device, inode) as the maps show it is
//!   opened through `/proc/PID/map_files/START-END` and `fstat`ed once per
//!   [`MAPPED_RECHECK`], and costs a lookup for every other process;
//! - on a miss it is parsed with the one ELF reader ([`profcol_elf`]) for
//!   the configured symbols; found symbols are attached (one uprobe per
//!   symbol, on the inode, so it fires in every process that maps the file;
//!   the probe's index travels as the attach cookie), otherwise the file
//!   gets a negative verdict;
//! - every live process that maps an attached file holds one reference;
//!   the uprobes are detached when the last holder exits.
//!
//! The dynamic loader maps libraries after the exec event, so the maps of
//! a new process are read [`MAPS_RESCAN_DELAYS`] after its exec (at once
//! when its event is read that late); a process that holds nothing after
//! the last read is no longer followed. A probe hit
//! from a process not followed yet (a fork without exec) makes it followed.
//!
//! No I/O happens here without a process event; nothing of this exists when
//! no probe is configured. Attaching goes through [`Attacher`], so the
//! logic runs the same with the kernel (the receiver) and without (tests,
//! benchmarks).
//!
//! - [`matcher`]: which binaries a probe is for (`binary:` as a path, a base name or a glob).
//! - [`cache`]: the verdicts about binaries: attached (refcounted) or nothing to attach (expiring).

pub mod cache;
pub(crate) mod matcher;

use super::config::{NegativeCacheConfig, UprobeSpec};
use super::metrics as m;
use crate::ebpf::process::exec_maps::{ExecMapping, ExecMaps, ExecMapsReader};
use crate::ebpf::process::mmap_events::{FileMap, MappingBatch};
use crate::ebpf::process::procfs::{self, ProcPath};
use cache::{Acquire, AttachmentCache, CacheLimits, FileKey, FileStamp};
use matcher::BinaryPattern;
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge};
use profcol_elf::ElfFile;
use rustc_hash::FxHashMap;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

/// When a new process's maps are read again after its exec event.
pub const MAPS_RESCAN_DELAYS: [Duration; 2] = [Duration::from_millis(30), Duration::from_millis(500)];
/// How long a (device, inode) seen in /proc/PID/maps keeps the key and
/// stamp its last `fstat` gave: a library every process maps costs a
/// lookup, and one rewritten in place is looked at again within this.
pub(crate) const MAPPED_RECHECK: Duration = Duration::from_secs(1);
/// Mapped files remembered at most (the table is cleared when full).
pub(crate) const MAX_MAPPED: usize = 1 << 16;
/// How often followed processes are checked against /proc (lost exit events).
pub(crate) const LIVENESS_CHECK_PERIOD: Duration = Duration::from_secs(5);
/// How long an attachment whose last holder exited stays attached before it
/// is detached (a binary run again at once reuses it; see `cache`).
pub(crate) const DETACH_GRACE: Duration = Duration::from_secs(1);
/// Processes followed at most (each costs a few bytes and holds references).
pub(crate) const MAX_FOLLOWED: usize = 1 << 20;
/// Processes whose new image has not shown its executable mapping yet,
/// remembered at most (cleared when full: their executables are then
/// checked like libraries).
pub(crate) const MAX_FRESH_IMAGES: usize = 1 << 16;

/// Why an attach failed: the `reason` label of `attach_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    /// EPERM/EACCES: missing CAP_PERFMON/CAP_SYS_ADMIN or a security policy.
    Permission,
    /// The kernel has no uprobe PMU (CONFIG_UPROBE_EVENTS) or no BPF cookies.
    Unsupported,
    /// The file or offset was refused (EINVAL, ENOENT, ...).
    Invalid,
    Other,
}

impl FailureReason {
    pub const ALL: [FailureReason; 4] =
        [FailureReason::Permission, FailureReason::Unsupported, FailureReason::Invalid, FailureReason::Other];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Permission => "permission",
            FailureReason::Unsupported => "unsupported",
            FailureReason::Invalid => "invalid",
            FailureReason::Other => "other",
        }
    }

    /// Classifies an errno from opening the probe's perf event or linking it.
    pub(crate) fn from_errno(errno: Option<i32>) -> Self {
        match errno {
            Some(libc::EPERM | libc::EACCES) => FailureReason::Permission,
            Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENOSYS) => FailureReason::Unsupported,
            Some(libc::EINVAL | libc::EBADF | libc::ENOEXEC) => FailureReason::Invalid,
            _ => FailureReason::Other,
        }
    }
}

/// An attach that did not work.
#[derive(Debug)]
pub struct AttachError {
    pub reason: FailureReason,
    pub message: String,
}

/// Attaches one uprobe; the returned link detaches when dropped.
pub trait Attacher {
    type Link;
    /// Attaches probe number `cookie` at `offset` in the file open as `file`.
    fn attach(&mut self, file: &File, offset: u64, cookie: u32) -> Result<Self::Link, AttachError>;
}

/// The links of one attached file.
pub struct Attachment<L> {
    pub links: Vec<L>,
}

/// Self-telemetry (`profcol_receiver_ebpf_uprobe_*`).
#[derive(Clone)]
pub struct UprobeCounters {
    pub binaries_parsed: Counter,
    pub positive_hits: Counter,
    pub negative_hits: Counter,
    pub negative_entries: Gauge,
    pub sweeps: Counter,
    pub attachments: Gauge,
    pub holders: Gauge,
    pub probe_hits: Counter,
    pub attach_failures: [Counter; 4],
    pub processes: Gauge,
    pub mapping_records_lost: Counter,
}

impl UprobeCounters {
    pub fn new(t: &ComponentTelemetry) -> Self {
        UprobeCounters {
            binaries_parsed: t.counter_of(&m::UPROBE_BINARIES_PARSED),
            positive_hits: t.counter_of(&m::UPROBE_POSITIVE_HITS),
            negative_hits: t.counter_of(&m::UPROBE_NEGATIVE_HITS),
            negative_entries: t.gauge_of(&m::UPROBE_NEGATIVE_ENTRIES),
            sweeps: t.counter_of(&m::UPROBE_SWEEPS),
            attachments: t.gauge_of(&m::UPROBE_ATTACHMENTS),
            holders: t.gauge_of(&m::UPROBE_HOLDERS),
            probe_hits: t.counter_of(&m::UPROBE_PROBE_HITS),
            attach_failures: FailureReason::ALL.map(|r| t.counter_by(&m::UPROBE_ATTACH_FAILURES, r.as_str())),
            processes: t.gauge_of(&m::UPROBE_PROCESSES),
            mapping_records_lost: t.counter_of(&m::UPROBE_MAPPING_RECORDS_LOST),
        }
    }
}

struct Probe {
    spec: UprobeSpec,
    pattern: Option<BinaryPattern>,
    /// Files this probe was attached to, ever.
    attached: u64,
}

/// A followed process.
#[derive(Default)]
struct Followed {
    /// /proc/PID/stat start time, read at the first liveness check (not at
    /// exec: most short-lived processes are gone before one).
    start_time: Option<u64>,
    /// Files it holds a reference on (attached).
    held: Vec<FileKey>,
    /// Files already looked at (held or not), so rescans cost no lookup.
    seen: Vec<FileKey>,
}

/// What a (device, inode) of /proc/PID/maps was found to be at its last
/// check: the opened file's key and stamp, or `None` when no probe
/// selects its path.
#[derive(Clone, Copy)]
struct MappedFile {
    file: Option<(FileKey, FileStamp)>,
    checked: Instant,
}

/// A maps read to come: the process's exec time, pid, index in
/// [`MAPS_RESCAN_DELAYS`].
type Rescan = (Instant, u32, usize);

/// The uprobe side of the receiver: processes, verdicts, attachments.
pub struct Uprobes<L> {
    probes: Vec<Probe>,
    cache: AttachmentCache<Attachment<L>>,
    procs: FxHashMap<u32, Followed>,
    rescans: Vec<Rescan>,
    /// (maps major, minor, inode) -> what it is: a library every process
    /// maps is looked up here, not opened and `fstat`ed per process.
    mapped: FxHashMap<(u32, u32, u64), MappedFile>,
    maps_reader: ExecMapsReader,
    /// Reused buffers (no allocation per exec).
    scratch_maps: Vec<ExecMapping>,
    scratch_due: Vec<Rescan>,
    counters: UprobeCounters,
    next_liveness_check: Option<Instant>,
    initial_scan_done: bool,
    holders: i64,
    /// Whether any probe has a `binary:` pattern (else paths are not needed).
    any_pattern: bool,
    /// Whether some probe may select a shared library, so new processes'
    /// maps are read (a pattern that names an executable needs no maps).
    maps_needed: bool,
    /// Processes that started a new image whose first executable mapping
    /// (the executable) has not been seen yet ([`Self::on_kernel_mapping`]).
    fresh_images: rustc_hash::FxHashSet<u32>,
    self_pid: u32,
}

impl<L> Uprobes<L> {
    /// Nothing is read until the first process event or [`Self::scan_running`].
    pub fn new(specs: &[UprobeSpec], negative: NegativeCacheConfig, counters: UprobeCounters) -> Self {
        Self::with_limits(specs, CacheLimits { ttl: negative.ttl, max_entries: negative.max_entries }, counters)
    }

    /// As [`Self::new`] with explicit cache limits (a zero TTL disables the
    /// negative cache: benchmarks compare with it).
    pub fn with_limits(specs: &[UprobeSpec], limits: CacheLimits, counters: UprobeCounters) -> Self {
        let probes: Vec<Probe> = specs
            .iter()
            .map(|s| Probe {
                spec: s.clone(),
                // Validated with the config; an unparsable one matches nothing.
                pattern: s.binary.as_deref().and_then(|b| BinaryPattern::parse(b).ok()),
                attached: 0,
            })
            .collect();
        Uprobes {
            probes,
            cache: AttachmentCache::new(limits),
            procs: FxHashMap::default(),
            rescans: Vec::new(),
            mapped: FxHashMap::default(),
            maps_reader: ExecMapsReader::new(),
            scratch_maps: Vec::new(),
            scratch_due: Vec::new(),
            counters,
            next_liveness_check: None,
            initial_scan_done: false,
            holders: 0,
            any_pattern: specs.iter().any(|s| s.binary.is_some()),
            maps_needed: probes_may_select_libraries(specs),
            fresh_images: Default::default(),
            self_pid: std::process::id(),
        }
    }

    pub fn counters(&self) -> &UprobeCounters {
        &self.counters
    }

    /// Follows every process running now (receiver start), then logs once
    /// per probe whose symbol was found in no binary.
    pub(crate) fn scan_running(&mut self, now: Instant, att: &mut impl Attacher<Link = L>) {
        let pids: Vec<u32> = std::fs::read_dir("/proc")
            .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        if !self.maps_needed {
            self.learn_library_patterns(&pids);
        }
        for pid in pids {
            if pid == std::process::id() {
                continue; // the BPF program ignores our own calls
            }
            self.follow(pid, now, att);
            if self.maps_needed {
                self.scan_maps(pid, now, att);
                self.forget_if_holding_nothing(pid);
            }
        }
        self.initial_scan_done = true;
        for p in &self.probes {
            if p.attached == 0 {
                tracing::warn!(
                    symbol = %p.spec.symbol,
                    binary = p.spec.binary.as_deref().unwrap_or("(any)"),
                    "ebpf receiver: uprobe symbol found in no running executable or library; it is attached when a binary that has it starts"
                );
            }
        }
        self.publish();
    }

    /// Whether a pattern that looks like an executable's name (no `.so`,
    /// no wildcard in the base name) selects a library some running
    /// process maps (a mapping that is not its executable): then the maps
    /// of every new process are read, as for a `.so` pattern. A library
    /// named that way that no process maps at start stays unrecognised
    /// (docs/CONFIG.md says so).
    fn learn_library_patterns(&mut self, pids: &[u32]) {
        let mut reader = std::mem::take(&mut self.maps_reader);
        'pids: for &pid in pids {
            let Ok(exe) = std::fs::read_link(ProcPath::new(pid, "exe").as_path()) else {
                continue;
            };
            let exe = exe.to_string_lossy();
            let exe = exe.trim_end_matches(" (deleted)");
            let Ok(mut maps) = reader.open(pid) else {
                continue;
            };
            let starts: Vec<u64> = maps.by_ref().map(|m| m.start).collect();
            for start in starts {
                let Some(path) = maps.path_of(start) else {
                    continue;
                };
                if path != exe && self.selects(&path) {
                    tracing::info!(
                        library = %path,
                        pid,
                        "ebpf receiver: a uprobe `binary:` selects a library; new processes' maps are read"
                    );
                    self.maps_needed = true;
                    break 'pids;
                }
            }
        }
        self.maps_reader = reader;
    }

    /// A process started a new image (now): as [`Self::on_exec_at`].
    pub fn on_exec(&mut self, pid: u32, now: Instant, att: &mut impl Attacher<Link = L>) {
        self.on_exec_at(pid, now, now, att);
    }

    /// A process started a new image at `exec_at` (the event's time; it is
    /// read later, in batches): forget what it held, look at its executable
    /// now and at its maps once the loader has had [`MAPS_RESCAN_DELAYS`]
    /// since the exec (now, when the event is that old already).
    pub(crate) fn on_exec_at(&mut self, pid: u32, exec_at: Instant, now: Instant, att: &mut impl Attacher<Link = L>) {
        // Take the new references before dropping the old ones, so a file
        // the new image maps too (the same executable seen twice, a shared
        // library) is never detached and attached again.
        let old = self.procs.remove(&pid);
        if old.is_some() {
            self.rescans.retain(|r| r.1 != pid);
        }
        self.follow(pid, now, att);
        if let Some(old) = old {
            self.drop_references(old.held, now);
        }
        if self.maps_needed && self.procs.contains_key(&pid) {
            self.rescan_from(pid, exec_at, 0, now, att);
        }
        self.publish();
    }

    /// The process exited: drop its references (what it held last is
    /// detached [`DETACH_GRACE`] later unless taken again).
    pub fn on_exit(&mut self, pid: u32, now: Instant) {
        self.fresh_images.remove(&pid);
        self.release(pid, now);
        self.publish();
    }

    /// The kernel's exec record ([`crate::ebpf::process::mmap_events`]): the process
    /// starts a new image and drops what the old one held; its next
    /// executable file mapping is its executable. With the kernel's
    /// mapping records the exec event itself needs no handling here.
    pub fn on_image(&mut self, pid: u32, now: Instant) {
        if self.fresh_images.len() >= MAX_FRESH_IMAGES {
            self.fresh_images.clear(); // bounded; only the stat-per-exec rule is lost for them
        }
        self.fresh_images.insert(pid);
        if self.procs.contains_key(&pid) {
            self.release(pid, now);
            self.publish();
        }
    }

    /// An executable file mapping the kernel reported (the executable of a
    /// new image, the loader, a library, a `dlopen`): no /proc access when
    /// no probe selects its path; otherwise a `stat` of the path (cheap:
    /// no fresh /proc entries) whose device and inode must be the ones the
    /// kernel reported, falling back to `/proc/PID/map_files` when they are
    /// not (another mount namespace, a file replaced since). A library
    /// checked within [`MAPPED_RECHECK`] costs a lookup; an executable is
    /// checked at every exec (size and mtime validate its verdict). Only
    /// processes that hold an attachment are followed.
    pub fn on_kernel_mapping(
        &mut self,
        pid: u32,
        m: &FileMap,
        batch: &MappingBatch,
        now: Instant,
        att: &mut impl Attacher<Link = L>,
    ) {
        let executable = self.fresh_images.remove(&pid);
        if pid == self.self_pid {
            return; // the BPF program ignores our own calls
        }
        let raw = batch.path(m);
        let path = match std::str::from_utf8(raw) {
            Ok(p) => std::borrow::Cow::Borrowed(p),
            Err(_) => String::from_utf8_lossy(raw),
        };
        let path = path.trim_end_matches(" (deleted)");
        if !self.selects(path) {
            return; // decided from the kernel's path: no system call
        }
        let reported = FileKey { dev: m.dev(), ino: m.ino };
        if self.procs.get(&pid).is_some_and(|f| f.seen.contains(&reported)) {
            return; // mapped again (another segment, a re-mmap)
        }
        let id = (m.major, m.minor, m.ino);
        let known = if executable {
            None
        } else {
            self.mapped
                .get(&id)
                .filter(|f| now.saturating_duration_since(f.checked) < MAPPED_RECHECK)
                .and_then(|f| f.file)
        };
        let via_path = || {
            let st = stat(batch.c_path(m))?;
            let key = FileKey { dev: st.st_dev, ino: st.st_ino };
            (key == reported).then(|| (key, stamp_of(&st)))
        };
        // (key, stamp, whether the path opens it from here)
        let found = match known {
            Some((k, s)) => Some((k, s, false)),
            None => via_path().map(|(k, s)| (k, s, true)),
        };
        let (key, stamp, by_path) = match found {
            Some(found) => found,
            None => {
                // Not reachable by its path from here: through the process.
                let Ok(md) = std::fs::metadata(ProcPath::map_file(pid, m.start, m.end).as_path()) else {
                    return; // gone: nothing learnt
                };
                let (k, s) = FileStamp::of(&md);
                (k, s, false)
            }
        };
        if !executable {
            if self.mapped.len() >= MAX_MAPPED {
                self.mapped.clear();
            }
            self.mapped.insert(id, MappedFile { file: Some((key, stamp)), checked: now });
        }
        let held = self.decide(key, stamp, now, att, || {
            let file = if by_path {
                File::open(std::ffi::OsStr::from_bytes(raw))
            } else {
                File::open(ProcPath::map_file(pid, m.start, m.end).as_path())
            };
            Some((file.ok()?, path.to_owned()))
        });
        if held {
            if !self.procs.contains_key(&pid) {
                if self.procs.len() >= MAX_FOLLOWED {
                    self.cache.release(key, now);
                    return;
                }
                self.procs.insert(pid, Followed::default());
            }
            if let Some(f) = self.procs.get_mut(&pid) {
                f.seen.push(key);
            }
            self.hold(pid, key);
        }
        self.publish();
    }

    /// A probe hit of `pid`: follow it if it is not followed (a child that
    /// forked without exec maps what its parent mapped).
    pub(crate) fn on_probe_hit(&mut self, pid: u32, now: Instant, att: &mut impl Attacher<Link = L>) {
        if !self.procs.contains_key(&pid) {
            self.follow(pid, now, att);
            if self.maps_needed {
                self.scan_maps(pid, now, att);
                self.forget_if_holding_nothing(pid);
            }
            self.publish();
        }
    }

    /// Runs due maps rescans and, every [`LIVENESS_CHECK_PERIOD`], drops
    /// followed processes that are gone (their exit event was lost).
    pub fn poll(&mut self, now: Instant, att: &mut impl Attacher<Link = L>) {
        if !self.rescans.is_empty() {
            let mut due = std::mem::take(&mut self.scratch_due);
            due.clear();
            self.rescans.retain(|&r| {
                let is_due = r.0 + MAPS_RESCAN_DELAYS[r.2] <= now;
                if is_due {
                    due.push(r);
                }
                !is_due
            });
            for &(exec_at, pid, stage) in &due {
                if self.procs.contains_key(&pid) {
                    self.rescan_from(pid, exec_at, stage, now, att);
                }
            }
            self.scratch_due = due;
        }
        if self.next_liveness_check.is_none_or(|t| now >= t) {
            self.next_liveness_check = Some(now + LIVENESS_CHECK_PERIOD);
            let mut gone = Vec::new();
            for (&pid, f) in self.procs.iter_mut() {
                match (procfs::read_start_time(pid).ok(), f.start_time) {
                    (None, _) => gone.push(pid),
                    (Some(now), None) => f.start_time = Some(now),
                    (Some(now), Some(then)) if now != then => gone.push(pid),
                    _ => {}
                }
            }
            for pid in gone {
                self.release(pid, now);
            }
        }
        if self.cache.has_unused() {
            // Dropping the attachments detaches their uprobes.
            drop(self.cache.reap(now, DETACH_GRACE));
        }
        self.publish();
    }

    /// Whether `pid` is followed.
    pub fn follows(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// When [`Self::poll`] has a maps rescan to run next.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.rescans.iter().map(|r| r.0 + MAPS_RESCAN_DELAYS[r.2]).min()
    }

    /// Files attached now.
    pub(crate) fn attached_files(&self) -> usize {
        self.cache.positive_len()
    }

    /// Stops following everything and detaches every uprobe.
    pub fn clear(&mut self) {
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        let now = Instant::now();
        for pid in pids {
            self.release(pid, now);
        }
        drop(self.cache.reap(now, Duration::ZERO));
        self.publish();
    }

    fn publish(&mut self) {
        let s = self.cache.stats;
        let c = &self.counters;
        let delta = |counter: &Counter, total: u64| counter.add(total.saturating_sub(counter.get()));
        delta(&c.positive_hits, s.positive_hits);
        delta(&c.negative_hits, s.negative_hits);
        delta(&c.sweeps, s.sweeps);
        c.negative_entries.set(self.cache.negative_len() as i64);
        c.attachments.set(self.cache.positive_len() as i64);
        c.holders.set(self.holders);
        c.processes.set(self.procs.len() as i64);
    }

    fn release(&mut self, pid: u32, now: Instant) {
        let Some(f) = self.procs.remove(&pid) else {
            return;
        };
        self.rescans.retain(|r| r.1 != pid);
        self.drop_references(f.held, now);
    }

    fn drop_references(&mut self, held: Vec<FileKey>, now: Instant) {
        for key in held {
            self.holders -= 1;
            self.cache.release(key, now);
        }
    }

    /// Reads the maps of `pid` when rescan `stage` is due (now or later)
    /// and schedules the next one; after the last, a process that holds
    /// nothing is no longer followed (a probe hit follows it again).
    fn rescan_from(
        &mut self,
        pid: u32,
        exec_at: Instant,
        mut stage: usize,
        now: Instant,
        att: &mut impl Attacher<Link = L>,
    ) {
        let mut scanned = false;
        while stage < MAPS_RESCAN_DELAYS.len() && exec_at + MAPS_RESCAN_DELAYS[stage] <= now {
            // Several stages due at once (an event read late): one read.
            if !scanned {
                self.scan_maps(pid, now, att);
                scanned = true;
            }
            stage += 1;
        }
        if stage < MAPS_RESCAN_DELAYS.len() {
            self.rescans.push((exec_at, pid, stage));
        } else {
            self.forget_if_holding_nothing(pid);
        }
    }

    fn forget_if_holding_nothing(&mut self, pid: u32) {
        if self.procs.get(&pid).is_some_and(|f| f.held.is_empty()) {
            self.procs.remove(&pid);
        }
    }

    /// Looks at the executable of `pid`: one `stat` of `/proc/PID/exe`
    /// and a lookup; the file is opened (and its path read, for the
    /// patterns) only on a miss. The process is followed when it holds
    /// something or its maps are to be read (some probe may select a
    /// library).
    fn follow(&mut self, pid: u32, now: Instant, att: &mut impl Attacher<Link = L>) {
        if self.procs.len() >= MAX_FOLLOWED {
            return;
        }
        let exe = ProcPath::new(pid, "exe");
        let Ok(md) = std::fs::metadata(exe.as_path()) else {
            return; // kernel thread, or gone
        };
        let (key, stamp) = FileStamp::of(&md);
        let any_pattern = self.any_pattern;
        let held = self.decide(key, stamp, now, att, || {
            let file = File::open(exe.as_path()).ok()?;
            let path = if any_pattern {
                // gone: no verdict
                let p = std::fs::read_link(exe.as_path()).ok()?;
                p.to_string_lossy().trim_end_matches(" (deleted)").to_owned()
            } else {
                String::new()
            };
            Some((file, path))
        });
        if held || self.maps_needed {
            let mut f = Followed::default();
            f.seen.push(key);
            if held {
                f.held.push(key);
                self.holders += 1;
            }
            self.procs.insert(pid, f);
        }
    }

    /// Looks at every executable file mapping of `pid` a probe selects.
    /// A (device, inode) checked within [`MAPPED_RECHECK`] costs a lookup;
    /// otherwise its path is read (for the patterns) and the file opened
    /// through `map_files` and `fstat`ed.
    fn scan_maps(&mut self, pid: u32, now: Instant, att: &mut impl Attacher<Link = L>) {
        self.procs.entry(pid).or_default();
        let mut reader = std::mem::take(&mut self.maps_reader);
        let mut list = std::mem::take(&mut self.scratch_maps);
        list.clear();
        if let Ok(mut maps) = reader.open(pid) {
            list.extend(maps.by_ref());
            for m in &list {
                self.consider_mapping(pid, m, &mut maps, now, att);
            }
        }
        self.maps_reader = reader;
        self.scratch_maps = list;
    }

    fn consider_mapping(
        &mut self,
        pid: u32,
        m: &ExecMapping,
        maps: &mut ExecMaps<'_>,
        now: Instant,
        att: &mut impl Attacher<Link = L>,
    ) {
        let id = (m.dev.0, m.dev.1, m.inode);
        let known = self.mapped.get(&id).filter(|f| now.saturating_duration_since(f.checked) < MAPPED_RECHECK);
        let mut opened: Option<(File, String)> = None;
        let file = match known {
            Some(f) => f.file,
            None => {
                let path = if self.any_pattern {
                    match maps.path_of(m.start) {
                        Some(p) => p,
                        None => return, // unmapped meanwhile
                    }
                } else {
                    String::new()
                };
                let file = if self.selects(&path) {
                    let via_map_files = ProcPath::map_file(pid, m.start, m.end);
                    let file = File::open(via_map_files.as_path()).or_else(|_| {
                        let path =
                            if path.is_empty() { maps.path_of(m.start).unwrap_or_default() } else { path.clone() };
                        File::open(format!("/proc/{pid}/root{path}"))
                    });
                    match file.and_then(|f| f.metadata().map(|md| (f, md))) {
                        Ok((f, md)) => {
                            opened = Some((f, path));
                            Some(FileStamp::of(&md))
                        }
                        Err(_) => return, // gone: nothing learnt
                    }
                } else {
                    None
                };
                if self.mapped.len() >= MAX_MAPPED {
                    self.mapped.clear(); // bounded; what is still mapped is learnt again
                }
                self.mapped.insert(id, MappedFile { file, checked: now });
                file
            }
        };
        let Some((key, stamp)) = file else {
            return; // no probe selects it
        };
        let Some(f) = self.procs.get_mut(&pid) else {
            return;
        };
        if f.seen.contains(&key) {
            return;
        }
        f.seen.push(key);
        let any_pattern = self.any_pattern;
        let held = self.decide(key, stamp, now, att, || {
            opened.or_else(|| {
                let file = File::open(ProcPath::map_file(pid, m.start, m.end).as_path()).ok()?;
                let path = if any_pattern { maps.path_of(m.start)? } else { String::new() };
                Some((file, path))
            })
        });
        if held {
            self.hold(pid, key);
        }
    }

    fn selects(&self, path: &str) -> bool {
        self.probes.iter().any(|p| p.pattern.as_ref().is_none_or(|pat| pat.matches(path)))
    }

    /// The per-file decision: a cached verdict, or (a miss) open the file
    /// with `open` and parse it. A file no pattern selects gets a negative
    /// verdict without being parsed, so the next exec of it costs the same
    /// `stat` and lookup. Returns whether the caller now holds a reference.
    fn decide(
        &mut self,
        key: FileKey,
        stamp: FileStamp,
        now: Instant,
        att: &mut impl Attacher<Link = L>,
        open: impl FnOnce() -> Option<(File, String)>,
    ) -> bool {
        match self.cache.acquire(key, stamp, now) {
            Acquire::Positive(_) => true,
            Acquire::Negative => false,
            Acquire::Miss => {
                let Some((file, path)) = open() else {
                    return false; // gone: no verdict
                };
                // The verdict is for what was opened: the same file, as it is now.
                let Ok(md) = file.metadata() else {
                    return false;
                };
                let (opened, stamp) = FileStamp::of(&md);
                if opened != key {
                    return false; // exec'd again meanwhile; its own event follows
                }
                let links = if self.selects(&path) { self.parse_and_attach(&file, &path, att) } else { Vec::new() };
                if links.is_empty() {
                    self.cache.insert_negative(key, stamp, now);
                    false
                } else {
                    if let Some(old) = self.cache.insert_positive(key, stamp, Attachment { links }) {
                        drop(old); // rewritten in place while attached: the new links replace the old
                    }
                    true
                }
            }
        }
    }

    fn hold(&mut self, pid: u32, key: FileKey) {
        if let Some(f) = self.procs.get_mut(&pid) {
            f.held.push(key);
            self.holders += 1;
        }
    }

    /// Reads the symbols of the probes that select `path` and attaches the
    /// ones found. Failures are counted and logged (once per probe and
    /// reason at warn), and the file then counts as having nothing to attach.
    fn parse_and_attach(&mut self, file: &File, path: &str, att: &mut impl Attacher<Link = L>) -> Vec<L> {
        self.counters.binaries_parsed.inc();
        let Ok(elf) = ElfFile::open(file) else {
            return Vec::new(); // not ELF (a script's interpreter is looked at separately)
        };
        let wanted: Vec<usize> = (0..self.probes.len())
            .filter(|&i| self.probes[i].pattern.as_ref().is_none_or(|p| p.matches(path)))
            .collect();
        let names: Vec<&str> = wanted.iter().map(|&i| self.probes[i].spec.symbol.as_str()).collect();
        let (found, _) = elf.find_functions(&names);
        drop(names);
        let mut links = Vec::new();
        for (&i, sym) in wanted.iter().zip(found) {
            let Some(sym) = sym else {
                continue;
            };
            match att.attach(file, sym.file_offset, i as u32) {
                Ok(link) => {
                    links.push(link);
                    self.probes[i].attached += 1;
                    tracing::debug!(symbol = %sym.name, path, offset = sym.file_offset, "ebpf receiver: uprobe attached");
                }
                Err(e) => {
                    let n = &self.counters.attach_failures[e.reason as usize];
                    if n.get() == 0 {
                        tracing::warn!(
                            symbol = %sym.name, path, reason = e.reason.as_str(),
                            "ebpf receiver: cannot attach uprobe: {}", e.message
                        );
                    } else {
                        tracing::debug!(symbol = %sym.name, path, "ebpf receiver: cannot attach uprobe: {}", e.message);
                    }
                    n.inc();
                }
            }
        }
        if self.initial_scan_done && !links.is_empty() {
            tracing::debug!(path, links = links.len(), "ebpf receiver: binary attached");
        }
        links
    }
}

/// `stat(2)` of a path (no allocation: the path is NUL-terminated already).
fn stat(path: &std::ffi::CStr) -> Option<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: path is NUL-terminated; st is a valid out-parameter.
    let rc = unsafe { libc::stat(path.as_ptr(), st.as_mut_ptr()) };
    // SAFETY: stat filled st when it returned 0.
    (rc == 0).then(|| unsafe { st.assume_init() })
}

fn stamp_of(st: &libc::stat) -> FileStamp {
    FileStamp { size: st.st_size as u64, mtime_ns: st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128 }
}

/// Whether a probe may select a shared library: one without `binary:`, or
/// whose pattern could match a name with `.so` in it (a wildcard, or `.so`
/// written out). A pattern that names an executable (`kubectl`,
/// `/usr/bin/node`: no wildcard in the base name, no `.so`) never needs the
/// maps read.
fn probes_may_select_libraries(specs: &[UprobeSpec]) -> bool {
    specs.iter().any(|s| match s.binary.as_deref() {
        None => true,
        Some(b) => b.contains(".so") || b.rsplit('/').next().is_some_and(|base| base.contains(['*', '?', '['])),
    })
}

#[cfg(test)]
mod tests;
