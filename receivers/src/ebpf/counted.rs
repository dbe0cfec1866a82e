//! Stacks counted in the kernel (`count_in_kernel`): the first sample of a
//! stack in an interval comes as a record carrying its count key, later
//! ones only add to the count in the `counts` map. At a report the reader
//! takes (and deletes) every count, reads the records that are still in
//! the ring, and pairs them here.
//!
//! The pairing tolerates the two orders a race can give: a record whose
//! count was taken after the next interval began (it waits for the next
//! report), and a count taken before its record was read (the record
//! program on another CPU was between its map insert and its ring write:
//! the count waits for the record). Whatever stays unpaired for
//! [`MAX_AGE`] reports is dropped and counted.

use super::aggregate::{Frames, Interval, SampleIn};
use super::process::{MappingSet, ProcessInfo};
use profcol_ebpf::UnwindEnd;
use rustc_hash::FxHashMap;
use std::os::fd::AsFd;
use std::sync::Arc;

/// Reports a record or a count waits for its other half.
pub const MAX_AGE: u8 = 2;
/// Elements per `BPF_MAP_LOOKUP_AND_DELETE_BATCH` call.
const TAKE_CHUNK: u32 = 4096;

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
    /// Samples of it already taken (a count that came before the record).
    waiting: u64,
    age: u8,
}

/// Records and counts of stacks counted in the kernel, paired at reports.
#[derive(Default)]
pub struct CountedStacks {
    records: FxHashMap<u64, Record>,
    /// Counts taken whose record has not been read: (samples, age).
    orphans: FxHashMap<u64, (u64, u8)>,
    keys: Vec<u64>,
    values: Vec<u64>,
}

/// What one report paired.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Settled {
    /// Samples handed to the interval.
    pub samples: u64,
    /// Samples dropped: their record never came (lost to a full ring).
    pub unnamed: u64,
}

impl CountedStacks {
    /// The record of a counted stack (`key`), read from the ring. A second
    /// record with the same key (its count was taken in between) adds
    /// nothing: the first one names them all.
    pub fn record(&mut self, key: u64, s: &SampleIn<'_>, process: Process) {
        let waiting = self.orphans.remove(&key).map_or(0, |(n, _)| n);
        if let Some(r) = self.records.get_mut(&key) {
            r.waiting += waiting;
            return;
        }
        self.records.insert(
            key,
            Record {
                pid: s.pid,
                tid: s.tid,
                cpu: s.cpu,
                comm: s.comm,
                frames: Frames::new(s.kstack, s.ustack),
                unwind_end: s.unwind_end,
                process,
                waiting,
                age: 0,
            },
        );
    }

    /// Takes every count out of the kernel's map. Read the ring after
    /// this, then [`Self::settle`]: a record written before a count was
    /// taken is then read.
    pub fn take(&mut self, map: &aya::maps::MapData) -> std::io::Result<()> {
        self.keys.clear();
        self.values.clear();
        let fd = map.fd().as_fd();
        profcol_ebpf::sys::map_take_all(fd, &mut self.keys, &mut self.values, TAKE_CHUNK)
    }

    /// Counts as [`Self::take`] would have taken them from the kernel's
    /// map: for tests and benchmarks, which have no kernel map.
    pub fn set_taken(&mut self, counts: &[(u64, u64)]) {
        self.keys.clear();
        self.values.clear();
        self.keys.extend(counts.iter().map(|p| p.0));
        self.values.extend(counts.iter().map(|p| p.1));
    }

    /// Pairs the counts taken with their records into `interval`; ages
    /// what stays unpaired and drops what waited too long. `added` hears
    /// of every count handed on, with its stack's end.
    pub fn settle(&mut self, interval: &mut Interval, mut added: impl FnMut(UnwindEnd, u64)) -> Settled {
        let mut out = Settled::default();
        let (keys, values) = (std::mem::take(&mut self.keys), std::mem::take(&mut self.values));
        let mut add = |interval: &mut Interval, r: &Record, frames: Frames, n: u64| {
            add(interval, r, frames, n);
            added(r.unwind_end, n);
            out.samples += n;
        };
        for (&key, &n) in keys.iter().zip(&values) {
            match self.records.remove(&key) {
                Some(mut r) => {
                    let frames = std::mem::take(&mut r.frames);
                    add(interval, &r, frames, n + r.waiting)
                }
                None => self.orphans.entry(key).or_insert((0, 0)).0 += n,
            }
        }
        (self.keys, self.values) = (keys, values);
        self.records.retain(|_, r| {
            if r.waiting > 0 {
                add(interval, r, r.frames.clone(), r.waiting);
                r.waiting = 0;
            }
            r.age += 1;
            r.age < MAX_AGE
        });
        self.orphans.retain(|_, (n, age)| {
            *age += 1;
            if *age > MAX_AGE {
                out.unnamed += *n;
                return false;
            }
            true
        });
        out
    }

