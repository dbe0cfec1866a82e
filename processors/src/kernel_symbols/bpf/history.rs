//! BPF functions with the time each was live: `[since, until)` spans.
//!
//! A BPF program is named for the samples taken while it was loaded, and
//! only for those: the JIT reuses addresses at once (programs are packed
//! into shared pages), so "what is at this address" has a different answer
//! every few milliseconds under churn. Instead of a symbol generation per
//! load or unload (thousands under churn), one history holds every live
//! function and every function retired within `retain`, each with its
//! lifetime; a lookup takes the sample's time. Module and kallsyms
//! generations never change for BPF events.
//!
//! The writer side ([`BpfLedger`]) applies events in time order (the
//! listener merges the per-CPU rings by timestamp), but does not depend on
//! it: an unregister that arrives before its register is kept as an orphan
//! end and closes the span when the register comes, and a late register
//! ends where the next program at the same place began. So a straggler
//! past the merge window is still placed at its own time.
//!
//! Bound: live functions + at most [`MAX_RETIRED`] retired spans (those
//! retired longer than `retain` ago are dropped first), + at most
//! [`MAX_ORPHANS`] orphan ends.

use std::collections::VecDeque;
use std::sync::Arc;

use super::progs::{BpfFunc, BpfFuncs};

/// `until_ns` of a function still loaded.
pub const LIVE: u64 = u64::MAX;
/// Retired spans kept at most, whatever the unload rate (oldest ends first).
pub const MAX_RETIRED: usize = 65_536;
/// Unregisters waiting for their register at most.
pub(crate) const MAX_ORPHANS: usize = 4_096;

/// One function and when it was live.
#[derive(Debug, Clone)]
pub struct BpfSpan {
    pub func: Arc<BpfFunc>,
    pub(crate) since_ns: u64,
    /// [`LIVE`] while loaded.
    pub(crate) until_ns: u64,
}

impl BpfSpan {
    fn end(&self) -> u64 {
        self.func.start + u64::from(self.func.len.max(1))
    }

    fn overlaps(&self, f: &BpfFunc) -> bool {
        self.func.start < f.start + u64::from(f.len.max(1)) && f.start < self.end()
    }

    fn live_at(&self, ts: u64) -> bool {
        self.since_ns <= ts && ts < self.until_ns
    }

    fn same(&self, f: &BpfFunc) -> bool {
        self.func.start == f.start && self.func.name == f.name
    }
}

/// Immutable view for lookups; shared by every reader.
#[derive(Debug, Clone, Default)]
pub struct BpfHistory {
    /// Sorted by (start, since).
    spans: Arc<[BpfSpan]>,
    /// Longest function: how far below an address a covering span can start.
    max_len: u64,
    /// Sorted distinct span boundaries; lookups between two of them agree.
    changes: Arc<[u64]>,
}

impl BpfHistory {
    /// The function covering `addr` at `ts`.
    #[inline]
    pub fn lookup(&self, addr: u64, ts: u64) -> Option<&BpfFunc> {
        let hi = self.spans.partition_point(|s| s.func.start <= addr);
        for s in self.spans[..hi].iter().rev() {
            if addr - s.func.start >= self.max_len {
                break;
            }
            if s.func.contains(addr) && s.live_at(ts) {
                return Some(&s.func);
            }
        }
        None
    }

    /// Which stretch between lifetime boundaries `ts` falls in: two times
    /// with the same epoch resolve every address alike (a cache key).
    #[inline]
    pub fn epoch(&self, ts: u64) -> u32 {
        self.changes.partition_point(|&c| c <= ts) as u32
    }

    /// Functions loaded now.
    pub fn live(&self) -> impl Iterator<Item = &BpfFunc> {
        self.spans.iter().filter(|s| s.until_ns == LIVE).map(|s| &*s.func)
    }

    /// Every span, live or retired, by address.
    pub fn spans(&self) -> &[BpfSpan] {
        &self.spans
    }

    pub fn live_len(&self) -> usize {
        self.live().count()
    }

    pub fn retired_len(&self) -> usize {
        self.spans.len() - self.live_len()
    }

