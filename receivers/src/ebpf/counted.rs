//! Stacks counted in the kernel (`count_in_kernel`): the first sample of a
//! stack comes as a record carrying its count key, later ones only add to
//! the count in the `counts` map.
//!
//! A key stays in the map across reports. At a report the reader reads
//! every count, leaving it there, and hands on what each grew by since the
//! report before: a stack that recurs costs a record once, not once per
//! report (a minute's stacks on a busy host were ~80% those of the minute
//! before, docs/PERFORMANCE.md). A key leaves the map, taken with its last
//! count (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`, so no sample counted is lost)
//! and its record forgotten, when
//! - its count has not grown for [`IDLE_REPORTS`] reports,
//! - its process exec'd or exited (the record names the process as it was),
//! - or the map is three quarters full (the longest idle go first), so
//!   that new stacks keep finding room;
//!
//! the stack's next sample is a new record.
//!
//! The pairing tolerates the two orders a race can give: a record whose
//! count was read after the next interval began (its count waits for the
//! next report), and a count read before its record was (the record
//! program on another CPU was between its map insert and its ring write:
//! the count waits for the record). A count whose record never comes
//! (lost with a full ring) is taken out of the map after [`MAX_AGE`]
//! reports and counted as unnamed.

use super::aggregate::{Frames, Interval, SampleIn};
use super::process::{MappingSet, ProcessInfo};
use profcol_ebpf::UnwindEnd;
use rustc_hash::{FxHashMap, FxHashSet};
use std::os::fd::AsFd;
use std::sync::Arc;

/// Reports a count waits for its record.
pub const MAX_AGE: u8 = 2;
/// Reports a stack's count may stay unchanged before its key leaves the map.
pub const IDLE_REPORTS: u8 = 3;
/// Elements per `BPF_MAP_LOOKUP_BATCH` call.
const READ_CHUNK: u32 = 4096;

type Process = Option<(Arc<ProcessInfo>, Arc<MappingSet>)>;

/// A counted stack's first sample, as resolved when its record was read.
struct Record {
    pid: u32,
    tid: u32,
    cpu: u32,
    comm: [u8; 16],
    frames: Frames,
    unwind_end: UnwindEnd,
    process: Process,
    /// Its count as last read: what has been handed on.
    handed: u64,
    /// Reports since its count last grew.
    idle: u8,
}

/// Records and counts of stacks counted in the kernel, paired at reports.
pub struct CountedStacks {
    records: FxHashMap<u64, Record>,
    /// Counts read whose record has not come: reports waited.
    orphans: FxHashMap<u64, u8>,
    /// Records per pid: an exec or exit of a process without any is not
    /// remembered (a build host execs thousands a second).
    pids: FxHashMap<u32, u32>,
    /// Processes with records that exec'd or exited since the last report.
    gone: FxHashSet<u32>,
    /// The kernel map's entries.
    capacity: usize,
    keys: Vec<u64>,
    values: Vec<u64>,
    /// Reused by `settle`: the keys leaving the map.
    leaving: Vec<u64>,
}

/// What one report paired.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Settled {
    /// Samples handed to the interval.
    pub samples: u64,
    /// Samples dropped: their record never came (lost to a full ring).
    pub unnamed: u64,
    /// Keys taken out of the kernel's map (idle, process gone, room).
    pub released: u64,
}

impl CountedStacks {
    /// For a kernel map of `capacity` entries (`max_counted_stacks`).
    pub fn new(capacity: u32) -> Self {
        CountedStacks {
            records: FxHashMap::default(),
            orphans: FxHashMap::default(),
            pids: FxHashMap::default(),
            gone: FxHashSet::default(),
            capacity: capacity as usize,
            keys: Vec::new(),
            values: Vec::new(),
            leaving: Vec::new(),
        }
    }

    /// The record of a counted stack (`key`), read from the ring. A second
    /// record with the same key (never expected while the key is in the
    /// map) adds nothing: the first one names them all.
    pub fn record(&mut self, key: u64, s: &SampleIn<'_>, process: Process) {
        self.orphans.remove(&key);
        let pids = &mut self.pids;
        self.records.entry(key).or_insert_with(|| {
            *pids.entry(s.pid).or_insert(0) += 1;
            Record {
                pid: s.pid,
                tid: s.tid,
                cpu: s.cpu,
                comm: s.comm,
                frames: Frames::new(s.kstack, s.ustack),
                unwind_end: s.unwind_end,
                process,
                handed: 0,
                idle: 0,
            }
        });
    }