    /// Records and counts waiting for their other half.
    pub fn waiting(&self) -> (usize, usize) {
        (self.records.len(), self.orphans.len())
    }
}

/// Hands `r`'s count to the interval with its frames (moved out of a
/// record that is done, copied from one that waits on).
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

    fn sample(ustack: &[u64]) -> SampleIn<'_> {
        SampleIn {
            probe: None,
            pid: 7,
            tid: 7,
            cpu: 0,
            comm: *b"spin\0\0\0\0\0\0\0\0\0\0\0\0",
            unix_ns: 5,
            kstack: &[],
            ustack,
            unwind_end: UnwindEnd::Unknown,
        }
    }

    fn settle(c: &mut CountedStacks, counts: &[(u64, u64)], iv: &mut Interval) -> Settled {
        c.set_taken(counts);
        c.settle(iv, |_, _| {})
    }

    #[test]
    fn counts_pair_with_records_in_either_order() {
        let mut c = CountedStacks::default();
        let mut iv = Interval::new(0, SampleAttrs { thread_id: true, thread_name: true, cpu: false });
        c.record(1, &sample(&[0x1000, 0x2000]), None);
        // Key 2's count is taken before its record is read.
        let s = settle(&mut c, &[(1, 40), (2, 3)], &mut iv);
        assert_eq!(s, Settled { samples: 40, unnamed: 0 });
        assert_eq!(c.waiting(), (0, 1));
        c.record(2, &sample(&[0x3000]), None);
        // ...and a second record of key 2 (a new count began) names nothing new.
        c.record(2, &sample(&[0x3000]), None);
        let s = settle(&mut c, &[(2, 5)], &mut iv);
        assert_eq!(s, Settled { samples: 8, unnamed: 0 });
        assert_eq!(c.waiting(), (0, 0));
        assert_eq!(iv.sample_count(), 48);
        let batch = iv.build("h", 10, 1, &[], &crate::ebpf::service_name::ServiceNamer::new(Vec::new()));
        let mut values: Vec<i64> = batch.profiles().flat_map(|p| p.samples.iter()).map(|s| s.values[0]).collect();
        values.sort();
        assert_eq!(values, vec![8, 40]);
        assert!(batch.profiles().flat_map(|p| p.samples.iter()).all(|s| s.timestamps_unix_nano.is_empty()));
    }

    #[test]
    fn unpaired_halves_wait_then_are_dropped() {
        let mut c = CountedStacks::default();
        let mut iv = Interval::new(0, SampleAttrs { thread_id: true, thread_name: true, cpu: false });
        // A record whose count the next report takes.
        c.record(1, &sample(&[0x1000]), None);
        assert_eq!(settle(&mut c, &[], &mut iv).samples, 0);
        assert_eq!(settle(&mut c, &[(1, 2)], &mut iv).samples, 2);
        // A count whose record never comes.
        let mut dropped = 0;
        let mut rounds = 0;
        let mut counts = vec![(9, 4)];
        while c.waiting() != (0, 0) || rounds == 0 {
            dropped += settle(&mut c, &counts, &mut iv).unnamed;
            counts.clear();
            rounds += 1;
            assert!(rounds <= 5, "an orphan count must not wait forever");
        }
        assert_eq!(dropped, 4);
        // A record whose count never comes is dropped too.
        c.record(3, &sample(&[0x5000]), None);
        for _ in 0..MAX_AGE {
            settle(&mut c, &[], &mut iv);
        }
        assert_eq!(c.waiting(), (0, 0));
    }
}
