//! The `ebpf` receiver's config section.

use profcol_api::config::{schema::DurationText, Problems, Validate};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Largest stack the BPF program copies.
pub const MAX_STACK_DEPTH: u32 = profcol_ebpf::MAX_STACK_DEPTH as u32;

/// `receivers: ebpf:` section. Every field has a default. Ranges are
/// checked by [`Validate`], so `profcol validate` reports them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EbpfConfig {
    /// Samples per second per CPU (software cpu-clock). 19 Hz by default so
    /// sampling does not run in lock-step with 10 ms / 100 Hz timers.
    pub sample_frequency: u64,
    /// How often a batch is pushed downstream.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "DurationText")]
    pub report_interval: Duration,
    /// Only sample these process ids (tgids); empty = every process.
    pub pids: Vec<u32>,
    /// Skip samples of the idle task.
    pub exclude_idle: bool,
    /// Frames kept per stack, kernel and user each (1..=127).
    pub max_stack_depth: u32,
    /// BPF ring buffer size in bytes: a power of two, at least one page.
    pub ring_buffer_size: u32,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            sample_frequency: 19,
            report_interval: Duration::from_secs(5),
            pids: Vec::new(),
            exclude_idle: true,
            max_stack_depth: MAX_STACK_DEPTH,
            ring_buffer_size: 1 << 20,
        }
    }
}

impl Validate for EbpfConfig {
    /// Ranges; each message names the allowed values.
    fn validate(&self, p: &mut Problems) {
        if self.sample_frequency == 0 || self.sample_frequency > 100_000 {
            p.add(
                "sample_frequency",
                format!(
                    "{} is out of range; use 1..=100000 Hz (it is also capped by kernel.perf_event_max_sample_rate)",
                    self.sample_frequency
                ),
            );
        }
        if self.report_interval < Duration::from_millis(100) {
            p.add("report_interval", format!("{:?} is too short; use at least 100ms", self.report_interval));
        }
        if self.max_stack_depth == 0 || self.max_stack_depth > MAX_STACK_DEPTH {
            p.add("max_stack_depth", format!("{} is out of range; use 1..={MAX_STACK_DEPTH}", self.max_stack_depth));
        }
        let page = page_size();
        if !self.ring_buffer_size.is_power_of_two() || (self.ring_buffer_size as u64) < page {
            p.add(
                "ring_buffer_size",
                format!("{} must be a power of two and at least the page size ({page})", self.ring_buffer_size),
            );
        }
        if self.pids.len() > profcol_ebpf::PID_FILTER_CAPACITY {
            p.add(
                "pids",
                format!("{} entries; at most {} are supported", self.pids.len(), profcol_ebpf::PID_FILTER_CAPACITY),
            );
        }
        if self.pids.contains(&0) {
            p.add("pids", "0 is the idle task, not a process id; remove it");
        }
    }
}

impl EbpfConfig {
    /// Sampling period in nanoseconds: 1e9 / sample_frequency.
    pub fn period_ns(&self) -> i64 {
        1_000_000_000 / self.sample_frequency.max(1) as i64
    }
}

pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_config::parse_section;

    fn problems(c: &EbpfConfig) -> Vec<String> {
        let mut p = Problems::new();
        c.validate(&mut p);
        p.into_errors().into_iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn defaults_and_unknown_fields() {
        let c: EbpfConfig = parse_section("{}").unwrap().decode().unwrap();
        assert_eq!(c, EbpfConfig::default());
        assert_eq!(c.sample_frequency, 19);
        assert_eq!(c.report_interval, Duration::from_secs(5));
        assert!(c.exclude_idle);
        assert!(problems(&c).is_empty());
        let e = parse_section("sample_freq: 3").unwrap().decode::<EbpfConfig>().unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let c: EbpfConfig =
            parse_section("report_interval: 2s\npids: [1, 2]\nsample_frequency: 99").unwrap().decode().unwrap();
        assert_eq!(c.report_interval, Duration::from_secs(2));
        assert_eq!(c.pids, vec![1, 2]);
        assert_eq!(c.period_ns(), 10_101_010);
        // Round trip of the effective config.
        let back: EbpfConfig = profcol_api::config::encode(&c).unwrap().decode().unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |f: fn(&mut EbpfConfig)| {
            let mut c = EbpfConfig::default();
            f(&mut c);
            problems(&c).join("; ")
        };
        assert!(bad(|c| c.sample_frequency = 0).starts_with("sample_frequency: 0 is out of range"));
        assert!(bad(|c| c.max_stack_depth = 500).starts_with("max_stack_depth: 500 is out of range"));
        assert!(bad(|c| c.ring_buffer_size = 5000).starts_with("ring_buffer_size"));
        assert!(bad(|c| c.report_interval = Duration::from_millis(1)).starts_with("report_interval"));
        assert!(bad(|c| c.pids = vec![0]).starts_with("pids"));
    }
}