    /// `pid` exec'd or exited: its stacks' keys leave the map at the next
    /// report (their records name the process it was).
    pub fn process_gone(&mut self, pid: u32) {
        if self.pids.contains_key(&pid) {
            self.gone.insert(pid);
        }
    }

    /// Reads every count in the kernel's map, leaving them there. Read the
    /// ring after this, then [`Self::settle`]: a record written before a
    /// count was read is then read.
    pub fn read(&mut self, map: &aya::maps::MapData) -> std::io::Result<()> {
        self.keys.clear();
        self.values.clear();
        let fd = map.fd().as_fd();
        profcol_ebpf::sys::map_read_all(fd, &mut self.keys, &mut self.values, READ_CHUNK)
    }

    /// Counts as [`Self::read`] would have read them from the kernel's
    /// map: for tests and benchmarks, which have no kernel map.
    pub fn set_read(&mut self, counts: &[(u64, u64)]) {
        self.keys.clear();
        self.values.clear();
        self.keys.extend(counts.iter().map(|p| p.0));
        self.values.extend(counts.iter().map(|p| p.1));
    }

    /// Hands what each count read grew by to `interval` with its record;
    /// then takes the keys that are to leave out of the map with `take`
    /// (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`: the final count, `None` when the
    /// key is not there), handing on their last samples. `added` hears of
    /// every count handed on, with its stack's end. A key `take` fails on
    /// stays, and is tried again at the next report.
    pub fn settle(
        &mut self,
        interval: &mut Interval,
        mut added: impl FnMut(UnwindEnd, u64),
        mut take: impl FnMut(u64) -> std::io::Result<Option<u64>>,
    ) -> Settled {
        let mut out = Settled::default();
        let mut hand = |interval: &mut Interval, r: &mut Record, count: u64, out: &mut Settled| {
            // A count below what was handed: the key left and came back
            // unseen (never expected); it counts from zero again.
            let n = if count >= r.handed { count - r.handed } else { count };
            r.handed = count;
            if n > 0 {
                add(interval, r, r.frames.clone(), n);
                added(r.unwind_end, n);
                out.samples += n;
            }
            n
        };
        // Every record and orphan ages a report; a count that grew makes
        // its record young again. (Those not read at all age too, and so
        // leave: nothing stays for ever.)
        for r in self.records.values_mut() {
            r.idle = r.idle.saturating_add(1);
        }
        for age in self.orphans.values_mut() {
            *age = age.saturating_add(1);
        }
        for (&key, &count) in self.keys.iter().zip(&self.values) {
            match self.records.get_mut(&key) {
                Some(r) => {
                    if hand(interval, r, count, &mut out) > 0 {
                        r.idle = 0;
                    }
                }
                None => {
                    self.orphans.entry(key).or_insert(1);
                }
            }
        }
        // Keys that leave: counts whose record never came, stacks idle or
        // of processes gone, and the longest idle while the map is full.
        self.leaving.clear();
        self.leaving.extend(self.orphans.iter().filter(|(_, &age)| age > MAX_AGE).map(|(&k, _)| k));
        let orphans = self.leaving.len();
        let gone = &self.gone;
        self.leaving.extend(
            self.records.iter().filter(|(_, r)| r.idle >= IDLE_REPORTS || gone.contains(&r.pid)).map(|(&k, _)| k),
        );
        let high = self.capacity - self.capacity / 4;
        let staying = (self.records.len() + self.orphans.len()).saturating_sub(self.leaving.len());
        if staying > high {
            let mut by_idle: Vec<(u8, u64)> = self
                .records
                .iter()
                .filter(|(_, r)| r.idle < IDLE_REPORTS && !gone.contains(&r.pid))
                .map(|(&k, r)| (r.idle, k))
                .collect();
            by_idle.sort_unstable_by(|a, b| b.cmp(a));
            let over = staying - self.capacity / 2;
            self.leaving.extend(by_idle.into_iter().take(over).map(|(_, k)| k));
        }
        for (i, &key) in self.leaving.iter().enumerate() {
            let last = match take(key) {
                Ok(last) => last,
                Err(e) => {
                    tracing::debug!(error = %e, "ebpf receiver: a counted stack's key stays in the map for now");
                    continue;
                }
            };
            out.released += 1;
            if i < orphans {
                self.orphans.remove(&key);
                out.unnamed += last.unwrap_or(0);
                continue;
            }
            if let Some(mut r) = self.records.remove(&key) {
                if let Some(count) = last {
                    hand(interval, &mut r, count, &mut out);
                }
                if let Some(n) = self.pids.get_mut(&r.pid) {
                    *n -= 1;
                    if *n == 0 {
                        self.pids.remove(&r.pid);
                    }
                }
            }
        }
        self.gone.clear();
        out
    }

