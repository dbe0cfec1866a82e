//! The images of processes that exec'd since the receiver started, as the
//! kernel's exec and mapping records ([`super::mmap_events`]) tell them:
//! what the process table needs to name a process and map its addresses
//! without reading /proc, and what is left of a process that exited before
//! its samples were read.
//!
//! A process's image is complete from its exec record on: every executable
//! file mapping after it comes as a record (the executable first, then the
//! dynamic loader and each library). Records come from per-CPU rings read
//! one after the other, so an exec record may arrive after the mapping
//! records it precedes: records are kept by time, and an exec drops only
//! the mappings older than itself. A lost record (full ring) makes every
//! image incomplete: those processes are read from /proc again.
//!
//! Bounded: at most `capacity` processes, at most [`MAX_MAPS`] mappings
//! each; an exited process is kept [`EXITED_TTL`] for its last samples.

use super::mmap_events::FileMap;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// Mappings kept per process (a process that maps more keeps its first ones
/// and is marked incomplete).
pub(crate) const MAX_MAPS: usize = 256;
/// Executable file mappings of a typical process (its program, the dynamic
/// loader, a few libraries): what an image first allocates room for.
const TYPICAL_MAPS: usize = 8;
/// How long an exited process's image stays for samples read after its exit.
pub(crate) const EXITED_TTL_NS: u64 = 30_000_000_000;
/// Distinct paths kept; over it the path table starts again.
const MAX_PATHS: usize = 16_384;

/// One executable file mapping, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordedMap {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// (major, minor) of the superblock's device, as /proc/PID/maps has it.
    pub dev: (u32, u32),
    pub ino: u64,
    /// Path in the process's mount namespace.
    pub path: Arc<str>,
    /// CLOCK_MONOTONIC ns of the record.
    time_ns: u64,
}

/// What the records say of one process.
#[derive(Debug, Default)]
pub(crate) struct Image {
    /// CLOCK_MONOTONIC ns of its last exec record; 0 while none was seen.
    pub exec_ns: u64,
    /// CLOCK_MONOTONIC ns of its exit, once known.
    pub exit_ns: Option<u64>,
    maps: Vec<RecordedMap>,
    /// More than [`MAX_MAPS`] mappings: the image is not whole.
    overflow: bool,
    /// The cgroup id of the exec event (BPF, `sched_process_exec`) and its
    /// time: the event comes after the exec's records, so it is this
    /// image's when not older than `exec_ns`.
    exec_cgroup: Option<(u64, u64)>,
}

impl Image {
    /// Whether the records hold the whole image: its exec was recorded
    /// and nothing was left out since.
    pub(crate) fn is_complete(&self) -> bool {
        self.exec_ns > 0 && !self.overflow
    }

    /// Mappings since the exec, in the order they were made.
    pub(crate) fn maps(&self) -> impl Iterator<Item = &RecordedMap> {
        self.maps.iter().filter(move |m| m.time_ns >= self.exec_ns)
    }

    /// The cgroup v2 id the process exec'd in, when its exec event was read.
    pub(crate) fn cgroup_id(&self) -> Option<u64> {
        self.exec_cgroup.filter(|&(t, _)| t >= self.exec_ns).map(|(_, id)| id)
    }

    /// The executable: the first file an exec maps is the one it runs.
    pub(crate) fn executable(&self) -> Option<&RecordedMap> {
        self.maps().next()
    }
}

/// Images by pid.
pub(crate) struct ImageRecords {
    procs: FxHashMap<u32, Image>,
    paths: FxHashMap<Box<[u8]>, Arc<str>>,
    capacity: usize,
}

