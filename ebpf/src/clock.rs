//! Kernel time → unix time: the one clock of samples and symbol events.
//!
//! `bpf_ktime_get_ns()` is CLOCK_MONOTONIC, and kernel_symbols asks perf to
//! stamp PERF_RECORD_KSYMBOL records with CLOCK_MONOTONIC too. Both are
//! turned into unix nanoseconds with one offset to CLOCK_REALTIME, measured
//! once per process ([`KtimeToUnix::process`]) and then kept: a sample and the
//! load of the BPF program it hit are compared on the same scale, and times
//! stay monotonic. An NTP step after start is not followed (slewing changes
//! both clocks alike).

/// Nanoseconds of a clock.
pub fn now_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer; clock ids used here always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// Fixed CLOCK_MONOTONIC → CLOCK_REALTIME conversion.
#[derive(Clone, Copy, Debug)]
pub struct KtimeToUnix {
    offset_ns: i128,
}

impl KtimeToUnix {
    /// Measures the offset: the realtime reading bracketed by the tightest
    /// of a few monotonic pairs.
    pub fn measure() -> Self {
        let mut best: Option<(u64, i128)> = None;
        for _ in 0..7 {
            let m1 = now_ns(libc::CLOCK_MONOTONIC);
            let r = now_ns(libc::CLOCK_REALTIME);
            let m2 = now_ns(libc::CLOCK_MONOTONIC);
            let width = m2.saturating_sub(m1);
            let mid = m1 as i128 + (width / 2) as i128;
            let off = r as i128 - mid;
            if best.is_none_or(|(w, _)| width < w) {
                best = Some((width, off));
            }
        }
        KtimeToUnix { offset_ns: best.map_or(0, |(_, o)| o) }
    }

    /// The offset this process uses everywhere: measured at the first call.
    pub fn process() -> Self {
        static SHARED: std::sync::OnceLock<KtimeToUnix> = std::sync::OnceLock::new();
        *SHARED.get_or_init(KtimeToUnix::measure)
    }

    pub fn to_unix_ns(&self, ktime_ns: u64) -> u64 {
        (ktime_ns as i128 + self.offset_ns).clamp(0, u64::MAX as i128) as u64
    }

    /// Current unix time on the same scale as converted sample times.
    pub fn now_unix_ns(&self) -> u64 {
        self.to_unix_ns(now_ns(libc::CLOCK_MONOTONIC))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_tracks_realtime() {
        let c = KtimeToUnix::measure();
        let converted = c.to_unix_ns(now_ns(libc::CLOCK_MONOTONIC));
        let real = now_ns(libc::CLOCK_REALTIME);
        assert!(converted.abs_diff(real) < 5_000_000, "{converted} vs {real}");
        assert!(c.to_unix_ns(1) < c.to_unix_ns(2));
    }
}
