//! The in-memory sending queue: FIFO, bounded by a total weight in the
//! unit of `sending_queue.sizer` (batches, samples or bytes) rather than by
//! a count of entries.
//!
//! An entry's weight stays charged until its consumer calls
//! [`SizedQueue::release`] (the export ended: sent, dropped or handed back),
//! so the bound covers what the exporter holds — batches waiting and batches
//! being sent or retried — and a stalled backend cannot make the exporter
//! hold more than `queue_size`.

use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::Notify;

/// Why an entry was not queued; the entry comes back with it.
#[derive(Debug)]
pub(super) enum Rejected<T> {
    /// No room now (only from [`SizedQueue::try_push`]).
    Full(T),
    /// Heavier than the whole capacity: it can never fit.
    TooLarge(T),
    /// The queue is closed (shutdown).
    Closed(T),
}

struct State<T> {
    entries: VecDeque<(T, u64)>,
    /// Weight of the entries waiting plus those taken and not yet released.
    used: u64,
    closed: bool,
}

pub(super) struct SizedQueue<T> {
    state: Mutex<State<T>>,
    capacity: u64,
    /// Signalled when an entry arrives or the queue closes.
    arrived: Notify,
    /// Signalled when weight is released or the queue closes.
    room: Notify,
}

impl<T> SizedQueue<T> {
    pub(super) fn new(capacity: u64) -> Self {
        SizedQueue {
            state: Mutex::new(State { entries: VecDeque::new(), used: 0, closed: false }),
            capacity: capacity.max(1),
            arrived: Notify::new(),
            room: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Weight charged now (waiting and taken-but-not-released entries).
    pub(super) fn used(&self) -> u64 {
        self.lock().used
    }

    /// Entries waiting to be taken.
    pub(super) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub(super) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Queues `item` if it fits now.
    pub(super) fn try_push(&self, item: T, weight: u64) -> Result<(), Rejected<T>> {
        let mut s = self.lock();
        if s.closed {
            return Err(Rejected::Closed(item));
        }
        if weight > self.capacity {
            return Err(Rejected::TooLarge(item));
        }
        if s.used + weight > self.capacity {
            return Err(Rejected::Full(item));
        }
        s.used += weight;
        s.entries.push_back((item, weight));
        drop(s);
        self.arrived.notify_one();
        Ok(())
    }

    /// Queues `item`, waiting for room.
    pub(super) async fn push(&self, mut item: T, weight: u64) -> Result<(), Rejected<T>> {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            // Registered before the attempt, so a release in between is not missed.
            room.as_mut().enable();
            match self.try_push(item, weight) {
                Err(Rejected::Full(back)) => item = back,
                other => return other,
            }
            room.await;
        }
    }

    /// Takes the oldest entry without waiting.
    pub(super) fn try_pop(&self) -> Option<(T, u64)> {
        self.lock().entries.pop_front()
    }

    /// Takes the oldest entry, waiting for one; `None` once the queue is
    /// closed and empty. The entry's weight stays charged until
    /// [`SizedQueue::release`].
    pub(super) async fn pop(&self) -> Option<(T, u64)> {
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            {
                let mut s = self.lock();
                if let Some(e) = s.entries.pop_front() {
                    let more = !s.entries.is_empty();
                    drop(s);
                    if more {
                        // Pass the wake-up on: one notify_one may stand for several entries.
                        self.arrived.notify_one();
                    }
                    return Some(e);
                }
                if s.closed {
                    return None;
                }
            }
            arrived.await;
        }
    }

    /// Gives back the weight of an entry taken with `pop`/`try_pop`.
    pub(super) fn release(&self, weight: u64) {
        let mut s = self.lock();
        s.used = s.used.saturating_sub(weight);
        drop(s);
        self.room.notify_waiters();
    }

    /// No more pushes; waiting entries can still be taken.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.arrived.notify_waiters();
        self.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn bounded_by_weight_until_released() {
        let q = SizedQueue::new(10);
        q.try_push("a", 6).unwrap();
        assert!(matches!(q.try_push("b", 5), Err(Rejected::Full("b"))));
        assert!(matches!(q.try_push("c", 11), Err(Rejected::TooLarge("c"))));
        q.try_push("d", 4).unwrap();
        let (a, w) = q.try_pop().unwrap();
        assert_eq!((a, w, q.used()), ("a", 6, 10), "taken but not released still counts");
        assert!(matches!(q.try_push("b", 5), Err(Rejected::Full(_))));
        q.release(w);
        q.try_push("b", 5).unwrap();
        assert_eq!(q.used(), 9);
        q.close();
        assert!(matches!(q.try_push("e", 1), Err(Rejected::Closed(_))));
        assert_eq!(q.try_pop().map(|e| e.0), Some("d"));
    }

    #[tokio::test]
    async fn push_waits_for_room_and_pop_for_entries() {
        let q = Arc::new(SizedQueue::new(2));
        q.push(1, 2).await.unwrap();
        let q2 = Arc::clone(&q);
        let pusher = tokio::spawn(async move { q2.push(2, 2).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!pusher.is_finished(), "no room yet");
        let (one, w) = q.pop().await.unwrap();
        assert_eq!(one, 1);
        q.release(w);
        assert!(pusher.await.unwrap());
        assert_eq!(q.pop().await.map(|e| e.0), Some(2));
        let q3 = Arc::clone(&q);
        let popper = tokio::spawn(async move { q3.pop().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.close();
        assert!(popper.await.unwrap().is_none(), "closed and empty");
    }
}
