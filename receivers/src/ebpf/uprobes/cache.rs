//! The verdicts about binaries: attached (positive, refcounted) or nothing
//! to attach (negative, expiring), keyed by the opened file's (st_dev, st_ino).
//!
//! A pure data structure: no I/O, no clock of its own (every call takes
//! `now`), generic over what an attachment holds (uprobe links in the
//! receiver, plain values in tests).
//!
//! - **Positive**: one attachment per binary, refcounted by the live
//!   processes that map it; when the last one goes the entry lingers
//!   unused, and [`AttachmentCache::reap`] hands it back once it has been
//!   unused for a grace period (dropping it detaches). A holder that comes
//!   back within the grace period (the same binary run again at once)
//!   reuses it: a uprobe is never detached and attached again on the same
//!   file in quick succession, which was seen to leave the new one silent
//!   in a process that already mapped the file (docs/ARCHITECTURE.md says
//!   what is known of the cause).
//! - **Negative**: a binary with no configured symbol, remembered with its
//!   size and mtime; a lookup hits only while both still match and the
//!   entry is younger than the TTL (a replacement that keeps both is caught
//!   once the TTL has passed). Expired entries are swept when a negative
//!   entry is added, at most once per TTL, so a burst of new binaries does
//!   not turn every insert into a full scan; the sweep only looks at
//!   negative entries, so live positives are never touched. Bounded at
//!   `max_entries`, oldest inserted evicted first. The same key always
//!   overwrites its one entry (a path rewritten in place stays one entry).

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Identity of an opened file: (st_dev, st_ino).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
}

/// What must still match for a verdict to hold: size and mtime (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub size: u64,
    pub mtime_ns: i128,
}

impl FileStamp {
    /// Key and stamp of an `fstat` result.
    pub fn of(md: &std::fs::Metadata) -> (FileKey, FileStamp) {
        use std::os::unix::fs::MetadataExt;
        (
            FileKey { dev: md.dev(), ino: md.ino() },
            FileStamp { size: md.size(), mtime_ns: md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128 },
        )
    }
}

/// `negative_cache` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    pub ttl: Duration,
    pub max_entries: usize,
}

/// Result of [`AttachmentCache::acquire`].
#[derive(Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Attached already: the refcount was raised; now this many holders.
    Positive(u32),
    /// Known to have nothing to attach: skip it.
    Negative,
    /// Unknown, changed, or expired: parse the file, then insert a verdict.
    Miss,
}

/// Counts for self-telemetry (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub positive_hits: u64,
    pub negative_hits: u64,
    pub sweeps: u64,
    /// Negative entries removed by sweeps or lazily on lookup (expired or changed).
    pub expired: u64,
    /// Negative entries evicted to stay within `max_entries`.
    pub evicted: u64,
}

struct Positive<A> {
    stamp: FileStamp,
    refs: u32,
    attachment: A,
    /// When the last holder went (refs == 0): reaped after the grace period.
    unused_since: Option<Instant>,
}

struct Negative {
    stamp: FileStamp,
    inserted: Instant,
    /// Position in `order` (insertion sequence number).
    seq: u64,
}

/// Positive and negative verdicts by [`FileKey`].
pub struct AttachmentCache<A> {
    limits: CacheLimits,
    positive: FxHashMap<FileKey, Positive<A>>,
    negative: FxHashMap<FileKey, Negative>,
    /// Negative keys by insertion sequence: the first is the oldest.
    order: BTreeMap<u64, FileKey>,
    next_seq: u64,
    last_sweep: Option<Instant>,
    /// Positive entries without holders (waiting for [`Self::reap`]).
    unused: usize,
    pub stats: CacheStats,
}

impl<A> AttachmentCache<A> {
    pub fn new(limits: CacheLimits) -> Self {
        AttachmentCache {
            limits: CacheLimits { ttl: limits.ttl, max_entries: limits.max_entries.max(1) },
            positive: FxHashMap::default(),
            negative: FxHashMap::default(),
            order: BTreeMap::new(),
            next_seq: 0,
            last_sweep: None,
            unused: 0,
            stats: CacheStats::default(),
        }
    }

