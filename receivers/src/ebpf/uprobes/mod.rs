//! Uprobes: counting calls of chosen user-space functions in every process
//! that runs them.
//!
//! [`Uprobes`] follows processes (the ones running at start from /proc,
//! then exec and exit events from the BPF process-discovery programs) and,
//! for each executable and executable mapping that a probe's `binary:`
//! pattern selects, decides once per file whether anything is to be
//! attached:
//!
//! - the file is opened through `/proc/PID/exe` or
//!   `/proc/PID/map_files/START-END` (the process's view: works across
//!   mount namespaces and for deleted files), `fstat`ed, and looked up in
//!   the [`cache::AttachmentCache`] by (st_dev, st_ino), validated by size
//!   and mtime;
//! - on a miss it is parsed with the one ELF reader ([`profcol_elf`]) for
//!   the configured symbols; found symbols are attached (one uprobe per
//!   symbol, on the inode, so it fires in every process that maps the file;
//!   the probe's index travels as the attach cookie), otherwise the file
//!   gets a negative verdict;
//! - every live process that maps an attached file holds one reference;
//!   the uprobes are detached when the last holder exits.
//!
//! The dynamic loader maps libraries after the exec event, so the maps of
//! a new process are read again [`MAPS_RESCAN_DELAYS`] after it. A probe hit
//! from a process not followed yet (a fork without exec) makes it followed.
//!
//! No I/O happens here without a process event; nothing of this exists when
//! no probe is configured. Attaching goes through [`Attacher`], so the
//! logic runs the same with the kernel (the receiver) and without (tests,
//! benchmarks).

pub mod cache;
pub mod matcher;

use super::config::{NegativeCacheConfig, UprobeSpec};
use super::procfs;
use cache::{Acquire, AttachmentCache, CacheLimits, FileKey, FileStamp};
use matcher::BinaryPattern;
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge};
use profcol_elf::ElfFile;
use rustc_hash::FxHashMap;
use std::fs::File;
use std::time::{Duration, Instant};