    /// Stacks whose key is in the kernel's map, as far as the reader knows.
    pub fn len(&self) -> usize {
        self.records.len() + self.orphans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Hands `n` samples of `r`'s stack to the interval with its frames.
fn add(interval: &mut Interval, r: &Record, frames: Frames, n: u64) {
    let s = SampleIn {
        probe: None,
        pid: r.pid,
        tid: r.tid,
        cpu: r.cpu,
        comm: r.comm,
        unix_ns: 0,
        kstack: &[],
        ustack: &[],
        unwind_end: r.unwind_end,
    };
    interval.add_counted_frames(&s, frames, r.process.as_ref().map(|(i, m)| (i, m)), n);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::aggregate::SampleAttrs;

    fn sample(pid: u32, ustack: &[u64]) -> SampleIn<'_> {
        SampleIn {
            probe: None,
            pid,
            tid: pid,
            cpu: 0,
            comm: *b"spin\0\0\0\0\0\0\0\0\0\0\0\0",
            unix_ns: 5,
            kstack: &[],
            ustack,
            unwind_end: UnwindEnd::Unknown,
        }
    }

    fn interval() -> Interval {
        Interval::new(0, SampleAttrs { thread_id: true, thread_name: true, cpu: false })
    }

    /// The kernel's map as the tests see it: counts read stay; `take`
    /// removes a key and returns its count.
    struct Map(std::collections::BTreeMap<u64, u64>);

    impl Map {
        fn settle(&mut self, c: &mut CountedStacks, iv: &mut Interval) -> Settled {
            let counts: Vec<(u64, u64)> = self.0.iter().map(|(&k, &v)| (k, v)).collect();
            c.set_read(&counts);
            let map = &mut self.0;
            c.settle(iv, |_, _| {}, |k| Ok(map.remove(&k)))
        }
    }

    fn values(iv: Interval) -> Vec<i64> {
        let batch = iv.build("h", 10, 1, &[], &crate::ebpf::service_name::ServiceNamer::new(Vec::new()));
        let mut v: Vec<i64> = batch.profiles().flat_map(|p| p.samples.iter()).map(|s| s.values[0]).collect();
        v.sort();
        v
    }

    #[test]
    fn counts_pair_with_records_in_either_order_and_only_growth_is_handed_on() {
        let mut c = CountedStacks::new(1024);
        let mut map = Map([(1, 40), (2, 3)].into());
        let mut iv = interval();
        c.record(1, &sample(7, &[0x1000, 0x2000]), None);
        // Key 2's count is read before its record.
        assert_eq!(map.settle(&mut c, &mut iv), Settled { samples: 40, unnamed: 0, released: 0 });
        assert_eq!((c.records.len(), c.orphans.len()), (1, 1));
        c.record(2, &sample(7, &[0x3000]), None);
        // A second record of key 2 names nothing new.
        c.record(2, &sample(7, &[0x3000]), None);
        map.0.insert(2, 8);
        assert_eq!(map.settle(&mut c, &mut iv).samples, 8);
        assert_eq!(values(iv), vec![8, 40]);
        // Next report: key 1 grew by 5, key 2 not at all. The keys stay.
        let mut iv = interval();
        map.0.insert(1, 45);
        let s = map.settle(&mut c, &mut iv);
        assert_eq!((s.samples, s.released), (5, 0));
        assert_eq!(values(iv), vec![5]);
        assert_eq!(map.0.len(), 2);
    }

    #[test]
    fn idle_stacks_leave_the_map_with_their_last_samples() {
        let mut c = CountedStacks::new(1024);
        let mut map = Map([(1, 2)].into());
        c.record(1, &sample(7, &[0x1000]), None);
        let mut handed = map.settle(&mut c, &mut interval()).samples;
        let mut reports = 0;
        while map.0.contains_key(&1) {
            reports += 1;
            assert!(reports <= IDLE_REPORTS as usize, "an idle key must leave the map");
            if reports == IDLE_REPORTS as usize {
                // A sample between the last read and the take is not lost:
                // the take hands it on.
                map.0.insert(1, 3);
                c.set_read(&[(1, 2)]);
                let m = &mut map.0;
                let s = c.settle(&mut interval(), |_, _| {}, |k| Ok(m.remove(&k)));
                handed += s.samples;
                assert_eq!(s.released, 1);
            } else {
                handed += map.settle(&mut c, &mut interval()).samples;
            }
        }
        assert_eq!(handed, 3);
        assert_eq!(c.len(), 0);
        // Its next sample is a new record and a new count.
        c.record(1, &sample(7, &[0x1000]), None);
        map.0.insert(1, 1);
        assert_eq!(map.settle(&mut c, &mut interval()).samples, 1);
    }

    #[test]
    fn a_gone_process_takes_its_stacks_out_of_the_map() {
        let mut c = CountedStacks::new(1024);
        let mut map = Map([(1, 4), (2, 6)].into());
        c.record(1, &sample(7, &[0x1000]), None);
        c.record(2, &sample(8, &[0x1000]), None);
        assert_eq!(map.settle(&mut c, &mut interval()).samples, 10);
        // pid 7 exits after one more sample.
        map.0.insert(1, 5);
        c.process_gone(7);
        let mut iv = interval();
        let s = map.settle(&mut c, &mut iv);
        assert_eq!((s.samples, s.released), (1, 1));
        assert_eq!(map.0.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(c.len(), 1);
        // Processes without records (every exec on a build host) are not
        // remembered; pid 7 has none left.
        c.process_gone(7);
        c.process_gone(12345);
        assert!(c.gone.is_empty() && c.pids.len() == 1);
    }

    #[test]
    fn counts_without_a_record_are_dropped_and_counted() {
        let mut c = CountedStacks::new(1024);
        let mut map = Map([(9, 4)].into());
        let mut unnamed = 0;
        let mut rounds = 0;
        while map.0.contains_key(&9) {
            unnamed += map.settle(&mut c, &mut interval()).unnamed;
            rounds += 1;
            assert!(rounds <= 5, "an orphan count must not wait forever");
        }
        assert_eq!(unnamed, 4);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_full_map_makes_room_longest_idle_first() {
        let mut c = CountedStacks::new(64);
        let mut map = Map(Default::default());
        for k in 0..40u64 {
            c.record(k, &sample(7, &[0x1000 + k]), None);
            map.0.insert(k, 1);
        }
        map.settle(&mut c, &mut interval());
        // Keys 0..20 keep growing, 20..40 do not; 20 new stacks come.
        for k in 0..20u64 {
            map.0.insert(k, 2);
        }
        for k in 40..60u64 {
            c.record(k, &sample(7, &[0x1000 + k]), None);
            map.0.insert(k, 1);
        }
        let s = map.settle(&mut c, &mut interval());
        // 60 keys pass 48 (three quarters): down to 32, the idle ones first.
        assert_eq!(s.released, 28);
        assert_eq!((c.len(), map.0.len()), (32, 32));
        assert!((20..40).all(|k| !map.0.contains_key(&k)));
        assert!((0..20).all(|k| map.0.contains_key(&k)));
    }

    #[test]
    fn a_key_that_cannot_be_taken_stays_for_the_next_report() {
        let mut c = CountedStacks::new(1024);
        c.record(1, &sample(7, &[0x1000]), None);
        c.process_gone(7);
        c.set_read(&[(1, 3)]);
        let s = c.settle(&mut interval(), |_, _| {}, |_| Err(std::io::Error::other("EPERM")));
        assert_eq!((s.samples, s.released), (3, 0));
        assert_eq!(c.len(), 1);
    }
}