    /// Looks `key` up for a new holder. A positive entry whose stamp no
    /// longer matches (rewritten in place while attached) is a miss: the
    /// caller re-parses and [`Self::insert_positive`] replaces it.
    pub fn acquire(&mut self, key: FileKey, stamp: FileStamp, now: Instant) -> Acquire {
        if let Some(p) = self.positive.get_mut(&key) {
            if p.stamp == stamp {
                p.refs += 1;
                if p.unused_since.take().is_some() {
                    self.unused -= 1;
                }
                self.stats.positive_hits += 1;
                return Acquire::Positive(p.refs);
            }
            return Acquire::Miss;
        }
        if let Some(n) = self.negative.get(&key) {
            if n.stamp == stamp && now.saturating_duration_since(n.inserted) < self.limits.ttl {
                self.stats.negative_hits += 1;
                return Acquire::Negative;
            }
            let seq = n.seq;
            self.negative.remove(&key);
            self.order.remove(&seq);
            self.stats.expired += 1;
        }
        Acquire::Miss
    }

    /// Records that `key` has nothing to attach. Sweeps expired entries
    /// first when the last sweep is a TTL old, then evicts the oldest while
    /// at `max_entries`.
    pub fn insert_negative(&mut self, key: FileKey, stamp: FileStamp, now: Instant) {
        if self.last_sweep.is_none_or(|t| now.saturating_duration_since(t) >= self.limits.ttl) {
            self.sweep(now);
        }
        if let Some(old) = self.negative.remove(&key) {
            self.order.remove(&old.seq);
        }
        while self.negative.len() >= self.limits.max_entries {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.negative.remove(&oldest);
            self.stats.evicted += 1;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key);
        self.negative.insert(key, Negative { stamp, inserted: now, seq });
    }

    fn sweep(&mut self, now: Instant) {
        self.last_sweep = Some(now);
        self.stats.sweeps += 1;
        let ttl = self.limits.ttl;
        let before = self.negative.len();
        let order = &mut self.order;
        self.negative.retain(|_, n| {
            let keep = now.saturating_duration_since(n.inserted) < ttl;
            if !keep {
                order.remove(&n.seq);
            }
            keep
        });
        self.stats.expired += (before - self.negative.len()) as u64;
    }

    /// Records an attachment with its first holder. Replaces a positive
    /// entry of the same key (rewritten in place) keeping its holders, and
    /// returns the attachment it replaced (drop it to detach).
    pub(crate) fn insert_positive(&mut self, key: FileKey, stamp: FileStamp, attachment: A) -> Option<A> {
        if let Some(old) = self.negative.remove(&key) {
            self.order.remove(&old.seq);
        }
        match self.positive.get_mut(&key) {
            Some(p) => {
                p.stamp = stamp;
                p.refs += 1;
                if p.unused_since.take().is_some() {
                    self.unused -= 1;
                }
                Some(std::mem::replace(&mut p.attachment, attachment))
            }
            None => {
                self.positive.insert(key, Positive { stamp, refs: 1, attachment, unused_since: None });
                None
            }
        }
    }

    /// Drops one holder of `key`; the last one leaves the entry unused
    /// (reaped by [`Self::reap`] after the grace period).
    pub fn release(&mut self, key: FileKey, now: Instant) {
        if let Some(p) = self.positive.get_mut(&key) {
            p.refs = p.refs.saturating_sub(1);
            if p.refs == 0 && p.unused_since.is_none() {
                p.unused_since = Some(now);
                self.unused += 1;
            }
        }
    }

    /// Removes the positive entries unused for at least `grace` and hands
    /// their attachments back (drop them to detach).
    pub(crate) fn reap(&mut self, now: Instant, grace: Duration) -> Vec<A> {
        let due: Vec<FileKey> = self
            .positive
            .iter()
            .filter(|(_, p)| p.unused_since.is_some_and(|t| now.saturating_duration_since(t) >= grace))
            .map(|(&k, _)| k)
            .collect();
        self.unused -= due.len();
        due.into_iter().filter_map(|k| self.positive.remove(&k)).map(|p| p.attachment).collect()
    }

    /// Whether some positive entry has no holder (so [`Self::reap`] may
    /// have work): checked before reaping on every poll.
    pub(crate) fn has_unused(&self) -> bool {
        self.unused > 0
    }

