//! Stacks counted in the kernel (`count_in_kernel`): the first sample of a
//! stack comes as a record carrying its count key and slot, later ones only
//! add to the count in that slot.
//!
//! The counts live in an array the reader maps into memory
//! (`count_slots`): a report reads them with plain loads, no syscall (the
//! batch lookup of a hash map that this replaces cost a lock and two
//! copies to user space per stack, the largest item of a report,
//! docs/PERFORMANCE.md). The kernel's `counts` map only finds a key's slot.
//!
//! A key stays in the map across reports, and the reader hands on what its
//! count grew by since the report before: a stack that recurs costs a record
//! once, not once per report (a minute's stacks on a busy host were ~80%
//! those of the minute before). A key leaves the map, and its record is
//! forgotten, when
//! - its count has not grown for [`IDLE_REPORTS`] reports,
//! - its process exec'd or exited (the record names the process as it was),
//! - or three quarters of the slots are taken (the longest idle go first),
//!   so that new stacks keep finding room;
//!
//! the stack's next sample is a new record. A slot outlives its key by one
//! report: a sample that found the key just before the reader deleted it
//! adds to the slot afterwards, so the slot's last count is read a report
//! later, then the slot is zeroed and given back (`free_slots`). Nothing
//! counted is lost.
//!
//! A slot counting with no record (the record program on another CPU
//! between its insert and its ring write, or the record lost with a full
//! ring) waits [`MAX_AGE`] reports for it; then its key is found by a batch
//! lookup of `counts` (only then), deleted, and its count dropped as
//! unnamed.

use super::aggregate::{Frames, Interval, SampleIn, SampleProfile};
use crate::ebpf::process::{MappingSet, ProcessInfo};
use profcol_ebpf::python::WalkEnd;
use profcol_ebpf::UnwindEnd;
use rustc_hash::{FxHashMap, FxHashSet};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Reports a slot counting without a record waits for it.
pub(crate) const MAX_AGE: u8 = 2;
/// Reports a stack's count may stay unchanged before its key leaves the map.
pub(crate) const IDLE_REPORTS: u8 = 3;
/// Elements per `BPF_MAP_LOOKUP_BATCH` call (finding unnamed slots' keys).
const READ_CHUNK: u32 = 4096;

type Process = Option<(Arc<ProcessInfo>, Arc<MappingSet>)>;

/// The kernel's side of counting, as [`CountedStacks::settle`] uses it
/// ([`KernelCounts`]; the tests' own in memory).
pub trait CountStore {
    /// The count in `slot` now (0 past the slots).
    fn count(&self, slot: u32) -> u64;
    /// Slots ever handed out: every slot in use is below it.
    fn handed_out(&self) -> u32;
    /// Deletes `key` from `counts`; a key already gone is no error.
    fn remove_key(&mut self, key: u64) -> std::io::Result<()>;
    /// Zeroes `slot` and gives it back to the program.
    fn free_slot(&mut self, slot: u32) -> std::io::Result<()>;
    /// Every key in `counts` with its slot, into `out`.
    fn keys(&mut self, out: &mut Vec<(u64, u32)>) -> std::io::Result<()>;
}

/// The BPF maps of counting: `counts` (key → slot), `count_slots` (mapped
/// into memory) and `free_slots`.
pub(crate) struct KernelCounts {
    keys: aya::maps::MapData,
    /// Keeps the array alive while mapped.
    _slots_map: aya::maps::MapData,
    /// `slots` counts, then the next slot never handed out.
    mapped: profcol_ebpf::sys::MappedU64s,
    free: aya::maps::MapData,
    slots: u32,
    batch_keys: Vec<u64>,
    batch_slots: Vec<u32>,
}

impl KernelCounts {
    pub(crate) fn new(
        keys: aya::maps::MapData,
        slots_map: aya::maps::MapData,
        free: aya::maps::MapData,
        slots: u32,
    ) -> std::io::Result<Self> {
        let mapped = profcol_ebpf::sys::MappedU64s::new(slots_map.fd().as_fd(), slots as usize + 1)?;
        Ok(KernelCounts {
            keys,
            _slots_map: slots_map,
            mapped,
            free,
            slots,
            batch_keys: Vec::new(),
            batch_slots: Vec::new(),
        })
    }
}

