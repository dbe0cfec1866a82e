//! Off-CPU time (`off_cpu:`): how long threads wait, in which state, and
//! the stacks they waited in.
//!
//! The kernel does the work (`profcol_off_cpu_switch` on `sched_switch`,
//! `profcol_off_cpu` on `sys_exit`, see the BPF source): the chance and the
//! threshold are applied there, before any stack walk, and a wait over the
//! threshold comes as one record with its time. Here: the section's
//! settings and the counters of what came.

use std::time::Duration;

use profcol_api::config::schema::DurationText;
use profcol_api::telemetry::{ComponentTelemetry, Counter};
use profcol_ebpf::record::OffCpuState;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ebpf::metrics as m;

/// `off_cpu:` section of the ebpf receiver. Absent: off.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OffCpuConfig {
    /// A wait at least this long is a sample (its value: the time off CPU
    /// in nanoseconds); a shorter one costs no stack walk.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "DurationText")]
    pub threshold: Duration,
    /// The share of switches off CPU followed (0 < p <= 1), decided before
    /// anything else. Values are not scaled: with 0.1, a profile holds
    /// about a tenth of the time waited.
    pub probability: f64,
}

// Validation refuses a probability that is NaN.
impl Eq for OffCpuConfig {}

impl Default for OffCpuConfig {
    fn default() -> Self {
        OffCpuConfig { threshold: Duration::from_millis(1), probability: 1.0 }
    }
}

impl OffCpuConfig {
    /// Problems with the settings, as (key, message).
    pub(crate) fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !(self.probability > 0.0 && self.probability <= 1.0) {
            out.push((
                "off_cpu.probability".into(),
                format!("{} is out of range; use a share of switches in (0, 1], e.g. 0.1", self.probability),
            ));
        }
        if self.threshold > Duration::from_secs(3600) {
            out.push(("off_cpu.threshold".into(), format!("{:?} is too long; use at most 1h", self.threshold)));
        }
        out
    }

    /// The kernel's threshold: ns, at least 1 (0 would mean off).
    pub(crate) fn threshold_ns(&self) -> u64 {
        (self.threshold.as_nanos().min(u64::MAX as u128) as u64).max(1)
    }

    /// The kernel's chance: `probability` scaled to `u32::MAX` (a random
    /// u32 at most this follows the switch).
    pub(crate) fn probability_scaled(&self) -> u32 {
        (self.probability.clamp(0.0, 1.0) * f64::from(u32::MAX)).round() as u32
    }
}

/// Off-CPU samples and their time, by state.
#[derive(Clone)]
pub(crate) struct OffCpuCounters {
    samples: [Counter; 3],
    seconds: [Counter; 3],
}

impl OffCpuCounters {
    pub(crate) fn new(t: &ComponentTelemetry) -> Self {
        OffCpuCounters {
            samples: OffCpuState::ALL.map(|s| t.counter_by(&m::OFF_CPU_SAMPLES, s.name())),
            seconds: OffCpuState::ALL.map(|s| t.counter_by(&m::OFF_CPU_SECONDS, s.name())),
        }
    }

    /// One wait of `ns` in `state` (the seconds series counts ns).
    pub(crate) fn add(&self, state: OffCpuState, ns: u64) {
        self.samples[state as usize].inc();
        self.seconds[state as usize].add(ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probability_and_threshold_reach_the_kernel_scaled() {
        let c = OffCpuConfig { threshold: Duration::from_micros(1500), probability: 1.0 };
        assert_eq!((c.threshold_ns(), c.probability_scaled()), (1_500_000, u32::MAX));
        let c = OffCpuConfig { threshold: Duration::ZERO, probability: 0.25 };
        assert_eq!(c.threshold_ns(), 1, "0 is off in the kernel: the least threshold is 1 ns");
        assert_eq!(c.probability_scaled(), (f64::from(u32::MAX) / 4.0).round() as u32);
        assert!(c.problems().is_empty());
        for p in [0.0, -1.0, 1.5, f64::NAN] {
            let c = OffCpuConfig { probability: p, ..Default::default() };
            assert_eq!(c.problems().len(), 1, "{p}");
        }
    }
}
