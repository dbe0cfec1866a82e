//! The `ebpf` receiver's config section.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Largest stack the BPF program copies.
pub const MAX_STACK_DEPTH: u32 = profcol_ebpf::MAX_STACK_DEPTH as u32;

/// `receivers: ebpf:` section. Every field has a default. Ranges are
/// checked while deserializing, so `profcol validate` reports them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Unchecked")]
pub struct EbpfConfig {
    /// Samples per second per CPU (software cpu-clock). 19 Hz by default so
    /// sampling does not run in lock-step with 10 ms / 100 Hz timers.
    pub sample_frequency: u64,
    /// How often a batch is pushed downstream.
    #[serde(with = "humantime_serde")]
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

/// The section as written, before range checks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Unchecked {
    sample_frequency: u64,
    #[serde(with = "humantime_serde")]
    report_interval: Duration,
    pids: Vec<u32>,
    exclude_idle: bool,
    max_stack_depth: u32,
    ring_buffer_size: u32,
}

impl Default for Unchecked {
    fn default() -> Self {
        let d = EbpfConfig::default();
        Unchecked {
            sample_frequency: d.sample_frequency,
            report_interval: d.report_interval,
            pids: d.pids,
            exclude_idle: d.exclude_idle,
            max_stack_depth: d.max_stack_depth,
            ring_buffer_size: d.ring_buffer_size,
        }
    }
}

impl TryFrom<Unchecked> for EbpfConfig {
    type Error = String;
    fn try_from(u: Unchecked) -> Result<Self, String> {
        let c = EbpfConfig {
            sample_frequency: u.sample_frequency,
            report_interval: u.report_interval,
            pids: u.pids,
            exclude_idle: u.exclude_idle,
            max_stack_depth: u.max_stack_depth,
            ring_buffer_size: u.ring_buffer_size,
        };
        c.validate()?;
        Ok(c)
    }
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

impl EbpfConfig {
    /// Checks ranges; the message names the field and the allowed values.
    pub fn validate(&self) -> Result<(), String> {
        if self.sample_frequency == 0 || self.sample_frequency > 100_000 {
            return Err(format!(
                "sample_frequency: {} is out of range; use 1..=100000 Hz (it is also capped by kernel.perf_event_max_sample_rate)",
                self.sample_frequency
            ));
        }
        if self.report_interval < Duration::from_millis(100) {
            return Err(format!("report_interval: {:?} is too short; use at least 100ms", self.report_interval));
        }
        if self.max_stack_depth == 0 || self.max_stack_depth > MAX_STACK_DEPTH {
            return Err(format!(
                "max_stack_depth: {} is out of range; use 1..={MAX_STACK_DEPTH}",
                self.max_stack_depth
            ));
        }
        let page = page_size();
        if !self.ring_buffer_size.is_power_of_two() || (self.ring_buffer_size as u64) < page {
            return Err(format!(
                "ring_buffer_size: {} must be a power of two and at least the page size ({page})",
                self.ring_buffer_size
            ));
        }
        if self.pids.len() > profcol_ebpf::PID_FILTER_CAPACITY {
            return Err(format!(
                "pids: {} entries; at most {} are supported",
                self.pids.len(),
                profcol_ebpf::PID_FILTER_CAPACITY
            ));
        }
        if self.pids.contains(&0) {
            return Err("pids: 0 is the idle task, not a process id".into());
        }
        Ok(())
    }

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

    #[test]
    fn defaults_and_unknown_fields() {
        let c: EbpfConfig = serde_yaml::from_str("{}").unwrap();
        assert_eq!(c, EbpfConfig::default());
        assert_eq!(c.sample_frequency, 19);
        assert_eq!(c.report_interval, Duration::from_secs(5));
        assert!(c.exclude_idle);
        c.validate().unwrap();
        let e = serde_yaml::from_str::<EbpfConfig>("sample_freq: 3").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let c: EbpfConfig = serde_yaml::from_str("report_interval: 2s\npids: [1, 2]\nsample_frequency: 99").unwrap();
        assert_eq!(c.report_interval, Duration::from_secs(2));
        assert_eq!(c.pids, vec![1, 2]);
        assert_eq!(c.period_ns(), 10_101_010);
    }

    #[test]
    fn ranges_are_checked_when_deserializing() {
        let e = serde_yaml::from_str::<EbpfConfig>("max_stack_depth: 500").unwrap_err().to_string();
        assert!(e.contains("max_stack_depth: 500 is out of range"), "{e}");
        let e = serde_yaml::from_str::<EbpfConfig>("ring_buffer_size: 1000").unwrap_err().to_string();
        assert!(e.contains("ring_buffer_size"), "{e}");
        // Round trip of the effective config.
        let c = EbpfConfig::default();
        let back: EbpfConfig = serde_yaml::from_str(&serde_yaml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |f: fn(&mut EbpfConfig)| {
            let mut c = EbpfConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.sample_frequency = 0).starts_with("sample_frequency"));
        assert!(bad(|c| c.max_stack_depth = 500).starts_with("max_stack_depth"));
        assert!(bad(|c| c.ring_buffer_size = 5000).starts_with("ring_buffer_size"));
        assert!(bad(|c| c.report_interval = Duration::from_millis(1)).starts_with("report_interval"));
        assert!(bad(|c| c.pids = vec![0]).starts_with("pids"));
    }
}
