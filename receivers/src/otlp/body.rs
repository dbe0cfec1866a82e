//! Reading a request's body against deadlines, for both servers.
//!
//! A body has `read_timeout` to start arriving, and no gap longer than
//! `read_timeout` between its chunks. Past its first `read_timeout` it must
//! also keep up `min_read_rate_kib`: every byte received buys 1/rate seconds,
//! so a body may take at most `read_timeout` + size / rate however it is
//! paced. A sender that misses either deadline is answered gRPC
//! DEADLINE_EXCEEDED / HTTP 408.
//!
//! A body being read holds no `max_concurrent_requests` slot: the servers
//! take one only once the whole body arrived. What bounds the memory of
//! bodies being read is a byte budget ([`ReadBudget`], `max_concurrent_requests`
//! × the size cap) that every chunk is counted against as it arrives, the way
//! Envoy's overload manager and buffer limits account for buffered bytes rather
//! than requests. So a slow sender holds only the bytes it sent, and any number
//! of them cannot keep a valid request from a slot.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The bytes of request bodies held in memory, shared by both servers: one
/// permit per byte.
#[derive(Clone)]
pub(crate) struct ReadBudget {
    bytes: Arc<Semaphore>,
    /// How long a chunk may wait for room before the sender is told to retry.
    wait: Duration,
}

impl ReadBudget {
    pub(crate) fn new(bytes: usize, wait: Duration) -> Self {
        ReadBudget { bytes: Arc::new(Semaphore::new(bytes.clamp(1, Semaphore::MAX_PERMITS))), wait }
    }
}

/// The deadlines and the size cap of one body.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadLimits {
    pub read_timeout: Duration,
    /// Bytes per second a body must keep up after its first `read_timeout`; 0: none.
    pub min_rate: f64,
    /// Largest body accepted, in bytes.
    pub max: usize,
}

/// Why a body was not read whole.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// Past `max`.
    TooLarge,
    /// A deadline passed: the sender stalled or was too slow.
    TimedOut { received: usize, waited: Duration },
    /// The connection broke or sent something that is not a body.
    Broken(String),
    /// The read budget had no room for the body's next chunk within its wait.
    Busy,
}

/// One body being read: what has arrived and when.
pub(crate) struct BodyReader<B> {
    body: std::pin::Pin<Box<B>>,
    limits: ReadLimits,
    started: Instant,
    last_progress: Instant,
    received: usize,
    buf: BytesMut,
    ended: bool,
    budget: ReadBudget,
    /// Bytes of `budget` this body holds; given back on drop.
    reserved: usize,
    /// Draining keeps nothing, so it takes nothing from the budget.
    draining: bool,
}

impl<B> Drop for BodyReader<B> {
    fn drop(&mut self) {
        self.budget.bytes.add_permits(self.reserved);
    }
}