impl CountStore for KernelCounts {
    fn count(&self, slot: u32) -> u64 {
        self.mapped.elems().get(slot as usize).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn handed_out(&self) -> u32 {
        let next = self.mapped.elems()[self.slots as usize].load(Ordering::Relaxed);
        next.min(u64::from(self.slots)) as u32
    }

    fn remove_key(&mut self, key: u64) -> std::io::Result<()> {
        match profcol_ebpf::sys::map_delete(self.keys.fd().as_fd(), &key) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map_err(|e| std::io::Error::new(e.kind(), format!("deleting a count key: {e}"))),
        }
    }

    fn free_slot(&mut self, slot: u32) -> std::io::Result<()> {
        if let Some(c) = self.mapped.elems().get(slot as usize) {
            c.store(0, Ordering::Relaxed);
        }
        profcol_ebpf::sys::map_push(self.free.fd().as_fd(), &slot)
            .map_err(|e| std::io::Error::new(e.kind(), format!("freeing count slot {slot}: {e}")))
    }

    fn keys(&mut self, out: &mut Vec<(u64, u32)>) -> std::io::Result<()> {
        self.batch_keys.clear();
        self.batch_slots.clear();
        let fd = self.keys.fd().as_fd();
        profcol_ebpf::sys::map_read_all(fd, &mut self.batch_keys, &mut self.batch_slots, READ_CHUNK)?;
        out.extend(self.batch_keys.iter().copied().zip(self.batch_slots.iter().copied()));
        Ok(())
    }
}

/// A counted stack's first sample, as resolved when its record was read.
struct Record {
    key: u64,
    pid: u32,
    tid: u32,
    cpu: u32,
    comm: [u8; 16],
    frames: Frames,
    unwind_end: UnwindEnd,
    interp_end: WalkEnd,
    process: Process,
}

/// What the reader knows of one slot.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
enum State {
    /// Never handed out, or freed (its count zero until the program takes it).
    #[default]
    Free,
    /// Counting, its record read (in `records`).
    Named,
    /// Counting without a record for this many reports.
    Unnamed(u8),
    /// Its key deleted: its last count is read at the next report, then the
    /// slot is freed.
    Leaving,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    state: State,
    /// Its count as last read: what has been handed on.
    handed: u64,
    /// Reports since its count last grew.
    idle: u8,
}

/// Records and counts of stacks counted in the kernel, paired at reports.
pub struct CountedStacks {
    /// By slot, up to the highest slot seen.
    slots: Vec<Slot>,
    /// The record of each named (or leaving) slot.
    records: FxHashMap<u32, Record>,
    /// Records per pid: an exec or exit of a process without any is not
    /// remembered (a build host execs thousands a second).
    pids: FxHashMap<u32, u32>,
    /// Processes with records that exec'd or exited since the last report.
    gone: FxHashSet<u32>,
    /// The kernel's slots.
    capacity: usize,
    /// Slots not free.
    in_use: usize,
    /// Reused by `settle`: slots whose key is to leave, and found keys.
    leaving: Vec<u32>,
    found: Vec<(u64, u32)>,
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
    /// For `capacity` kernel slots (`max_counted_stacks`).
    pub fn new(capacity: u32) -> Self {
        CountedStacks {
            slots: Vec::new(),
            records: FxHashMap::default(),
            pids: FxHashMap::default(),
            gone: FxHashSet::default(),
            capacity: capacity as usize,
            in_use: 0,
            leaving: Vec::new(),
            found: Vec::new(),
        }
    }

    fn slot_mut(&mut self, slot: u32) -> Option<&mut Slot> {
        let i = slot as usize;
        if i >= self.capacity {
            return None;
        }
        if i >= self.slots.len() {
            self.slots.resize(i + 1, Slot::default());
        }
        self.slots.get_mut(i)
    }