impl ImageRecords {
    pub(crate) fn new(capacity: usize) -> Self {
        ImageRecords { procs: FxHashMap::default(), paths: FxHashMap::default(), capacity: capacity.max(1) }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.procs.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    fn entry(&mut self, pid: u32) -> &mut Image {
        if !self.procs.contains_key(&pid) && self.procs.len() >= self.capacity {
            self.evict();
        }
        self.procs.entry(pid).or_default()
    }

    /// Makes room: the oldest eighth of the images go (exited ones first;
    /// the process table has read them already, or reads them from /proc),
    /// so a host starting processes faster than they are swept pays one
    /// pass per `capacity / 8` new ones, not one per process.
    fn evict(&mut self) {
        let mut order: Vec<((bool, u64), u32)> =
            self.procs.iter().map(|(&pid, i)| ((i.exit_ns.is_none(), i.exec_ns), pid)).collect();
        let n = (order.len() / 8).max(1);
        if n < order.len() {
            order.select_nth_unstable(n - 1);
        }
        for (_, pid) in order.into_iter().take(n) {
            self.procs.remove(&pid);
        }
    }

    /// An exec record of `pid` at `time_ns`.
    pub(crate) fn on_exec(&mut self, pid: u32, time_ns: u64) {
        let img = self.entry(pid);
        if time_ns <= img.exec_ns {
            return;
        }
        img.exec_ns = time_ns;
        img.exit_ns = None;
        img.overflow = false;
        img.maps.retain(|m| m.time_ns >= time_ns);
    }

    /// The exec event (BPF) of `pid` at `ktime_ns`, in cgroup `cgroup_id`.
    pub(crate) fn on_exec_event(&mut self, pid: u32, ktime_ns: u64, cgroup_id: u64) {
        let img = self.entry(pid);
        if img.exec_cgroup.is_none_or(|(t, _)| t < ktime_ns) {
            img.exec_cgroup = Some((ktime_ns, cgroup_id));
        }
    }

    /// A mapping record of `pid`; `path` without its NUL.
    pub(crate) fn on_map(&mut self, pid: u32, m: &FileMap, path: &[u8], time_ns: u64) {
        let path = match self.paths.get(path) {
            Some(p) => p.clone(),
            None => {
                if self.paths.len() >= MAX_PATHS {
                    self.paths.clear();
                }
                let p: Arc<str> = Arc::from(String::from_utf8_lossy(path).as_ref());
                self.paths.insert(path.into(), p.clone());
                p
            }
        };
        let img = self.entry(pid);
        if time_ns < img.exec_ns {
            return; // the image before the last exec
        }
        if img.maps.len() >= MAX_MAPS {
            img.overflow = true;
            return;
        }
        if img.maps.capacity() == 0 {
            // One allocation for a typical process's files, not a growth
            // step per library (a host can start hundreds a second).
            img.maps.reserve_exact(TYPICAL_MAPS);
        }
        img.maps.push(RecordedMap {
            start: m.start,
            end: m.end,
            offset: m.offset,
            dev: (m.major, m.minor),
            ino: m.ino,
            path,
            time_ns,
        });
    }

    /// The exit of `pid` at `time_ns` (its image stays for samples taken
    /// before it).
    pub(crate) fn on_exit(&mut self, pid: u32, time_ns: u64) {
        // An exit older than the image's exec is an earlier process's (a
        // reused pid, its events read late).
        if let Some(img) = self.procs.get_mut(&pid).filter(|i| time_ns >= i.exec_ns) {
            img.exit_ns = Some(time_ns);
        }
    }

    /// Records were lost: no image can be trusted to be whole.
    pub(crate) fn on_lost(&mut self) {
        self.procs.clear();
    }

    /// The complete image `pid` ran at `ktime_ns`, if the records hold it.
    pub(crate) fn at(&self, pid: u32, ktime_ns: u64) -> Option<&Image> {
        let img = self.procs.get(&pid)?;
        let live = img.exec_ns <= ktime_ns && img.exit_ns.is_none_or(|e| ktime_ns <= e);
        (img.is_complete() && live).then_some(img)
    }

    /// Whether the records say `pid` has exited (or no longer know it).
    pub(crate) fn exited(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_none_or(|i| i.exit_ns.is_some())
    }

    /// Whether `pid`'s exit was recorded (and its image is still kept).
    #[cfg(test)]
    pub(crate) fn exit_seen(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|i| i.exit_ns.is_some())
    }

    /// Forgets processes that exited more than [`EXITED_TTL_NS`] before `now_ns`.
    pub(crate) fn sweep(&mut self, now_ns: u64) {
        self.procs.retain(|_, i| i.exit_ns.is_none_or(|e| now_ns.saturating_sub(e) < EXITED_TTL_NS));
    }
}

#[cfg(test)]
mod tests {
    use super::super::mmap_events::{MappingBatch, MappingEventKind};
    use super::*;

    fn map(start: u64, path: &str, ino: u64) -> (FileMap, Vec<u8>) {
        let mut b = MappingBatch::default();
        b.push_map(0, 1, start..start + 0x1000, 0x2000, ((8, 1), ino), path.as_bytes());
        let MappingEventKind::Map(m) = b.events[0].kind else { unreachable!() };
        (m, path.as_bytes().to_vec())
    }

