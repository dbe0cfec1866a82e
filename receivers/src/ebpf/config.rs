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
    /// Functions whose calls are counted (empty: no uprobe machinery runs).
    pub uprobes: Vec<UprobeSpec>,
    /// Verdicts about binaries with nothing to attach.
    pub negative_cache: NegativeCacheConfig,
}

/// One entry of `uprobes:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UprobeSpec {
    /// Function name as in the symbol table (`malloc`, `runtime.mallocgc`);
    /// versioned names in the file (`malloc@@GLIBC_2.2.5`) match it.
    pub symbol: String,
    /// Which executables and libraries: an absolute path, a base name
    /// (`libc.so.6`) or a glob (`*/libssl.so.*`, `python3*`); a pattern with
    /// a `/` is matched against the whole path, otherwise against the base
    /// name. Left out: every executable and library.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
}

/// `negative_cache:` section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NegativeCacheConfig {
    /// How long a "nothing to attach" verdict is trusted while the file's
    /// size and mtime still match.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// Verdicts kept at most (oldest evicted first).
    pub max_entries: usize,
}

impl Default for NegativeCacheConfig {
    fn default() -> Self {
        NegativeCacheConfig { ttl: Duration::from_secs(600), max_entries: 65_536 }
    }
}

/// Most probes one receiver may configure.
pub const MAX_UPROBES: usize = 256;

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
    uprobes: Vec<UprobeSpec>,
    negative_cache: NegativeCacheConfig,
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
            uprobes: d.uprobes,
            negative_cache: d.negative_cache,
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
            uprobes: u.uprobes,
            negative_cache: u.negative_cache,
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
            uprobes: Vec::new(),
            negative_cache: NegativeCacheConfig::default(),
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
        if self.uprobes.len() > MAX_UPROBES {
            return Err(format!("uprobes: {} entries; at most {MAX_UPROBES} are supported", self.uprobes.len()));
        }
        for (i, p) in self.uprobes.iter().enumerate() {
            if p.symbol.is_empty() || p.symbol.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!("uprobes[{i}].symbol: {:?} is not a symbol name (no spaces, not empty)", p.symbol));
            }
            if p.symbol.contains('@') {
                return Err(format!(
                    "uprobes[{i}].symbol: {:?}: give the plain name ({:?}); versioned names in binaries match it",
                    p.symbol,
                    p.symbol.split('@').next().unwrap_or_default()
                ));
            }
            if let Some(b) = &p.binary {
                super::uprobes::matcher::BinaryPattern::parse(b).map_err(|m| format!("uprobes[{i}].binary: {m}"))?;
            }
        }
        let nc = &self.negative_cache;
        if nc.ttl < Duration::from_secs(1) {
            return Err(format!("negative_cache.ttl: {:?} is too short; use at least 1s", nc.ttl));
        }
        if nc.max_entries == 0 || nc.max_entries > 10_000_000 {
            return Err(format!("negative_cache.max_entries: {} is out of range; use 1..=10000000", nc.max_entries));
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
        fn probe(symbol: &str, binary: Option<&str>) -> UprobeSpec {
            UprobeSpec { symbol: symbol.into(), binary: binary.map(Into::into) }
        }
        assert!(bad(|c| c.uprobes = vec![probe("", None)]).starts_with("uprobes[0].symbol"));
        assert!(bad(|c| c.uprobes = vec![probe("malloc", None), probe("a b", None)]).starts_with("uprobes[1].symbol"));
        assert!(bad(|c| c.uprobes = vec![probe("malloc@@GLIBC_2.2.5", None)]).contains("\"malloc\""));
        assert!(bad(|c| c.uprobes = vec![probe("malloc", Some(""))]).starts_with("uprobes[0].binary"));
        assert!(bad(|c| c.uprobes = vec![probe("malloc", Some("lib[c.so"))]).starts_with("uprobes[0].binary"));
        assert!(bad(|c| c.negative_cache.ttl = Duration::ZERO).starts_with("negative_cache.ttl"));
        assert!(bad(|c| c.negative_cache.max_entries = 0).starts_with("negative_cache.max_entries"));
    }

    #[test]
    fn uprobes_and_negative_cache_keys() {
        let c: EbpfConfig = serde_yaml::from_str(
            "uprobes: [{ symbol: malloc, binary: libc.so.6 }, { symbol: runtime.mallocgc }]\nnegative_cache: { ttl: 1m }",
        )
        .unwrap();
        assert_eq!(c.uprobes[0], UprobeSpec { symbol: "malloc".into(), binary: Some("libc.so.6".into()) });
        assert_eq!(c.uprobes[1].binary, None);
        assert_eq!(c.negative_cache, NegativeCacheConfig { ttl: Duration::from_secs(60), max_entries: 65_536 });
        let d = EbpfConfig::default();
        assert!(d.uprobes.is_empty());
        assert_eq!(d.negative_cache.ttl, Duration::from_secs(600));
        let e = serde_yaml::from_str::<EbpfConfig>("uprobes: [{ symbol: malloc, bin: x }]").unwrap_err().to_string();
        assert!(e.contains("unknown field"), "{e}");
        let back: EbpfConfig = serde_yaml::from_str(&serde_yaml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }
}