    /// The record of a counted stack (`key`, counting in `slot`), read from
    /// the ring. A second record for a slot adds nothing: the first one
    /// names them all.
    pub fn record(&mut self, key: u64, slot: u32, s: &SampleIn<'_>, process: Process) {
        let named = self.records.contains_key(&slot);
        let Some(st) = self.slot_mut(slot) else {
            return;
        };
        match st.state {
            State::Named => return,
            State::Free => {
                st.state = State::Named;
                self.in_use += 1;
            }
            State::Unnamed(_) => st.state = State::Named,
            // Its key deleted as unnamed when the record came after all:
            // it names the last count.
            State::Leaving if !named => {}
            State::Leaving => return,
        }
        *self.pids.entry(s.pid).or_insert(0) += 1;
        let r = Record {
            key,
            pid: s.pid,
            tid: s.tid,
            cpu: s.cpu,
            comm: s.comm,
            frames: Frames::new(s.kstack, s.ustack),
            unwind_end: s.unwind_end,
            interp_end: s.interp_end,
            process,
        };
        self.records.insert(slot, r);
    }

    /// `pid` exec'd or exited: its stacks' keys leave the map at the next
    /// report (their records name the process it was).
    pub(crate) fn process_gone(&mut self, pid: u32) {
        if self.pids.contains_key(&pid) {
            self.gone.insert(pid);
        }
    }

    /// Hands what each slot's count grew by to `interval` with its record,
    /// frees the slots whose key left a report ago, and deletes the keys
    /// that are to leave now. Read the ring before this: records written
    /// before it are then paired. `added` hears of every count handed on,
    /// with its stack's end. A key or slot `store` fails on stays, and is
    /// tried again at the next report.
    pub fn settle(
        &mut self,
        interval: &mut Interval,
        store: &mut impl CountStore,
        mut added: impl FnMut(UnwindEnd, u64),
    ) -> Settled {
        let mut out = Settled::default();
        let stale_unnamed = self.hand_counts(interval, store, &mut added, &mut out);
        self.choose_leaving();
        self.remove_leaving_keys(store, &mut out);
        // Slots counting without a record for too long: their keys, found
        // only now, leave (a key already gone left with its lost record).
        if stale_unnamed {
            self.remove_stale_unnamed(store, &mut out);
        }
        self.gone.clear();
        out
    }

    /// Walks every slot handed out: hands what each named slot's count
    /// grew by to `interval`, ages the unnamed ones and frees the leaving
    /// ones. Returns whether an unnamed slot is too old.
    fn hand_counts(
        &mut self,
        interval: &mut Interval,
        store: &mut impl CountStore,
        added: &mut impl FnMut(UnwindEnd, u64),
        out: &mut Settled,
    ) -> bool {
        let top = (store.handed_out() as usize).min(self.capacity);
        if self.slots.len() < top {
            self.slots.resize(top, Slot::default());
        }
        let mut stale_unnamed = false;
        for i in 0..self.slots.len() {
            let slot = i as u32;
            let st = &mut self.slots[i];
            let count = store.count(slot);
            match st.state {
                State::Free => {
                    if count > 0 {
                        st.state = State::Unnamed(1);
                        self.in_use += 1;
                    }
                }
                State::Unnamed(age) => {
                    st.state = State::Unnamed(age.saturating_add(1));
                    stale_unnamed |= age >= MAX_AGE;
                }
                State::Named => {
                    // (A named slot always has its record.)
                    let Some(r) = self.records.get(&slot) else {
                        continue;
                    };
                    let n = hand(interval, r, st, count, added, out);
                    st.idle = if n > 0 { 0 } else { st.idle.saturating_add(1) };
                }
                State::Leaving => {
                    match self.records.get(&slot) {
                        Some(r) => {
                            hand(interval, r, st, count, added, out);
                        }
                        None => out.unnamed += count.saturating_sub(st.handed),
                    }
                    if let Err(e) = store.free_slot(slot) {
                        tracing::debug!(error = %e, "ebpf receiver: a count slot stays taken for now");
                        // Its count is handed; what comes after is new.
                        continue;
                    }
                    *st = Slot::default();
                    self.in_use -= 1;
                    if let Some(r) = self.records.remove(&slot) {
                        if let Some(n) = self.pids.get_mut(&r.pid) {
                            *n -= 1;
                            if *n == 0 {
                                self.pids.remove(&r.pid);
                            }
                        }
                    }
                }
            }
        }
        stale_unnamed
    }