    fn record(r: &mut ImageRecords, pid: u32, start: u64, path: &str, t: u64) {
        let (m, p) = map(start, path, start);
        r.on_map(pid, &m, &p, t);
    }

    fn paths(img: &Image) -> Vec<&str> {
        img.maps().map(|m| &*m.path).collect()
    }

    #[test]
    fn an_exec_keeps_the_mappings_made_after_it_whatever_order_they_arrive_in() {
        let mut r = ImageRecords::new(8);
        // Before the exec: the old image.
        record(&mut r, 7, 0x1000, "/bin/sh", 5);
        assert!(r.at(7, 6).is_none(), "no exec recorded: not whole");
        // The new image's mapping read before its exec record (another CPU's ring).
        record(&mut r, 7, 0x5000, "/usr/bin/sha256sum", 12);
        r.on_exec(7, 10);
        record(&mut r, 7, 0x9000, "/usr/lib/ld.so", 13);
        r.on_exec_event(7, 11, 99); // the BPF exec event, after the exec's first records
        let img = r.at(7, 20).expect("complete after the exec");
        assert_eq!(paths(img), ["/usr/bin/sha256sum", "/usr/lib/ld.so"]);
        assert_eq!(img.cgroup_id(), Some(99));
        assert_eq!(img.executable().map(|m| (m.start, m.end, m.offset, m.dev)), Some((0x5000, 0x6000, 0x2000, (8, 1))));
        // A sample taken before the exec is not this image's.
        assert!(r.at(7, 9).is_none());
        // A mapping older than the exec, read late, is not added.
        record(&mut r, 7, 0x2000, "/bin/sh", 8);
        assert_eq!(r.at(7, 20).map(paths).unwrap().len(), 2);
        // Exit: samples before it still find the image, later ones do not.
        r.on_exit(7, 9); // an earlier process of the pid
        assert!(r.at(7, 40).is_some());
        r.on_exit(7, 30);
        assert!(r.at(7, 30).is_some());
        assert!(r.at(7, 31).is_none());
        assert!(r.exited(7) && r.exit_seen(7));
        assert!(r.exited(8) && !r.exit_seen(8), "unknown: gone for the sweep, no exit seen");
        r.sweep(30 + EXITED_TTL_NS - 1);
        assert_eq!(r.len(), 1);
        r.sweep(30 + EXITED_TTL_NS);
        assert!(r.is_empty());
    }

    #[test]
    fn lost_records_and_too_many_mappings_make_images_incomplete() {
        let mut r = ImageRecords::new(8);
        r.on_exec(3, 1);
        for i in 0..=MAX_MAPS as u64 {
            record(&mut r, 3, 0x1000 * (i + 1), "/lib/x.so", 2);
        }
        assert!(r.at(3, 5).is_none(), "over MAX_MAPS: not whole");
        // A new exec starts a new image; the old exec's cgroup is not its.
        r.on_exec_event(3, 2, 5);
        r.on_exec(3, 10);
        record(&mut r, 3, 0x1000, "/bin/true", 11);
        assert_eq!(r.at(3, 12).map(|i| i.cgroup_id()), Some(None));
        r.on_lost();
        assert!(r.at(3, 12).is_none());
    }

    #[test]
    fn capacity_is_bounded_and_exited_processes_go_first() {
        let mut r = ImageRecords::new(2);
        r.on_exec(1, 1);
        r.on_exec(2, 2);
        r.on_exit(2, 3);
        r.on_exec(3, 4);
        assert_eq!(r.len(), 2);
        assert!(r.at(2, 2).is_none(), "the exited one was evicted");
        assert!(r.procs.contains_key(&1) && r.procs.contains_key(&3));
        // At a larger capacity an eighth goes at once: exited, then oldest.
        let mut big = ImageRecords::new(16);
        for pid in 1..=16 {
            big.on_exec(pid, u64::from(pid));
        }
        big.on_exit(9, 100);
        big.on_exec(17, 200);
        assert_eq!(big.len(), 15);
        assert!(!big.procs.contains_key(&9) && !big.procs.contains_key(&1), "exited first, then the oldest");
        assert!(big.procs.contains_key(&2) && big.procs.contains_key(&17));
        // Paths are shared between processes.
        record(&mut r, 1, 0x1000, "/bin/a", 5);
        record(&mut r, 3, 0x1000, "/bin/a", 5);
        let a = r.at(1, 6).unwrap().executable().unwrap().path.clone();
        let b = r.at(3, 6).unwrap().executable().unwrap().path.clone();
        assert!(Arc::ptr_eq(&a, &b));
    }
}
