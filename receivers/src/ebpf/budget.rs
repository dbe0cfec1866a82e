//! `max_cpu`: the receiver lowers its sampling frequency while the agent's
//! CPU is above the budget and raises it back (never above
//! `sample_frequency`) while below. The agent's CPU is the process's own
//! (every thread, exited ones included: `getrusage`) plus the run time of
//! its BPF programs, which the kernel charges to the sampled tasks
//! (`BPF_ENABLE_STATS`, held while the receiver runs).
//!
//! A change cuts the report at that moment, so every profile carries the
//! one period its samples were taken at, and totals (samples × period)
//! stay CPU time.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// `max_cpu:` a share of one CPU, written `2%` (or `2`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "PercentText", into = "String")]
#[schemars(with = "String")]
pub struct CpuShare(f64);

impl Eq for CpuShare {}

/// How `max_cpu` is written: `"2%"`, `"0.5%"` or a number of percent.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PercentText {
    Text(String),
    Number(f64),
}

/// Smallest budget: below it the fixed cost of reading and reporting alone
/// is over it.
pub const MIN_PERCENT: f64 = 0.1;

impl TryFrom<PercentText> for CpuShare {
    type Error = String;

    fn try_from(t: PercentText) -> Result<Self, String> {
        let p = match &t {
            PercentText::Number(n) => *n,
            PercentText::Text(s) => s
                .trim()
                .strip_suffix('%')
                .unwrap_or(s.trim())
                .trim()
                .parse::<f64>()
                .map_err(|_| format!("{s:?} is not a percentage of one CPU; write e.g. `2%`"))?,
        };
        if !p.is_finite() || !(MIN_PERCENT..=100.0).contains(&p) {
            return Err(format!("{p}% is out of range; use {MIN_PERCENT}% to 100% of one CPU"));
        }
        Ok(CpuShare(p / 100.0))
    }
}

impl From<CpuShare> for String {
    fn from(c: CpuShare) -> String {
        format!("{}%", c.0 * 100.0)
    }
}

impl CpuShare {
    /// The share of one CPU (0.02 for `2%`).
    pub fn fraction(self) -> f64 {
        self.0
    }
}

/// How often the agent's CPU is looked at (and the frequency changed at
/// most): long enough to hold a few reads of the rings, short enough to
/// follow a load that changes.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);
/// Lowest frequency the budget may set.
pub(crate) const MIN_HZ: u64 = 1;
/// The frequency is aimed at this part of the budget, so that noise
/// around it stays under the budget.
const AIM: f64 = 0.9;
/// Most a frequency is raised in one step (a load may come back).
const MAX_RAISE: f64 = 2.0;
/// Changes smaller than this part of the frequency are not made: each
/// cuts a report.
const DEAD_BAND: f64 = 0.1;

/// The controller: fed the agent's CPU so far, says when to change the
/// frequency and to what.
pub(crate) struct Budget {
    share: f64,
    max_hz: u64,
    hz: u64,
    last: Option<(Instant, u64)>,
    warned_floor: bool,
}

impl Budget {
    pub(crate) fn new(share: CpuShare, max_hz: u64) -> Self {
        Budget { share: share.fraction(), max_hz, hz: max_hz, last: None, warned_floor: false }
    }

    #[cfg(test)]
    pub(crate) fn hz(&self) -> u64 {
        self.hz
    }

    /// Called every [`CHECK_EVERY`] with the agent's CPU ns so far; the new
    /// frequency when it is to change.
    pub(crate) fn check(&mut self, now: Instant, cpu_ns: u64) -> Option<u64> {
        let (at, ns) = self.last.replace((now, cpu_ns))?;
        let wall = now.saturating_duration_since(at).as_nanos() as f64;
        if wall <= 0.0 {
            return None;
        }
        let used = cpu_ns.saturating_sub(ns) as f64 / wall;
        let want = if used > 0.0 { self.hz as f64 * self.share * AIM / used } else { f64::INFINITY };
        let want = want.min(self.hz as f64 * MAX_RAISE).clamp(MIN_HZ as f64, self.max_hz as f64);
        let next = want.round() as u64;
        let change = (next as f64 - self.hz as f64).abs() / self.hz as f64;
        // Over the budget: always down; under it: up when worth a cut, or
        // to the configured frequency.
        let over = used > self.share;
        if next == self.hz || (!over && change < DEAD_BAND && next != self.max_hz) {
            return None;
        }
        if next == MIN_HZ && over && !self.warned_floor {
            self.warned_floor = true;
            tracing::warn!(
                used_percent = used * 100.0,
                budget_percent = self.share * 100.0,
                "ebpf receiver: max_cpu cannot be kept even at {MIN_HZ} Hz; raise it"
            );
        }
        self.hz = next;
        Some(next)
    }
}

/// CPU ns the process has used so far, every thread (exited ones
/// included).
pub(crate) fn process_cpu_ns() -> u64 {
    // SAFETY: zeroed rusage is valid; getrusage fills it.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: r is a valid rusage to write.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) } != 0 {
        return 0;
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(r.ru_utime) + tv(r.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(t: &str) -> Result<CpuShare, String> {
        CpuShare::try_from(PercentText::Text(t.into()))
    }

    #[test]
    fn shares_parse_and_bad_ones_say_what_to_write() {
        assert_eq!(share("2%").unwrap().fraction(), 0.02);
        assert_eq!(share(" 0.5 % ").unwrap().fraction(), 0.005);
        assert_eq!(CpuShare::try_from(PercentText::Number(3.0)).unwrap().fraction(), 0.03);
        assert_eq!(String::from(share("2%").unwrap()), "2%");
        assert!(share("two").unwrap_err().contains("e.g. `2%`"));
        assert!(share("0%").unwrap_err().contains("out of range"));
        assert!(share("150%").unwrap_err().contains("out of range"));
    }

    /// An agent whose CPU is a fixed part plus a part per sample: the
    /// controller brings it under the budget and back up when the cost
    /// per sample falls.
    #[test]
    fn the_frequency_follows_the_budget_and_never_exceeds_the_configured_one() {
        let mut b = Budget::new(share("2%").unwrap(), 999);
        let mut now = Instant::now();
        let mut cpu = 0u64;
        // 2 busy CPUs: cost per sample per second, as a share of one CPU.
        let mut per_hz = 0.0001; // 999 Hz → ~10% of one CPU
        let fixed = 0.002;
        b.check(now, cpu);
        let mut used = Vec::new();
        for step in 0..40 {
            if step == 20 {
                per_hz /= 10.0; // the load calms down
            }
            let u = fixed + per_hz * b.hz() as f64;
            used.push(u);
            now += CHECK_EVERY;
            cpu += (u * CHECK_EVERY.as_nanos() as f64) as u64;
            b.check(now, cpu);
        }
        // Settled under the budget within a few checks, near it.
        for &u in &used[5..20] {
            assert!((0.02 * 0.7..=0.02).contains(&u), "{u} of one CPU: {used:?}");
        }
        // Cheaper samples: back up to the configured frequency, no higher.
        assert_eq!(b.hz(), 999, "{used:?}");
    }
}