    /// Heap bytes: spans, boundaries, and the functions (shared ones once per span).
    pub fn heap_bytes(&self) -> usize {
        self.spans.len() * std::mem::size_of::<BpfSpan>()
            + self.changes.len() * 8
            + self
                .spans
                .iter()
                .map(|s| {
                    std::mem::size_of::<BpfFunc>()
                        + s.func.name.len()
                        + s.func.func.as_ref().map_or(0, |f| f.len())
                        + s.func.lines.len() * std::mem::size_of::<super::progs::BpfLine>()
                })
                .sum::<usize>()
    }
}

/// What the ledger did that points at lost or late records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LedgerStats {
    /// Registers for a place still held by an older function (its unregister lost or late).
    pub(crate) stale_closed: u64,
    /// Unregisters that came before their register.
    pub orphans: u64,
    /// Unregisters never matched, dropped by the bound or by age.
    pub(crate) orphans_dropped: u64,
    /// Retired spans dropped by [`MAX_RETIRED`] before `retain` ran out.
    pub(crate) retired_dropped: u64,
}

impl Default for BpfLedger {
    fn default() -> Self {
        BpfLedger {
            spans: Vec::new(),
            max_len: 1,
            max_retired: MAX_RETIRED,
            orphans: VecDeque::new(),
            stats: LedgerStats::default(),
        }
    }
}

/// The writer's copy of the history.
#[derive(Debug)]
pub(crate) struct BpfLedger {
    /// Sorted by (start, since).
    spans: Vec<BpfSpan>,
    /// Longest function seen: bounds the search for overlapping spans.
    max_len: u64,
    /// Retired spans kept at most ([`MAX_RETIRED`]).
    pub(crate) max_retired: usize,
    /// (start, name, ts) of unregisters not matched yet.
    orphans: VecDeque<(u64, Arc<str>, u64)>,
    pub stats: LedgerStats,
}

impl BpfLedger {
    /// Functions live since before anything was watched.
    pub(crate) fn with_live(funcs: &BpfFuncs) -> Self {
        let mut l = BpfLedger::default();
        for f in funcs.iter() {
            l.max_len = l.max_len.max(u64::from(f.len.max(1)));
            l.spans.push(BpfSpan { func: Arc::new(f.clone()), since_ns: 0, until_ns: LIVE });
        }
        l.spans.sort_by_key(|s| (s.func.start, s.since_ns));
        l
    }

    /// Index range of the spans that may overlap `[start, end)`.
    fn near(&self, start: u64, end: u64) -> std::ops::Range<usize> {
        let lo = start.saturating_sub(self.max_len);
        self.spans.partition_point(|s| s.func.start <= lo)..self.spans.partition_point(|s| s.func.start < end)
    }

    /// `func` was loaded at `ts` (PERF_RECORD_KSYMBOL register).
    pub(crate) fn register(&mut self, ts: u64, func: BpfFunc) {
        self.max_len = self.max_len.max(u64::from(func.len.max(1)));
        let near = self.near(func.start, func.start + u64::from(func.len.max(1)));
        if self.spans[near.clone()].iter().any(|s| s.same(&func) && s.live_at(ts)) {
            return; // already known, e.g. from the bpf syscall
        }
        // Its unregister may already be here.
        let orphan = self
            .orphans
            .iter()
            .enumerate()
            .filter(|(_, (start, name, at))| *start == func.start && *name == func.name && *at >= ts)
            .min_by_key(|(_, o)| o.2)
            .map(|(i, _)| i);
        let mut until = match orphan.and_then(|i| self.orphans.remove(i)) {
            Some((_, _, at)) => at,
            None => LIVE,
        };
        for s in self.spans[near].iter_mut().filter(|s| s.overlaps(&func)) {
            if s.since_ns > ts {
                // A later function took this place: ours ended by then.
                until = until.min(s.since_ns);
            } else if s.until_ns > ts {
                // An older one still holds it: its unregister is lost or late.
                s.until_ns = ts;
                self.stats.stale_closed += 1;
            }
        }
        let at = self.spans.partition_point(|s| (s.func.start, s.since_ns) <= (func.start, ts));
        self.spans.insert(at, BpfSpan { func: Arc::new(func), since_ns: ts, until_ns: until });
    }

