//! How far the BPF history is complete, so a batch is named only once the
//! records of its time are in.
//!
//! A program loaded a few milliseconds before the receiver cut a batch has
//! its PERF_RECORD_KSYMBOL still on the way (merge window, then the reload
//! task) when the batch arrives: symbolized at once, its samples would find
//! nothing at their time. So the listener reports a *complete-to* time with
//! every merged batch of records (every record stamped at or before it has
//! been sent), the reload task publishes it once those records are applied,
//! and the processor waits, bounded by [`CATCH_UP_LIMIT`], until it passes
//! the batch's newest sample. A batch that waits only pokes the listener,
//! which otherwise sleeps while nothing happens.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::Notify;

/// Longest a batch waits for the BPF records of its time (then it is named
/// with what is known, and the wait is counted).
pub(crate) const CATCH_UP_LIMIT: Duration = Duration::from_millis(250);

/// Shared by the perf listener, the reload task and the processor.
#[derive(Debug, Default)]
pub struct BpfProgress {
    /// A listener runs: without one no record will come to wait for.
    listening: AtomicBool,
    /// Unix ns: every BPF record stamped at or before it is published.
    complete_to: AtomicU64,
    /// Unix ns some batch waits for.
    wanted_to: AtomicU64,
    published: Notify,
    poke: Notify,
    /// Batches that waited [`CATCH_UP_LIMIT`] in vain.
    pub timeouts: AtomicU64,
}

impl BpfProgress {
    pub(crate) fn set_listening(&self, on: bool) {
        self.listening.store(on, Relaxed);
        // Waiters of a listener that stopped give up at once.
        self.published.notify_waiters();
    }

    /// The reload task applied and published every record up to `to`.
    pub(crate) fn published_to(&self, to: u64) {
        self.complete_to.fetch_max(to, Relaxed);
        self.published.notify_waiters();
    }

    pub fn complete_to(&self) -> u64 {
        self.complete_to.load(Relaxed)
    }

    /// What some batch waits for (the listener reports up to it promptly).
    pub(crate) fn wanted_to(&self) -> u64 {
        self.wanted_to.load(Relaxed)
    }

    /// Resolves when a batch starts waiting.
    pub(crate) async fn poked(&self) {
        self.poke.notified().await
    }

    /// Waits until every record stamped at or before `ts` is published, or
    /// `limit`. Returns false when it gave up.
    pub async fn wait_for(&self, ts: u64, limit: Duration) -> bool {
        if !self.listening.load(Relaxed) || self.complete_to() >= ts {
            return true;
        }
        self.wanted_to.fetch_max(ts, Relaxed);
        self.poke.notify_one();
        let caught_up = async {
            loop {
                let published = self.published.notified();
                tokio::pin!(published);
                published.as_mut().enable();
                if !self.listening.load(Relaxed) || self.complete_to() >= ts {
                    return;
                }
                published.await;
            }
        };
        let ok = tokio::time::timeout(limit, caught_up).await.is_ok();
        if !ok {
            self.timeouts.fetch_add(1, Relaxed);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn waits_for_the_time_asked_and_no_longer_than_the_limit() {
        let p = Arc::new(BpfProgress::default());
        assert!(p.wait_for(100, Duration::from_millis(1)).await, "no listener: nothing to wait for");
        p.set_listening(true);
        p.published_to(50);
        assert!(p.wait_for(50, Duration::ZERO).await);
        // A publish short of the time asked does not end the wait; one past it does.
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.wait_for(100, Duration::from_secs(10)).await }
        });
        tokio::time::timeout(Duration::from_secs(1), p.poked()).await.expect("the listener is poked");
        assert_eq!(p.wanted_to(), 100);
        p.published_to(99);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        p.published_to(100);
        assert!(waiter.await.unwrap());
        assert!(!p.wait_for(1_000, Duration::from_millis(20)).await);
        assert_eq!(p.timeouts.load(Relaxed), 1);
    }
}
