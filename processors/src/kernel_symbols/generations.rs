//! Snapshots stamped with the time they became live, so each sample is
//! resolved with the names that were valid when it was taken (an address
//! freed by one module and reused by the next must not rename old frames).
//!
//! Times are unix nanoseconds (CLOCK_REALTIME), the clock of sample
//! timestamps. Readers load the list with arc-swap and never block; the
//! single writer (the reload task) serializes on a mutex.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

use super::snapshot::Snapshot;

/// Now, as unix nanoseconds.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// One snapshot and when it became live.
#[derive(Debug)]
pub struct Generation {
    /// Unique per published snapshot; keys per-batch resolution caches.
    pub id: u64,
    pub(crate) live_since_ns: u64,
    pub snapshot: Arc<Snapshot>,
}

/// Ascending by `live_since_ns`; never empty.
pub(crate) type GenerationList = Arc<Vec<Arc<Generation>>>;

pub struct Generations {
    list: ArcSwap<Vec<Arc<Generation>>>,
    write: Mutex<()>,
    next_id: AtomicU64,
    retain_ns: u64,
}

impl Generations {
    pub fn new(first: Snapshot, live_since_ns: u64, retain_ns: u64) -> Self {
        let g = Arc::new(Generation { id: 1, live_since_ns, snapshot: Arc::new(first) });
        Generations {
            list: ArcSwap::from_pointee(vec![g]),
            write: Mutex::new(()),
            next_id: AtomicU64::new(2),
            retain_ns,
        }
    }

    /// All retained generations; cheap, lock-free.
    pub fn load(&self) -> GenerationList {
        self.list.load_full()
    }

    /// The newest generation.
    pub fn current(&self) -> Arc<Generation> {
        let l = self.list.load();
        l[l.len() - 1].clone()
    }

    /// The generation live at `ts_ns` in `list`; samples older than the
    /// oldest retained one get the oldest.
    #[inline]
    pub fn at(list: &[Arc<Generation>], ts_ns: u64) -> &Arc<Generation> {
        let i = list.partition_point(|g| g.live_since_ns <= ts_ns);
        &list[i.saturating_sub(1)]
    }

    /// Publishes `snapshot` as live from `since_ns` (clamped to not precede
    /// the newest generation) and drops generations no sample within
    /// `retain` can need.
    pub fn publish(&self, since_ns: u64, snapshot: Snapshot, now_ns: u64) -> Arc<Generation> {
        let _w = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.list.load_full();
        let since = since_ns.max(old.last().map_or(0, |g| g.live_since_ns));
        let g = Arc::new(Generation {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            live_since_ns: since,
            snapshot: Arc::new(snapshot),
        });
        let mut v: Vec<Arc<Generation>> = old.iter().filter(|o| o.live_since_ns < since).cloned().collect();
        v.push(g.clone());
        self.prune(&mut v, now_ns);
        self.list.store(Arc::new(v));
        g
    }

    /// Rewrites retained snapshots in place (same live time, new id), for
    /// facts that were true all along, such as names of a module read after
    /// its load was already published.
    pub(crate) fn amend(&self, mut f: impl FnMut(&Snapshot) -> Option<Snapshot>) {
        let _w = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.list.load_full();
        let mut changed = false;
        let v = old
            .iter()
            .map(|g| match f(&g.snapshot) {
                Some(s) => {
                    changed = true;
                    Arc::new(Generation {
                        id: self.next_id.fetch_add(1, Ordering::Relaxed),
                        live_since_ns: g.live_since_ns,
                        snapshot: Arc::new(s),
                    })
                }
                None => g.clone(),
            })
            .collect();
        if changed {
            self.list.store(Arc::new(v));
        }
    }

    /// Generation i is needed for samples in [since_i, since_{i+1}); drop it
    /// once its successor has been live longer than `retain`.
    fn prune(&self, v: &mut Vec<Arc<Generation>>, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(self.retain_ns);
        let keep_from =
            (0..v.len().saturating_sub(1)).find(|&i| v[i + 1].live_since_ns > cutoff).unwrap_or(v.len() - 1);
        v.drain(..keep_from);
    }

    pub fn len(&self) -> usize {
        self.list.load().len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_by_time_and_prunes() {
        let g = Generations::new(Snapshot::default(), 100, 50);
        g.publish(200, Snapshot::default(), 200);
        g.publish(300, Snapshot::default(), 300);
        let l = g.load();
        // 200 + 50 < 300: generation 1 is no longer needed.
        assert_eq!(l.len(), 2);
        assert_eq!(Generations::at(&l, 0).live_since_ns, 200);
        assert_eq!(Generations::at(&l, 299).live_since_ns, 200);
        assert_eq!(Generations::at(&l, 300).live_since_ns, 300);
        // A publish stamped in the past is clamped, not reordered.
        g.publish(10, Snapshot::default(), 310);
        assert_eq!(g.current().live_since_ns, 300);
    }
}