/// When a new process's maps are read again after its exec event.
pub const MAPS_RESCAN_DELAYS: [Duration; 2] = [Duration::from_millis(30), Duration::from_millis(500)];
/// How often followed processes are checked against /proc (lost exit events).
pub const LIVENESS_CHECK_PERIOD: Duration = Duration::from_secs(5);
/// How long an attachment whose last holder exited stays attached before it
/// is detached (a binary run again at once reuses it; see `cache`).
pub const DETACH_GRACE: Duration = Duration::from_secs(1);
/// Processes followed at most (each costs a few bytes and holds references).
pub const MAX_FOLLOWED: usize = 1 << 20;

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

    /// Classifies an errno from perf_event_open / bpf_link_create.
    pub fn from_errno(errno: Option<i32>) -> Self {
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

/// Where the path of a file comes from (read only on a cache miss).
enum PathOf<'a> {
    /// From /proc/PID/maps.
    Known(&'a str),
    /// The `/proc/PID/exe` link.
    ExeLink,
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
}

impl UprobeCounters {
    pub fn new(t: &ComponentTelemetry) -> Self {
        let failure = |r: FailureReason| {
            t.counter_labeled(
                "ebpf_uprobe_attach_failures_total",
                "Uprobe attaches that failed, by reason (permission, unsupported, invalid, other)",
                ("reason", r.as_str()),
            )
        };
        UprobeCounters {
            binaries_parsed: t.counter(
                "ebpf_uprobe_binaries_parsed_total",
                "Executables and libraries opened and parsed for the configured symbols (cache misses)",
            ),
            positive_hits: t.counter(
                "ebpf_uprobe_positive_hits_total",
                "Lookups that found the binary attached already (its refcount was raised)",
            ),
            negative_hits: t.counter(
                "ebpf_uprobe_negative_hits_total",
                "Lookups that found a valid 'nothing to attach' verdict (no parse)",
            ),
            negative_entries: t.gauge("ebpf_uprobe_negative_entries", "Verdicts in the negative cache"),
            sweeps: t.counter("ebpf_uprobe_sweeps_total", "Sweeps of expired negative verdicts (at most one per ttl)"),
            attachments: t.gauge("ebpf_uprobe_attachments", "Binaries with live uprobes (one entry per file)"),
            holders: t.gauge(
                "ebpf_uprobe_holders",
                "References held on attached binaries by live processes (sum of refcounts)",
            ),
            probe_hits: t.counter("ebpf_uprobe_probe_hits_total", "Calls of probed functions seen by the BPF program"),
            attach_failures: FailureReason::ALL.map(failure),
            processes: t.gauge("ebpf_uprobe_processes", "Processes followed for uprobes"),
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
struct Followed {
    /// /proc/PID/stat start time, read at the first liveness check (not at
    /// exec: most short-lived processes are gone before one).
    start_time: Option<u64>,
    /// Files it holds a reference on (attached).
    held: Vec<FileKey>,
    /// Files already looked at (held or not), so rescans cost no lookup.
    seen: Vec<FileKey>,
}

/// The uprobe side of the receiver: processes, verdicts, attachments.
pub struct Uprobes<L> {
    probes: Vec<Probe>,
    cache: AttachmentCache<Attachment<L>>,
    procs: FxHashMap<u32, Followed>,
    /// (due, pid, index in MAPS_RESCAN_DELAYS)
    rescans: Vec<(Instant, u32, usize)>,
    counters: UprobeCounters,
    next_liveness_check: Option<Instant>,
    initial_scan_done: bool,
    holders: i64,
    /// Whether any probe has a `binary:` pattern (else paths are not needed).
    any_pattern: bool,
    /// Whether some probe may select a shared library, so new processes'
    /// maps are read (a pattern that names an executable needs no maps).
    maps_needed: bool,
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
            counters,
            next_liveness_check: None,
            initial_scan_done: false,
            holders: 0,
            any_pattern: specs.iter().any(|s| s.binary.is_some()),
            maps_needed: probes_may_select_libraries(specs),
        }
    }

    pub fn counters(&self) -> &UprobeCounters {
        &self.counters
    }

    /// Follows every process running now (receiver start), then logs once
    /// per probe whose symbol was found in no binary.
    pub fn scan_running(&mut self, now: Instant, att: &mut impl Attacher<Link = L>) {
        let pids: Vec<u32> = std::fs::read_dir("/proc")
            .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        for pid in pids {
            if pid == std::process::id() {
                continue; // the BPF program ignores our own calls
            }
            self.follow(pid, now, att);
            if self.maps_needed {
                self.scan_maps(pid, now, att);
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

    /// A process started a new image: forget what it held, look at its
    /// executable now and at its maps shortly (libraries come later).
    pub fn on_exec(&mut self, pid: u32, now: Instant, att: &mut impl Attacher<Link = L>) {
        // Take the new references before dropping the old ones, so a file
        // the new image maps too (the same executable seen twice, a shared
        // library) is never detached and attached again.
        let old = self.procs.remove(&pid);
        self.rescans.retain(|r| r.1 != pid);
        self.follow(pid, now, att);
        if let Some(old) = old {
            self.drop_references(old.held, now);
        }
        if self.maps_needed && self.procs.contains_key(&pid) {
            self.rescans.push((now + MAPS_RESCAN_DELAYS[0], pid, 0));
        }
        self.publish();
    }

    /// The process exited: drop its references (what it held last is
    /// detached [`DETACH_GRACE`] later unless taken again).
    pub fn on_exit(&mut self, pid: u32, now: Instant) {
        self.release(pid, now);
        self.publish();
    }

    /// A probe hit of `pid`: follow it if it is not followed (a child that
    /// forked without exec maps what its parent mapped).
    pub fn on_probe_hit(&mut self, pid: u32, now: Instant, att: &mut impl Attacher<Link = L>) {
        if !self.procs.contains_key(&pid) {
            self.follow(pid, now, att);
            if self.maps_needed {
                self.scan_maps(pid, now, att);
            }
            self.publish();
        }
    }

    /// Runs due maps rescans and, every [`LIVENESS_CHECK_PERIOD`], drops
    /// followed processes that are gone (their exit event was lost).
    pub fn poll(&mut self, now: Instant, att: &mut impl Attacher<Link = L>) {
        if !self.rescans.is_empty() {
            let due: Vec<(Instant, u32, usize)> = {
                let (due, later): (Vec<_>, Vec<_>) = self.rescans.drain(..).partition(|r| r.0 <= now);
                self.rescans = later;
                due
            };
            for (_, pid, i) in due {
                if self.procs.contains_key(&pid) {
                    self.scan_maps(pid, now, att);
                    if let Some(next) = MAPS_RESCAN_DELAYS.get(i + 1) {
                        self.rescans.push((now + next.saturating_sub(MAPS_RESCAN_DELAYS[i]), pid, i + 1));
                    }
                }
            }
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
        // Dropping the attachments detaches their uprobes.
        drop(self.cache.reap(now, DETACH_GRACE));
        self.publish();
    }

    /// Whether `pid` is followed.
    pub fn follows(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// When [`Self::poll`] has a maps rescan to run next.
    pub fn next_due(&self) -> Option<Instant> {
        self.rescans.iter().map(|r| r.0).min()
    }

    /// Reference count of an attached file (0 when not attached).
    pub fn refcount(&self, key: FileKey) -> u32 {
        self.cache.refcount(key)
    }

    /// Files attached now.
    pub fn attached_files(&self) -> usize {
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

    /// Looks at the executable of `pid`: open `/proc/PID/exe`, `fstat`,
    /// lookup; its path is read only on a miss (for the patterns). The
    /// process is followed when it holds something or its maps are to be
    /// read (some probe may select a library).
    fn follow(&mut self, pid: u32, now: Instant, att: &mut impl Attacher<Link = L>) {
        if self.procs.len() >= MAX_FOLLOWED {
            return;
        }
        let Ok(file) = File::open(procfs::proc_dir(pid).join("exe")) else {
            return; // kernel thread, or gone
        };
        self.procs.insert(pid, Followed { start_time: None, held: Vec::new(), seen: Vec::new() });
        self.consider(pid, &file, PathOf::ExeLink, now, att);
        if !self.maps_needed && self.procs.get(&pid).is_some_and(|f| f.held.is_empty()) {
            self.procs.remove(&pid);
        }
    }

    /// Looks at every executable file mapping of `pid` a probe selects.
    fn scan_maps(&mut self, pid: u32, now: Instant, att: &mut impl Attacher<Link = L>) {
        self.procs.entry(pid).or_insert_with(|| Followed { start_time: None, held: Vec::new(), seen: Vec::new() });
        let Ok(maps) = procfs::read_maps(pid) else {
            return;
        };
        for m in maps {
            if !m.is_file() || !self.selects(&m.path) {
                continue;
            }
            let via_map_files = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
            let file = File::open(via_map_files).or_else(|_| File::open(format!("/proc/{pid}/root{}", m.path)));
            if let Ok(file) = file {
                self.consider(pid, &file, PathOf::Known(&m.path), now, att);
            }
        }
    }

    fn selects(&self, path: &str) -> bool {
        self.probes.iter().any(|p| p.pattern.as_ref().is_none_or(|pat| pat.matches(path)))
    }

    /// The per-file decision: cached verdict, or parse and attach. A file no
    /// pattern selects gets a negative verdict without being parsed, so the
    /// next exec of it costs the same `fstat` and lookup.
    fn consider(&mut self, pid: u32, file: &File, path: PathOf<'_>, now: Instant, att: &mut impl Attacher<Link = L>) {
        let Ok(md) = file.metadata() else {
            return;
        };
        let (key, stamp) = FileStamp::of(&md);
        let Some(f) = self.procs.get_mut(&pid) else {
            return;
        };
        if f.seen.contains(&key) {
            return;
        }
        f.seen.push(key);
        match self.cache.acquire(key, stamp, now) {
            Acquire::Positive(_) => self.hold(pid, key),
            Acquire::Negative => {}
            Acquire::Miss => {
                let path = match path {
                    PathOf::Known(p) => p.to_owned(),
                    PathOf::ExeLink if self.any_pattern => {
                        match std::fs::read_link(procfs::proc_dir(pid).join("exe")) {
                            Ok(p) => p.to_string_lossy().trim_end_matches(" (deleted)").to_owned(),
                            Err(_) => return, // gone
                        }
                    }
                    PathOf::ExeLink => String::new(),
                };
                let links = if self.selects(&path) { self.parse_and_attach(file, &path, att) } else { Vec::new() };
                if links.is_empty() {
                    self.cache.insert_negative(key, stamp, now);
                } else {
                    if let Some(old) = self.cache.insert_positive(key, stamp, Attachment { links }) {
                        drop(old); // rewritten in place while attached: the new links replace the old
                    }
                    self.hold(pid, key);
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