    /// Fills `leaving` with the keys that leave: stacks idle or of
    /// processes gone, then the longest idle while the slots are filling up.
    fn choose_leaving(&mut self) {
        self.leaving.clear();
        let gone = &self.gone;
        for (&slot, r) in &self.records {
            let st = &self.slots[slot as usize];
            if st.state == State::Named && (st.idle >= IDLE_REPORTS || gone.contains(&r.pid)) {
                self.leaving.push(slot);
            }
        }
        let high = self.capacity - self.capacity / 4;
        let staying = self.in_use.saturating_sub(self.leaving.len());
        if staying > high {
            let mut by_idle: Vec<(u8, u32)> = self
                .records
                .iter()
                .filter_map(|(&slot, r)| {
                    let st = &self.slots[slot as usize];
                    (st.state == State::Named && st.idle < IDLE_REPORTS && !gone.contains(&r.pid))
                        .then_some((st.idle, slot))
                })
                .collect();
            by_idle.sort_unstable_by(|a, b| b.cmp(a));
            let over = staying - self.capacity / 2;
            self.leaving.extend(by_idle.into_iter().take(over).map(|(_, s)| s));
        }
    }

    /// Deletes the keys of `leaving` from the map; their slots are freed
    /// at the next report.
    fn remove_leaving_keys(&mut self, store: &mut impl CountStore, out: &mut Settled) {
        for &slot in &self.leaving {
            let Some(key) = self.records.get(&slot).map(|r| r.key) else {
                continue;
            };
            match store.remove_key(key) {
                Ok(()) => {
                    self.slots[slot as usize].state = State::Leaving;
                    out.released += 1;
                }
                Err(e) => tracing::debug!(error = %e, "ebpf receiver: a counted stack's key stays in the map for now"),
            }
        }
    }