impl<B> BodyReader<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    pub(crate) fn new(body: B, limits: ReadLimits, budget: ReadBudget) -> Self {
        let now = Instant::now();
        BodyReader {
            body: Box::pin(body),
            limits,
            started: now,
            last_progress: now,
            received: 0,
            buf: BytesMut::new(),
            ended: false,
            budget,
            reserved: 0,
            draining: false,
        }
    }

    /// Counts `n` more bytes against the budget, waiting for room at most
    /// the budget's wait.
    async fn reserve(&mut self, n: usize) -> Result<(), ReadError> {
        let mut left = n;
        while left > 0 {
            let k = u32::try_from(left).unwrap_or(u32::MAX);
            let sem = &self.budget.bytes;
            let permits = match sem.try_acquire_many(k) {
                Ok(p) => p,
                Err(_) => match tokio::time::timeout(self.budget.wait, sem.acquire_many(k)).await {
                    Ok(Ok(p)) => p,
                    // Err(Closed) cannot happen (the semaphore is never closed).
                    Ok(Err(_)) | Err(_) => return Err(ReadError::Busy),
                },
            };
            permits.forget();
            self.reserved += k as usize;
            left -= k as usize;
        }
        Ok(())
    }

    /// When the next chunk must have arrived: `read_timeout` after the last
    /// one, and within the time the bytes so far paid for at `min_rate`.
    fn deadline(&self) -> Instant {
        let idle = self.last_progress + self.limits.read_timeout;
        let paid = if self.limits.min_rate > 0.0 {
            Duration::from_secs_f64((self.received as f64 / self.limits.min_rate).min(1e9))
        } else {
            Duration::ZERO
        };
        idle.min(self.started + self.limits.read_timeout + paid)
    }

    /// Waits for the next chunk; false once the body ended.
    async fn next_chunk(&mut self) -> Result<bool, ReadError> {
        if self.ended {
            return Ok(false);
        }
        let deadline = self.deadline();
        loop {
            let frame = match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return Err(ReadError::TimedOut { received: self.received, waited: self.started.elapsed() }),
                Ok(None) => {
                    self.ended = true;
                    return Ok(false);
                }
                Ok(Some(Err(e))) => return Err(ReadError::Broken(e.to_string())),
                Ok(Some(Ok(f))) => f,
            };
            // Trailers carry nothing a request needs.
            let Ok(data) = frame.into_data() else { continue };
            if data.is_empty() {
                continue;
            }
            self.received = self.received.saturating_add(data.len());
            self.last_progress = Instant::now();
            if self.received > self.limits.max {
                return Err(ReadError::TooLarge);
            }
            if !self.draining {
                self.reserve(data.len()).await?;
            }
            self.buf.extend_from_slice(&data);
            return Ok(true);
        }
    }

    /// Waits for the body's first bytes (or its end, for an empty body).
    #[cfg(test)]
    pub(crate) async fn first(&mut self) -> Result<(), ReadError> {
        self.next_chunk().await.map(|_| ())
    }

    /// Reads the (rest of the) body.
    pub(crate) async fn rest(&mut self) -> Result<Bytes, ReadError> {
        while self.next_chunk().await? {}
        Ok(std::mem::take(&mut self.buf).freeze())
    }

    /// Reads and discards what is left (at most `up_to` more bytes), within
    /// the same deadlines, so a sender still writing an oversized body gets
    /// to read the answer instead of a reset connection. Keeps nothing.
    pub(crate) async fn drain(&mut self, up_to: usize) {
        self.buf = BytesMut::new();
        self.draining = true;
        self.budget.bytes.add_permits(std::mem::take(&mut self.reserved));
        self.limits.max = self.received.saturating_add(up_to);
        while let Ok(true) = self.next_chunk().await {
            self.buf.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;

    type Chunks = StreamBody<tokio_stream::wrappers::ReceiverStream<Result<http_body::Frame<Bytes>, String>>>;

    fn body() -> (tokio::sync::mpsc::Sender<Result<http_body::Frame<Bytes>, String>>, Chunks) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        (tx, StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    fn budget() -> ReadBudget {
        ReadBudget::new(16 << 20, Duration::from_secs(1))
    }

    fn limits(rate: f64) -> ReadLimits {
        ReadLimits { read_timeout: Duration::from_secs(5), min_rate: rate, max: 1 << 20 }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out_after_read_timeout() {
        let (tx, b) = body();
        let mut r = BodyReader::new(b, limits(65536.0), budget());
        tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"abc")))).await.unwrap();
        r.first().await.unwrap();
        let t = Instant::now();
        let e = r.rest().await.unwrap_err();
        assert!(matches!(e, ReadError::TimedOut { received: 3, .. }), "{e:?}");
        assert_eq!(t.elapsed(), Duration::from_secs(5));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn no_first_bytes_time_out_too() {
        let (_tx, b) = body();
        let mut r = BodyReader::new(b, limits(65536.0), budget());
        assert!(matches!(r.first().await, Err(ReadError::TimedOut { received: 0, .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_body_may_take_longer_while_it_keeps_up_the_rate() {
        // 1 KiB every 10 ms: 100 KiB/s, above 64 KiB/s; 8 s in all, past read_timeout.
        let (tx, b) = body();
        let mut r = BodyReader::new(b, limits(65536.0), budget());
        tokio::spawn(async move {
            for _ in 0..800 {
                tx.send(Ok(http_body::Frame::data(Bytes::from(vec![1u8; 1024])))).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        r.first().await.unwrap();
        assert_eq!(r.rest().await.unwrap().len(), 800 * 1024);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_loris_is_cut_once_its_bytes_no_longer_pay_for_the_time() {
        // 100 bytes every second: never idle for read_timeout, far below 64 KiB/s.
        let (tx, b) = body();
        let mut r = BodyReader::new(b, limits(65536.0), budget());
        tokio::spawn(async move {
            for _ in 0..60 {
                if tx.send(Ok(http_body::Frame::data(Bytes::from(vec![1u8; 100])))).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let t = Instant::now();
        r.first().await.unwrap();
        let e = r.rest().await.unwrap_err();
        assert!(matches!(e, ReadError::TimedOut { .. }), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_rate_every_body_gets_read_timeout() {
        let (tx, b) = body();
        let mut r = BodyReader::new(b, limits(0.0), budget());
        tokio::spawn(async move {
            for _ in 0..60 {
                if tx.send(Ok(http_body::Frame::data(Bytes::from(vec![1u8; 1 << 14])))).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let t = Instant::now();
        r.first().await.unwrap();
        assert!(matches!(r.rest().await, Err(ReadError::TimedOut { .. })));
        assert_eq!(t.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn past_the_cap_is_too_large() {
        let (tx, b) = body();
        let mut r = BodyReader::new(b, ReadLimits { max: 10, ..limits(0.0) }, budget());
        tx.send(Ok(http_body::Frame::data(Bytes::from(vec![0u8; 11])))).await.unwrap();
        assert!(matches!(r.first().await, Err(ReadError::TooLarge)));
    }
}