    /// The function `name` at `start` was freed at `ts` (KSYMBOL unregister).
    pub(crate) fn unregister(&mut self, ts: u64, start: u64, name: &str) {
        let near = self.near(start, start + 1);
        let span = self.spans[near]
            .iter_mut()
            .filter(|s| s.func.start == start && &*s.func.name == name && s.live_at(ts))
            .max_by_key(|s| s.since_ns);
        match span {
            Some(s) => s.until_ns = ts,
            None => {
                self.stats.orphans += 1;
                if self.orphans.len() >= MAX_ORPHANS {
                    self.orphans.pop_front();
                    self.stats.orphans_dropped += 1;
                }
                self.orphans.push_back((start, Arc::from(name), ts));
            }
        }
    }

    /// Richer entries (BTF names, lines) for functions already known by
    /// address and kernel name; never adds or revives one.
    pub(crate) fn enrich(&mut self, funcs: &[BpfFunc]) -> bool {
        let mut changed = false;
        for f in funcs {
            for s in self.spans.iter_mut().filter(|s| s.same(f) && *s.func != *f) {
                s.func = Arc::new(f.clone());
                changed = true;
            }
        }
        changed
    }

    /// A full enumeration begun at `ts`: functions not in it ended, new
    /// ones began. Records stamped after `ts` may already be applied, and
    /// they are newer than the enumeration: a function registered after
    /// `ts` is not closed for missing from it (it may have loaded after the
    /// enumeration passed its place), and one whose span reaches past `ts`
    /// is not registered again (its unregister came after the enumeration
    /// saw it). Returns whether anything changed.
    pub(crate) fn reconcile(&mut self, ts: u64, live: &BpfFuncs) -> bool {
        let mut changed = false;
        for s in self.spans.iter_mut().filter(|s| s.until_ns == LIVE && s.since_ns < ts) {
            if !live.iter().any(|f| s.same(f)) {
                s.until_ns = ts;
                changed = true;
            }
        }
        for f in live.iter() {
            if !self.spans.iter().any(|s| s.until_ns > ts && s.same(f)) {
                self.register(ts, f.clone());
                changed = true;
            }
        }
        changed | self.enrich(&live.iter().cloned().collect::<Vec<_>>())
    }

    /// Drops what no sample after `cutoff_ns` can need, and keeps the
    /// retired spans within [`MAX_RETIRED`].
    pub(crate) fn prune(&mut self, cutoff_ns: u64) {
        self.spans.retain(|s| s.until_ns > cutoff_ns);
        let before = self.orphans.len();
        self.orphans.retain(|o| o.2 > cutoff_ns);
        self.stats.orphans_dropped += (before - self.orphans.len()) as u64;
        let retired = self.spans.iter().filter(|s| s.until_ns != LIVE).count();
        if retired > self.max_retired {
            let mut ends: Vec<u64> = self.spans.iter().filter(|s| s.until_ns != LIVE).map(|s| s.until_ns).collect();
            let excess = retired - self.max_retired;
            let (_, &mut keep_after, _) = ends.select_nth_unstable(excess - 1);
            let before = self.spans.len();
            self.spans.retain(|s| s.until_ns > keep_after);
            self.stats.retired_dropped += (before - self.spans.len()) as u64;
        }
    }