    /// Deletes the keys of the slots counting without a record for too
    /// long (listed from the map), and marks those slots leaving.
    fn remove_stale_unnamed(&mut self, store: &mut impl CountStore, out: &mut Settled) {
        self.found.clear();
        match store.keys(&mut self.found) {
            Ok(()) => {
                let slots = &mut self.slots;
                let stale = |slot: u32| {
                    slots.get(slot as usize).is_some_and(|s| matches!(s.state, State::Unnamed(a) if a > MAX_AGE))
                };
                let mut failed = FxHashSet::default();
                for &(key, slot) in self.found.iter().filter(|&&(_, slot)| stale(slot)) {
                    if let Err(e) = store.remove_key(key) {
                        tracing::debug!(error = %e, "ebpf receiver: an unnamed count's key stays in the map for now");
                        failed.insert(slot);
                    } else {
                        out.released += 1;
                    }
                }
                for (i, s) in slots.iter_mut().enumerate() {
                    if matches!(s.state, State::Unnamed(a) if a > MAX_AGE) && !failed.contains(&(i as u32)) {
                        s.state = State::Leaving;
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "ebpf receiver: cannot list the count keys; unnamed counts wait"),
        }
    }

    /// Slots in use (counting, or leaving), as far as the reader knows.
    pub fn len(&self) -> usize {
        self.in_use
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Hands what `r`'s count grew by since `st.handed`; returns it.
fn hand(
    interval: &mut Interval,
    r: &Record,
    st: &mut Slot,
    count: u64,
    added: &mut impl FnMut(UnwindEnd, u64),
    out: &mut Settled,
) -> u64 {
    // A count below what was handed is never expected (only the reader
    // zeroes a slot, when it is free); it counts from zero again.
    let n = if count >= st.handed { count - st.handed } else { count };
    st.handed = count;
    if n > 0 {
        add(interval, r, r.frames.clone(), n);
        added(r.unwind_end, n);
        out.samples += n;
    }
    n
}

/// Hands `n` samples of `r`'s stack to the interval with its frames.
fn add(interval: &mut Interval, r: &Record, frames: Frames, n: u64) {
    let s = SampleIn {
        profile: SampleProfile::Cpu,
        pid: r.pid,
        tid: r.tid,
        cpu: r.cpu,
        comm: r.comm,
        unix_ns: 0,
        kstack: &[],
        ustack: &[],
        unwind_end: r.unwind_end,
        interp_end: r.interp_end,
    };
    interval.add_counted_frames(&s, frames, r.process.as_ref().map(|(i, m)| (i, m)), n);
}

#[cfg(test)]
mod tests {
    use super::super::aggregate::SampleAttrs;
    use super::*;

    fn sample(pid: u32, ustack: &[u64]) -> SampleIn<'_> {
        SampleIn {
            profile: SampleProfile::Cpu,
            pid,
            tid: pid,
            cpu: 0,
            comm: *b"spin\0\0\0\0\0\0\0\0\0\0\0\0",
            unix_ns: 5,
            kstack: &[],
            ustack,
            unwind_end: UnwindEnd::Unknown,
            interp_end: WalkEnd::None,
        }
    }

    fn interval() -> Interval {
        Interval::new(0, SampleAttrs { thread_id: true, thread_name: true, cpu: false })
    }

    /// The kernel's side in memory: `sample` does what the BPF program
    /// does for one sample.
    #[derive(Default)]
    struct Store {
        counts: Vec<u64>,
        next: u32,
        keys: std::collections::BTreeMap<u64, u32>,
        free: std::collections::VecDeque<u32>,
        fail_remove: bool,
    }

    impl Store {
        fn new(slots: usize) -> Self {
            Store { counts: vec![0; slots], ..Default::default() }
        }

        /// Counts a sample of `key`; `Some(slot)` when it is new (its
        /// record is due), `None` when it only counted or no slot was left.
        fn sample(&mut self, key: u64) -> Option<u32> {
            if let Some(&s) = self.keys.get(&key) {
                self.counts[s as usize] += 1;
                return None;
            }
            let slot = match self.free.pop_front() {
                Some(s) => s,
                None if (self.next as usize) < self.counts.len() => {
                    self.next += 1;
                    self.next - 1
                }
                None => return None,
            };
            assert_eq!(self.counts[slot as usize], 0, "a slot handed out is zero");
            self.keys.insert(key, slot);
            self.counts[slot as usize] += 1;
            Some(slot)
        }

        fn samples(&mut self, key: u64, n: u64) -> Option<u32> {
            let new = self.sample(key);
            for _ in 1..n {
                self.sample(key);
            }
            new
        }
    }

    impl CountStore for Store {
        fn count(&self, slot: u32) -> u64 {
            self.counts.get(slot as usize).copied().unwrap_or(0)
        }
        fn handed_out(&self) -> u32 {
            self.next
        }
        fn remove_key(&mut self, key: u64) -> std::io::Result<()> {
            if self.fail_remove {
                return Err(std::io::Error::other("EPERM"));
            }
            self.keys.remove(&key);
            Ok(())
        }
        fn free_slot(&mut self, slot: u32) -> std::io::Result<()> {
            assert!(!self.keys.values().any(|&s| s == slot), "slot {slot} freed while its key is in the map");
            assert!(!self.free.contains(&slot), "slot {slot} freed twice");
            self.counts[slot as usize] = 0;
            self.free.push_back(slot);
            Ok(())
        }
        fn keys(&mut self, out: &mut Vec<(u64, u32)>) -> std::io::Result<()> {
            out.extend(self.keys.iter().map(|(&k, &s)| (k, s)));
            Ok(())
        }
    }

    fn settle(c: &mut CountedStacks, store: &mut Store, iv: &mut Interval) -> Settled {
        c.settle(iv, store, |_, _| {})
    }

    fn values(iv: Interval) -> Vec<i64> {
        let batch = iv.build(
            "h",
            10,
            1,
            &[],
            &crate::ebpf::process::service_name::ServiceNamer::new(Vec::new()),
            Default::default(),
        );
        let mut v: Vec<i64> = batch.profiles().flat_map(|p| p.samples.iter()).map(|s| s.values[0]).collect();
        v.sort();
        v
    }

    #[test]
    fn counts_pair_with_records_in_either_order_and_only_growth_is_handed_on() {
        let mut c = CountedStacks::new(1024);
        let mut store = Store::new(1024);
        let mut iv = interval();
        let s1 = store.samples(1, 40).unwrap();
        c.record(1, s1, &sample(7, &[0x1000, 0x2000]), None);
        // Key 2 counts before its record is read.
        let s2 = store.samples(2, 3).unwrap();
        assert_eq!(settle(&mut c, &mut store, &mut iv), Settled { samples: 40, unnamed: 0, released: 0 });
        assert_eq!(c.len(), 2);
        c.record(2, s2, &sample(7, &[0x3000]), None);
        // A second record of the slot names nothing new.
        c.record(2, s2, &sample(7, &[0x3000]), None);
        store.samples(2, 5);
        assert_eq!(settle(&mut c, &mut store, &mut iv).samples, 8);
        assert_eq!(values(iv), vec![8, 40]);
        // Next report: key 1 grew by 5, key 2 not at all. The keys stay.
        let mut iv = interval();
        store.samples(1, 5);
        let s = settle(&mut c, &mut store, &mut iv);
        assert_eq!((s.samples, s.released), (5, 0));
        assert_eq!(values(iv), vec![5]);
        assert_eq!(store.keys.len(), 2);
    }

    #[test]
    fn idle_stacks_leave_the_map_with_their_last_samples_and_their_slot_is_reused() {
        let mut c = CountedStacks::new(1024);
        let mut store = Store::new(1024);
        let slot = store.samples(1, 2).unwrap();
        c.record(1, slot, &sample(7, &[0x1000]), None);
        let mut handed = settle(&mut c, &mut store, &mut interval()).samples;
        let mut reports = 0;
        while store.keys.contains_key(&1) {
            reports += 1;
            assert!(reports <= IDLE_REPORTS as usize, "an idle key must leave the map");
            handed += settle(&mut c, &mut store, &mut interval()).samples;
        }
        // A sample that found the key just before it was deleted adds to
        // the slot afterwards: the slot's last read, a report later, hands
        // it on; then the slot is free.
        store.counts[slot as usize] += 1;
        assert!(store.free.is_empty());
        handed += settle(&mut c, &mut store, &mut interval()).samples;
        assert_eq!(handed, 3);
        assert_eq!((c.len(), store.free.len()), (0, 1));
        // The stack's next sample is a new record, in the freed slot,
        // counting from zero.
        let again = store.sample(1).unwrap();
        assert_eq!(again, slot);
        c.record(1, again, &sample(7, &[0x1000]), None);
        assert_eq!(settle(&mut c, &mut store, &mut interval()).samples, 1);
    }

    #[test]
    fn a_gone_process_takes_its_stacks_out_of_the_map() {
        let mut c = CountedStacks::new(1024);
        let mut store = Store::new(1024);
        let a = store.samples(1, 4).unwrap();
        let b = store.samples(2, 6).unwrap();
        c.record(1, a, &sample(7, &[0x1000]), None);
        c.record(2, b, &sample(8, &[0x1000]), None);
        assert_eq!(settle(&mut c, &mut store, &mut interval()).samples, 10);
        // pid 7 exits after one more sample.
        store.sample(1);
        c.process_gone(7);
        let s = settle(&mut c, &mut store, &mut interval());
        assert_eq!((s.samples, s.released), (1, 1));
        assert_eq!(store.keys.keys().copied().collect::<Vec<_>>(), vec![2]);
        // Its slot is freed a report later.
        settle(&mut c, &mut store, &mut interval());
        assert_eq!((c.len(), store.free.len()), (1, 1));
        // Processes without records (every exec on a build host) are not
        // remembered; pid 7 has none left.
        c.process_gone(7);
        c.process_gone(12345);
        assert!(c.gone.is_empty() && c.pids.len() == 1);
    }

    #[test]
    fn counts_without_a_record_are_dropped_and_counted() {
        let mut c = CountedStacks::new(1024);
        let mut store = Store::new(1024);
        // Key 9's record is lost; key 10's record was lost and the
        // program deleted its key (what it does when the ring is full).
        store.samples(9, 4).unwrap();
        let lost = store.samples(10, 2).unwrap();
        store.keys.remove(&10);
        let mut unnamed = 0;
        let mut rounds = 0;
        while store.free.len() < 2 {
            let s = settle(&mut c, &mut store, &mut interval());
            assert_eq!(s.samples, 0);
            unnamed += s.unnamed;
            rounds += 1;
            assert!(rounds <= MAX_AGE as usize + 3, "an unnamed count must not wait forever");
        }
        assert_eq!(unnamed, 6);
        assert!(store.keys.is_empty());
        assert_eq!(c.len(), 0);
        assert!(store.free.contains(&lost));
    }

    #[test]
    fn a_record_read_after_its_count_went_unnamed_still_names_the_last_count() {
        let mut c = CountedStacks::new(1024);
        let mut store = Store::new(1024);
        let slot = store.samples(9, 4).unwrap();
        for _ in 0..=MAX_AGE {
            settle(&mut c, &mut store, &mut interval());
        }
        assert!(!store.keys.contains_key(&9), "the unnamed count's key left");
        c.record(9, slot, &sample(7, &[0x1000]), None);
        let s = settle(&mut c, &mut store, &mut interval());
        assert_eq!((s.samples, s.unnamed), (4, 0));
        assert_eq!((c.len(), store.free.len()), (0, 1));
    }

    #[test]
    fn full_slots_make_room_longest_idle_first() {
        let mut c = CountedStacks::new(64);
        let mut store = Store::new(64);
        for k in 0..40u64 {
            let slot = store.sample(k).unwrap();
            c.record(k, slot, &sample(7, &[0x1000 + k]), None);
        }
        settle(&mut c, &mut store, &mut interval());
        // Keys 0..20 keep growing, 20..40 do not; 20 new stacks come.
        for k in 0..20u64 {
            store.sample(k);
        }
        for k in 40..60u64 {
            let slot = store.sample(k).unwrap();
            c.record(k, slot, &sample(7, &[0x1000 + k]), None);
        }
        let s = settle(&mut c, &mut store, &mut interval());
        // 60 slots pass 48 (three quarters): down to 32, the idle ones first.
        assert_eq!(s.released, 28);
        assert_eq!(store.keys.len(), 32);
        assert!((20..40).all(|k| !store.keys.contains_key(&k)));
        assert!((0..20).all(|k| store.keys.contains_key(&k)));
        // A report later their slots are free for new stacks.
        settle(&mut c, &mut store, &mut interval());
        assert_eq!((c.len(), store.free.len()), (32, 28));
    }

    #[test]
    fn a_key_that_cannot_be_removed_stays_for_the_next_report() {
        let mut c = CountedStacks::new(1024);
        let mut store = Store::new(1024);
        let slot = store.samples(1, 3).unwrap();
        c.record(1, slot, &sample(7, &[0x1000]), None);
        c.process_gone(7);
        store.fail_remove = true;
        let s = settle(&mut c, &mut store, &mut interval());
        assert_eq!((s.samples, s.released), (3, 0));
        assert_eq!(c.len(), 1);
        assert!(store.keys.contains_key(&1));
    }

    #[test]
    fn a_slot_past_the_kernels_is_ignored() {
        let mut c = CountedStacks::new(4);
        c.record(1, 4, &sample(7, &[0x1000]), None);
        c.record(1, u32::MAX, &sample(7, &[0x1000]), None);
        assert!(c.is_empty());
    }
}