    /// Holders of a positive entry (0 when none).
    #[cfg(test)]
    pub(crate) fn refcount(&self, key: FileKey) -> u32 {
        self.positive.get(&key).map_or(0, |p| p.refs)
    }

    /// The attachment of a positive entry.
    pub fn attachment(&self, key: FileKey) -> Option<&A> {
        self.positive.get(&key).map(|p| &p.attachment)
    }

    pub fn positive_len(&self) -> usize {
        self.positive.len()
    }

    pub fn negative_len(&self) -> usize {
        self.negative.len()
    }

    /// Whether `key` has a negative entry (expired or not).
    #[cfg(test)]
    pub(crate) fn is_negative(&self, key: FileKey) -> bool {
        self.negative.contains_key(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(600);

    fn key(i: u64) -> FileKey {
        FileKey { dev: 8, ino: i }
    }

    fn stamp(size: u64) -> FileStamp {
        FileStamp { size, mtime_ns: 1_700_000_000_000_000_000 }
    }

    fn cache(max_entries: usize) -> AttachmentCache<&'static str> {
        AttachmentCache::new(CacheLimits { ttl: TTL, max_entries })
    }

    #[test]
    fn negative_hits_until_changed_or_expired() {
        let t0 = Instant::now();
        let mut c = cache(16);
        assert_eq!(c.acquire(key(1), stamp(100), t0), Acquire::Miss);
        c.insert_negative(key(1), stamp(100), t0);
        for i in 0..200 {
            assert_eq!(c.acquire(key(1), stamp(100), t0 + Duration::from_millis(i)), Acquire::Negative);
        }
        assert_eq!(c.stats.negative_hits, 200);
        // A different size (rewritten in place) misses and drops the entry.
        assert_eq!(c.acquire(key(1), stamp(101), t0), Acquire::Miss);
        assert_eq!(c.negative_len(), 0);
        // Same size and mtime (cp -p of another file of equal size): served
        // the old verdict until the TTL, caught once it has passed.
        c.insert_negative(key(1), stamp(100), t0);
        assert_eq!(c.acquire(key(1), stamp(100), t0 + TTL - Duration::from_nanos(1)), Acquire::Negative);
        assert_eq!(c.acquire(key(1), stamp(100), t0 + TTL), Acquire::Miss);
        assert_eq!(c.negative_len(), 0);
    }

    #[test]
    fn in_place_overwrite_keeps_one_entry() {
        let t0 = Instant::now();
        let mut c = cache(16);
        for i in 0..50u64 {
            let now = t0 + Duration::from_secs(i);
            // Each rewrite changes size: a miss, then the new verdict overwrites.
            assert_eq!(c.acquire(key(7), stamp(i + 1), now), Acquire::Miss);
            c.insert_negative(key(7), stamp(i + 1), now);
            assert_eq!(c.negative_len(), 1);
            assert_eq!(c.order.len(), 1);
        }
        // Re-inserting an expired entry replaces it rather than duplicating it.
        let later = t0 + 3 * TTL;
        assert_eq!(c.acquire(key(7), stamp(50), later), Acquire::Miss);
        c.insert_negative(key(7), stamp(50), later);
        assert_eq!((c.negative_len(), c.order.len()), (1, 1));
        assert_eq!(c.acquire(key(7), stamp(50), later), Acquire::Negative);
    }

    #[test]
    fn sweeps_at_most_once_per_ttl_and_leaves_positives() {
        let t0 = Instant::now();
        let mut c = cache(1000);
        c.insert_positive(key(1000), stamp(1), "links");
        c.insert_negative(key(1), stamp(1), t0);
        assert_eq!(c.stats.sweeps, 1, "the first insert sweeps (nothing to do)");
        // A burst of inserts within one TTL: no further sweep.
        for i in 2..=100 {
            c.insert_negative(key(i), stamp(1), t0 + Duration::from_secs(i));
        }
        assert_eq!(c.stats.sweeps, 1);
        // Just before a TTL since the last sweep: still none, even though
        // key(1) has expired (it is dropped lazily when looked up).
        c.insert_negative(key(101), stamp(1), t0 + TTL - Duration::from_nanos(1));
        assert_eq!((c.stats.sweeps, c.negative_len()), (1, 101));
        // One TTL after the last sweep: the next insert sweeps the expired
        // entries (inserted at t0 .. t0+10s) and only them.
        let t1 = t0 + TTL + Duration::from_secs(10);
        c.insert_negative(key(102), stamp(1), t1);
        assert_eq!(c.stats.sweeps, 2);
        assert_eq!(c.negative_len(), 92, "key(1)..=key(10) swept; key(11)..=key(102) kept");
        assert!(!c.is_negative(key(5)) && c.is_negative(key(11)) && c.is_negative(key(102)));
        assert_eq!(c.stats.expired, 10);
        // The live positive entry was not touched.
        assert_eq!(c.refcount(key(1000)), 1);
        assert_eq!(c.attachment(key(1000)), Some(&"links"));
        // And the next insert within the TTL does not sweep again.
        c.insert_negative(key(103), stamp(1), t1 + TTL / 2);
        assert_eq!(c.stats.sweeps, 2);
    }

    #[test]
    fn bounded_with_oldest_evicted_first() {
        let t0 = Instant::now();
        let mut c = cache(3);
        for i in 1..=5 {
            c.insert_negative(key(i), stamp(1), t0 + Duration::from_secs(i));
            assert!(c.negative_len() <= 3);
        }
        assert_eq!(c.stats.evicted, 2);
        assert!(!c.is_negative(key(1)) && !c.is_negative(key(2)));
        assert!(c.is_negative(key(3)) && c.is_negative(key(5)));
        // Overwriting a present key evicts nothing.
        c.insert_negative(key(3), stamp(2), t0 + Duration::from_secs(6));
        assert_eq!((c.negative_len(), c.stats.evicted), (3, 2));
        // key(3) is now the newest: key(4) goes next.
        c.insert_negative(key(6), stamp(1), t0 + Duration::from_secs(7));
        assert!(!c.is_negative(key(4)) && c.is_negative(key(3)));
        assert_eq!(c.order.len(), c.negative_len());
    }

    #[test]
    fn positives_are_refcounted_and_released_by_the_last_holder() {
        let t0 = Instant::now();
        let mut c = cache(16);
        // A negative verdict turns positive when the file gains the symbol.
        c.insert_negative(key(1), stamp(1), t0);
        assert_eq!(c.acquire(key(1), stamp(2), t0), Acquire::Miss);
        assert!(c.insert_positive(key(1), stamp(2), "links").is_none());
        assert!(!c.is_negative(key(1)));
        for n in 2..=50 {
            assert_eq!(c.acquire(key(1), stamp(2), t0), Acquire::Positive(n));
        }
        assert_eq!(c.stats.positive_hits, 49);
        assert_eq!(c.refcount(key(1)), 50);
        for _ in 0..49 {
            c.release(key(1), t0);
        }
        assert!(c.reap(t0 + Duration::from_secs(60), Duration::ZERO).is_empty(), "one holder left");
        assert!(!c.has_unused());
        c.release(key(1), t0);
        assert_eq!(c.refcount(key(1)), 0);
        assert!(c.has_unused());
        // Unused, but kept for the grace period; a holder coming back reuses it.
        let grace = Duration::from_secs(2);
        assert!(c.reap(t0 + Duration::from_secs(1), grace).is_empty());
        assert_eq!(c.acquire(key(1), stamp(2), t0 + Duration::from_secs(1)), Acquire::Positive(1));
        c.release(key(1), t0 + Duration::from_secs(1));
        assert!(c.reap(t0 + Duration::from_secs(2), grace).is_empty(), "the grace period restarted");
        assert_eq!(c.reap(t0 + Duration::from_secs(3), grace), vec!["links"]);
        assert!(!c.has_unused());
        assert_eq!((c.positive_len(), c.refcount(key(1))), (0, 0));
        c.release(key(1), t0);
        assert!(c.reap(t0 + TTL, grace).is_empty(), "releasing an unknown key is a no-op");
        // Rewritten while attached: a miss, and the new attachment replaces
        // the old one, holders kept.
        c.insert_positive(key(2), stamp(1), "old");
        assert_eq!(c.acquire(key(2), stamp(9), t0), Acquire::Miss);
        assert_eq!(c.insert_positive(key(2), stamp(9), "new"), Some("old"));
        assert_eq!(c.refcount(key(2)), 2);
    }
}