    /// The immutable view readers get.
    pub(crate) fn freeze(&self) -> BpfHistory {
        let max_len = self.spans.iter().map(|s| u64::from(s.func.len.max(1))).max().unwrap_or(0);
        let mut changes: Vec<u64> =
            self.spans.iter().flat_map(|s| [s.since_ns, s.until_ns]).filter(|&t| t != 0 && t != LIVE).collect();
        changes.sort_unstable();
        changes.dedup();
        BpfHistory { spans: self.spans.clone().into(), max_len, changes: changes.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(start: u64, name: &str) -> BpfFunc {
        BpfFunc { start, len: 0x100, prog_id: 0, name: name.into(), func: None, lines: Arc::from([]) }
    }

    fn name_at(h: &BpfHistory, addr: u64, ts: u64) -> Option<String> {
        h.lookup(addr, ts).map(|f| f.name.to_string())
    }

    #[test]
    fn address_reuse_resolves_by_time() {
        let mut l = BpfLedger::default();
        l.register(10, f(0x1000, "a"));
        l.unregister(20, 0x1000, "a");
        l.register(30, f(0x1000, "b"));
        let h = l.freeze();
        assert_eq!(name_at(&h, 0x1010, 9), None);
        assert_eq!(name_at(&h, 0x1010, 10).as_deref(), Some("a"));
        assert_eq!(name_at(&h, 0x1010, 25), None);
        assert_eq!(name_at(&h, 0x1010, 30).as_deref(), Some("b"));
        assert_ne!(h.epoch(15), h.epoch(25));
        assert_eq!(h.epoch(31), h.epoch(1_000));
    }

    #[test]
    fn unregister_before_register_and_late_register_keep_their_times() {
        let mut l = BpfLedger::default();
        // Kernel order: a[10,20) then b[30,40) at one address; arrival reversed.
        l.unregister(40, 0x1000, "b");
        l.register(30, f(0x1000, "b"));
        l.unregister(20, 0x1000, "a");
        l.register(10, f(0x1000, "a"));
        let h = l.freeze();
        assert_eq!(name_at(&h, 0x1000, 15).as_deref(), Some("a"));
        assert_eq!(name_at(&h, 0x1000, 25), None);
        assert_eq!(name_at(&h, 0x1000, 35).as_deref(), Some("b"));
        assert_eq!(name_at(&h, 0x1000, 45), None);
        assert_eq!(l.stats.orphans, 2);
    }

    #[test]
    fn an_enumeration_does_not_undo_records_newer_than_it() {
        let mut l = BpfLedger::default();
        l.register(10, f(0x1000, "old"));
        // The enumeration begins at 50; meanwhile "new" loads at 60 (not in
        // the enumeration) and "old" is freed at 70 (still in it); both
        // records are applied before the enumeration is.
        l.register(60, f(0x2000, "new"));
        l.unregister(70, 0x1000, "old");
        let listed = BpfFuncs::new(vec![f(0x1000, "old")]);
        l.reconcile(50, &listed);
        let h = l.freeze();
        assert_eq!(name_at(&h, 0x2010, 65).as_deref(), Some("new"));
        assert_eq!(name_at(&h, 0x2010, 1_000).as_deref(), Some("new"));
        assert_eq!(name_at(&h, 0x1010, 65).as_deref(), Some("old"));
        assert_eq!(name_at(&h, 0x1010, 75), None, "no ghost of a freed function");
        // What the enumeration does know still counts: a function missing
        // from it that loaded before it began has ended.
        l.register(20, f(0x3000, "gone"));
        l.reconcile(80, &BpfFuncs::new(vec![f(0x2000, "new")]));
        let h = l.freeze();
        assert_eq!(name_at(&h, 0x3010, 79).as_deref(), Some("gone"));
        assert_eq!(name_at(&h, 0x3010, 80), None);
        assert_eq!(name_at(&h, 0x2010, 1_000).as_deref(), Some("new"));
    }

    #[test]
    fn prune_keeps_live_and_bounds_retired() {
        let mut l = BpfLedger { max_retired: 1_000, ..Default::default() };
        l.register(1, f(0x9000, "live"));
        for i in 0..1_010 {
            l.register(10 + 2 * i, f(0x1000, "churn"));
            l.unregister(11 + 2 * i, 0x1000, "churn");
        }
        l.prune(0);
        let h = l.freeze();
        assert_eq!(h.retired_len(), 1_000);
        assert_eq!(h.live_len(), 1);
        assert_eq!(l.stats.retired_dropped, 10);
        // The newest retired spans are the ones kept.
        let last = 10 + 2 * 1_009;
        assert_eq!(name_at(&h, 0x1000, last).as_deref(), Some("churn"));
        l.prune(last + 1);
        assert_eq!(l.freeze().retired_len(), 0);
    }
}
