//! Exponential backoff with jitter, bounded by `max_elapsed_time`.

use crate::exporter_helper::settings::RetryConfig;
use std::time::Duration;
// tokio's clock: the same as std's in a running host, and virtual under a paused test clock.
use tokio::time::Instant;

pub(super) struct Backoff {
    cfg: RetryConfig,
    interval: Duration,
    started: Instant,
}

impl Backoff {
    pub(super) fn new(cfg: &RetryConfig) -> Self {
        Backoff { interval: cfg.initial_interval, cfg: cfg.clone(), started: Instant::now() }
    }

    /// How long to wait before the next attempt, or None to give up.
    /// A server's Retry-After / RetryInfo wins when it asks for longer.
    pub(super) fn next(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        if !self.cfg.enabled {
            return None;
        }
        let f = self.cfg.randomization_factor.clamp(0.0, 1.0);
        let jitter = 1.0 - f + 2.0 * f * fastrand::f64();
        let mut wait = self.interval.mul_f64(jitter);
        if let Some(ra) = retry_after {
            wait = wait.max(ra);
        }
        let next = self.interval.mul_f64(self.cfg.multiplier.max(1.0));
        self.interval = next.min(self.cfg.max_interval);
        let max = self.cfg.max_elapsed_time;
        if !max.is_zero() && self.started.elapsed() + wait > max {
            return None;
        }
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_caps_and_gives_up() {
        let cfg = RetryConfig {
            initial_interval: Duration::from_millis(100),
            max_interval: Duration::from_millis(300),
            max_elapsed_time: Duration::from_millis(250),
            randomization_factor: 0.0,
            multiplier: 2.0,
            enabled: true,
        };
        let mut b = Backoff::new(&cfg);
        assert_eq!(b.next(None), Some(Duration::from_millis(100)));
        assert_eq!(b.next(None), Some(Duration::from_millis(200)));
        // 300ms would pass max_elapsed_time.
        assert_eq!(b.next(None), None);
        let mut b = Backoff::new(&RetryConfig { max_elapsed_time: Duration::ZERO, ..cfg.clone() });
        assert_eq!(b.next(Some(Duration::from_secs(2))), Some(Duration::from_secs(2)));
        assert_eq!(Backoff::new(&RetryConfig { enabled: false, ..cfg }).next(None), None);
    }
}
