//! Merges the per-CPU streams of symbol records into one time order.
//!
//! The kernel writes a PERF_RECORD_KSYMBOL into the ring of the CPU where
//! the program was loaded or freed; each ring is in time order, but two
//! rings are not ordered against each other, and a reader that drains them
//! one after the other sees a program's unregister (CPU 1) before its
//! register (CPU 0) whenever the program is short-lived.
//!
//! Ordering argument. A record's timestamp is taken by the kernel just
//! before the record is written and published (`data_head`) in its ring,
//! with preemption disabled in between. The reader takes the time `now`
//! (same clock), then drains every ring. Any record stamped before
//! `now - SLACK` was published before the drain began, so it is in this
//! drain or an earlier one: every record stamped at or before the
//! watermark `now - SLACK` is already in the buffer. Emitting exactly those,
//! sorted by (timestamp, arrival), therefore emits a prefix of the global
//! time order, and a later drain can only add records stamped after it.
//! Records stamped after the watermark wait for a later drain. A straggler
//! that breaks the bound (a vCPU descheduled between stamp and publish for
//! longer than `SLACK`) is still applied at its own timestamp by
//! [`super::bpf::history::BpfLedger`], which does not need order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Time allowed between a record's timestamp and its publication.
pub const SLACK_NS: u64 = 2_000_000;

/// Records held until the watermark passes them.
#[derive(Debug)]
pub struct Reorder<T> {
    heap: BinaryHeap<Reverse<Held<T>>>,
    seq: u64,
    /// Highest timestamp emitted: what arrives below it is late.
    emitted_to: u64,
    /// Records that arrived below what was already emitted.
    pub late: u64,
}

#[derive(Debug)]
struct Held<T> {
    ts: u64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.ts, self.seq) == (o.ts, o.seq)
    }
}
impl<T> Eq for Held<T> {}
impl<T> PartialOrd for Held<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Held<T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.ts, self.seq).cmp(&(o.ts, o.seq))
    }
}

impl<T> Default for Reorder<T> {
    fn default() -> Self {
        Reorder { heap: BinaryHeap::new(), seq: 0, emitted_to: 0, late: 0 }
    }
}

impl<T> Reorder<T> {
    /// Holds one record; records of one ring must be pushed in ring order.
    pub fn push(&mut self, ts: u64, item: T) {
        if ts < self.emitted_to {
            self.late += 1;
        }
        self.seq += 1;
        self.heap.push(Reverse(Held { ts, seq: self.seq, item }));
    }

    /// Every held record stamped at or before `watermark`, oldest first.
    pub fn ready(&mut self, watermark: u64, out: &mut Vec<(u64, T)>) {
        while self.heap.peek().is_some_and(|h| h.0.ts <= watermark) {
            let Some(Reverse(h)) = self.heap.pop() else { break };
            self.emitted_to = self.emitted_to.max(h.ts);
            out.push((h.ts, h.item));
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emits_a_time_ordered_prefix() {
        let mut r = Reorder::default();
        // CPU 1's ring drained first, then CPU 0's.
        r.push(30, "unreg@cpu1");
        r.push(50, "reg2@cpu1");
        r.push(10, "reg@cpu0");
        r.push(40, "x@cpu0");
        let mut out = Vec::new();
        r.ready(40, &mut out);
        assert_eq!(out, vec![(10, "reg@cpu0"), (30, "unreg@cpu1"), (40, "x@cpu0")]);
        assert_eq!(r.len(), 1);
        r.push(45, "y@cpu0");
        out.clear();
        r.ready(u64::MAX, &mut out);
        assert_eq!(out, vec![(45, "y@cpu0"), (50, "reg2@cpu1")]);
        assert_eq!(r.late, 0);
        r.push(1, "straggler");
        assert_eq!(r.late, 1);
    }
}
