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
    /// Unset: half a second of the largest records at `sample_frequency`
    /// from every online CPU, rounded up to a power of two, 256 KiB to
    /// 64 MiB (256 KiB on 2 CPUs at 99 Hz, 8 MiB on 64 CPUs at 99 Hz); with
    /// `count_in_kernel`, where only a stack's first sample is a record, a
    /// quarter of a second, from 128 KiB. The reader is woken when a quarter
    /// is used, so three eighths (three sixteenths) of a second of that
    /// worst case is left for it to answer (real records, with stacks
    /// shallower than the limit or counted in the kernel, come far slower).
    /// Its pages are resident: the kernel maps the data twice, so the
    /// agent's RSS holds twice this size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_buffer_size: Option<u32>,
    /// Functions whose calls are counted (empty: no uprobe machinery runs).
    pub uprobes: Vec<UprobeSpec>,
    /// Verdicts about binaries with nothing to attach.
    pub negative_cache: NegativeCacheConfig,
    /// Where each process's `service.name` comes from: sources tried in
    /// order, the first with a value wins: `executable` (the executable's
    /// name), `env:NAME` (the process's environment variable, e.g.
    /// `env:OTEL_SERVICE_NAME`), `container_label:KEY` (a label of its
    /// container, e.g. `container_label:com.docker.compose.service`),
    /// `k8s_container` (its Kubernetes container name), `k8s_label:KEY`
    /// (a label of its pod, where the runtime keeps them: CRI-O, Docker),
    /// `value:TEXT` (fixed). None: `unknown_service:<executable>`.
    #[schemars(with = "Vec<String>")]
    pub service_name: Vec<ServiceNameSource>,
    /// Attributes each sample carries: `thread.id`, `thread.name`,
    /// `cpu.logical_number`. Samples that differ only in an attribute left
    /// out merge (the same stack on two CPUs is one sample by default).
    pub sample_attributes: Vec<SampleAttribute>,
    /// How user stacks are walked.
    pub unwind: UnwindConfig,
    /// Count on-CPU samples per stack in the kernel and read the counts
    /// once per report: one record per distinct stack (while it recurs)
    /// instead of one per sample. Counted samples carry their count (`values`) but
    /// no timestamps of their own; samples with kernel frames outside the
    /// kernel's own text (BPF programs, modules), whose names may change
    /// while they are taken, and probe hits keep a record and timestamp
    /// each. Off by default (a record and a timestamp per sample); the
    /// node agent's default config turns it on (its pprof files keep no
    /// per-sample times anyway).
    pub count_in_kernel: bool,
    /// Distinct stacks counted in the kernel at once at most (kernel
    /// memory: ~28 bytes each up front, ~90 more per stack counted; past
    /// three quarters full the longest idle leave); samples of stacks
    /// beyond are records of their own.
    pub max_counted_stacks: u32,
    /// Interpreters whose frames are walked in the kernel and named:
    /// `python` (CPython 3.9 to 3.13, found in every process that maps
    /// one). An empty list turns interpreter frames off.
    pub interpreters: Vec<Interpreter>,
    /// JIT code (Node, Java, .NET, wasmtime): named from the perf maps the
    /// runtimes write.
    pub jit: crate::ebpf::jit::JitConfig,
    /// Which processes are sampled, decided in the kernel before any stack
    /// walk: `include` (empty: every process) and `exclude` lists of
    /// matchers on `cgroup_path`, `container_id`, `k8s_namespace`,
    /// `k8s_pod`, `k8s_container` and `executable` (globs; every key of a
    /// matcher must match). Needs the cgroup v2 hierarchy mounted (alone or
    /// beside v1). Samples left out count in
    /// `profcol_receiver_ebpf_samples_filtered_total`.
    pub targets: crate::ebpf::targets::TargetsConfig,
    /// A CPU budget for the agent, as a share of one CPU (`2%`): while the
    /// agent's CPU (every thread, plus its BPF programs' run time) is above
    /// it, the sampling frequency is lowered, and raised back while below,
    /// never above `sample_frequency`. Checked every 5 s; each change cuts
    /// the report there, so every profile's period is the one its samples
    /// were taken at. Unset: no budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cpu: Option<crate::ebpf::budget::CpuShare>,
    /// Off-CPU time: each wait of a sampled thread at least `threshold`
    /// long (default 1ms) is a sample of the `off_cpu` profile
    /// (`off_cpu/nanoseconds`), its value the time waited, its stacks the
    /// ones the thread left the CPU with, its `profcol.off_cpu.state` how
    /// it left (`sleeping`, `uninterruptible`, `runnable`: preempted),
    /// and what woke it (a sample of the waker's `wakeup` profile carrying
    /// the wait's `profcol.off_cpu.wakeup` number); `probability`
    /// (default 1) follows only that share of switches.
    /// Both are applied in the kernel before any stack walk. Unset: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off_cpu: Option<crate::ebpf::off_cpu::OffCpuConfig>,
}

/// One entry of `interpreters:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Interpreter {
    Python,
}

/// Bounds of `max_counted_stacks`.
pub(crate) const MIN_COUNTED_STACKS: u32 = 64;
pub(crate) const MAX_COUNTED_STACKS: u32 = 1 << 22;

/// `unwind:` section: user stacks from `.eh_frame` unwind tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UnwindConfig {
    /// `auto`: unwind tables where loaded, frame pointers elsewhere (a
    /// program's first samples, before its tables are built, mappings
    /// without `.eh_frame`, and profcol's own executable);
    /// `frame_pointers`: only the kernel's
    /// frame-pointer walk; `tables`: only tables (no table: the stack ends).
    pub mode: UnwindMode,
    /// Bytes of unwind tables loaded into the kernel at most (least
    /// recently used evicted beyond); the kernel holds what the loaded
    /// tables take, in 256 KiB chunks.
    pub max_table_bytes: u64,
}

/// `unwind.mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnwindMode {
    Auto,
    FramePointers,
    Tables,
}

/// Smallest and largest `unwind.max_table_bytes`.
pub(crate) const MIN_TABLE_BYTES: u64 = 1 << 16;
pub(crate) const MAX_TABLE_BYTES: u64 = 1 << 31;

impl Default for UnwindConfig {
    fn default() -> Self {
        UnwindConfig { mode: UnwindMode::Auto, max_table_bytes: 16 << 20 }
    }
}

pub use crate::ebpf::process::service_name::Source as ServiceNameSource;

/// One entry of `sample_attributes:` (OTel semantic conventions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SampleAttribute {
    #[serde(rename = "thread.id")]
    ThreadId,
    #[serde(rename = "thread.name")]
    ThreadName,
    #[serde(rename = "cpu.logical_number")]
    CpuLogicalNumber,
}

/// One entry of `uprobes:`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NegativeCacheConfig {
    /// How long a "nothing to attach" verdict is trusted while the file's
    /// size and mtime still match.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "DurationText")]
    pub ttl: Duration,
    /// Verdicts kept at most (oldest evicted first).
    pub max_entries: usize,
}

impl Default for NegativeCacheConfig {
    fn default() -> Self {
        NegativeCacheConfig { ttl: Duration::from_secs(600), max_entries: 65_536 }
    }
}

/// Bounds of the ring buffer's size when it is not set.
pub(crate) const AUTO_RING_MIN: u32 = 256 << 10;
pub(crate) const AUTO_RING_MAX: u32 = 64 << 20;
/// The floor with `count_in_kernel`: a whole `.ci/run` (19 minutes of both
/// CPUs compiling, thousands of new processes) at 99 Hz lost no record
/// with a 128 KiB ring (docs/PERFORMANCE.md).
pub(crate) const AUTO_COUNTED_RING_MIN: u32 = 128 << 10;

/// The exec/exit event ring: 16 KiB (~340 events) per online CPU, 64 KiB
/// to 1 MiB. Its reader is woken by the first event after it emptied it,
/// so the ring only has to hold the events of one wake-up's delay; its
/// pages are resident twice, as the sample ring's.
pub(crate) fn proc_event_ring_bytes(cpus: usize) -> u32 {
    ((cpus.max(1) as u64) * (16 << 10)).clamp(64 << 10, 1 << 20).next_power_of_two() as u32
}

impl EbpfConfig {
    /// The ring buffer's size in bytes on a host with `cpus` online CPUs:
    /// `ring_buffer_size` if set, else half a second of full-depth records
    /// (a quarter with `count_in_kernel`).
    pub(crate) fn ring_bytes(&self, cpus: usize) -> u32 {
        if let Some(size) = self.ring_buffer_size {
            return size;
        }
        // A record: its 8-byte ring header, the sample header, both stacks
        // and the spare slot. Interpreter frames (up to 1.5 KiB more) are
        // left out: only a Python process's records carry them, and a
        // burst of full native stacks is the worst case sized for.
        let record = 8 + profcol_ebpf::record::SAMPLE_HEADER_SIZE as u64 + (2 * self.max_stack_depth as u64 + 1) * 8;
        let second = (cpus.max(1) as u64).saturating_mul(self.sample_frequency).saturating_mul(record);
        let (part, min) = if self.count_in_kernel { (4, AUTO_COUNTED_RING_MIN) } else { (2, AUTO_RING_MIN) };
        (second / part).clamp(min as u64, AUTO_RING_MAX as u64).next_power_of_two() as u32
    }
}

/// Most probes one receiver may configure.
pub(crate) const MAX_UPROBES: usize = 256;

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            sample_frequency: 19,
            report_interval: Duration::from_secs(5),
            pids: Vec::new(),
            exclude_idle: true,
            max_stack_depth: MAX_STACK_DEPTH,
            ring_buffer_size: None,
            uprobes: Vec::new(),
            negative_cache: NegativeCacheConfig::default(),
            service_name: vec![ServiceNameSource::Executable],
            sample_attributes: vec![SampleAttribute::ThreadId, SampleAttribute::ThreadName],
            unwind: UnwindConfig::default(),
            count_in_kernel: false,
            max_counted_stacks: 16_384,
            interpreters: vec![Interpreter::Python],
            jit: Default::default(),
            targets: Default::default(),
            max_cpu: None,
            off_cpu: None,
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
        let page = profcol_ebpf::sys::page_size() as u64;
        if let Some(size) = self.ring_buffer_size {
            if !size.is_power_of_two() || (size as u64) < page {
                p.add("ring_buffer_size", format!("{size} must be a power of two and at least the page size ({page})"));
            }
        }
        if !(MIN_COUNTED_STACKS..=MAX_COUNTED_STACKS).contains(&self.max_counted_stacks) {
            p.add(
                "max_counted_stacks",
                format!("{} is out of range; use {MIN_COUNTED_STACKS}..={MAX_COUNTED_STACKS}", self.max_counted_stacks),
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
        if self.uprobes.len() > MAX_UPROBES {
            p.add("uprobes", format!("{} entries; at most {MAX_UPROBES} are supported", self.uprobes.len()));
        }
        for (i, probe) in self.uprobes.iter().enumerate() {
            if probe.symbol.is_empty() || probe.symbol.chars().any(|c| c.is_whitespace() || c.is_control()) {
                p.add(
                    &format!("uprobes[{i}].symbol"),
                    format!("{:?} is not a symbol name (no spaces, not empty)", probe.symbol),
                );
            }
            if probe.symbol.contains('@') {
                p.add(
                    &format!("uprobes[{i}].symbol"),
                    format!(
                        "{:?}: give the plain name ({:?}); versioned names in binaries match it",
                        probe.symbol,
                        probe.symbol.split('@').next().unwrap_or_default()
                    ),
                );
            }
            if let Some(b) = &probe.binary {
                if let Err(m) = super::uprobes::matcher::BinaryPattern::parse(b) {
                    p.add(&format!("uprobes[{i}].binary"), m);
                }
            }
        }
        for (at, message) in self.targets.problems() {
            p.add(&at, message);
        }
        for (at, message) in self.off_cpu.iter().flat_map(|o| o.problems()) {
            p.add(&at, message);
        }
        if self.service_name.is_empty() {
            p.add(
                "service_name",
                "empty: every process would be `unknown_service`; list at least one source (default [executable])",
            );
        }
        let t = self.unwind.max_table_bytes;
        if !(MIN_TABLE_BYTES..=MAX_TABLE_BYTES).contains(&t) {
            p.add(
                "unwind.max_table_bytes",
                format!("{t} is out of range; use {MIN_TABLE_BYTES}..={MAX_TABLE_BYTES} bytes (64 KiB to 2 GiB)"),
            );
        }
        let nc = &self.negative_cache;
        if nc.ttl < Duration::from_secs(1) {
            p.add("negative_cache.ttl", format!("{:?} is too short; use at least 1s", nc.ttl));
        }
        if nc.max_entries == 0 || nc.max_entries > 10_000_000 {
            p.add("negative_cache.max_entries", format!("{} is out of range; use 1..=10000000", nc.max_entries));
        }
    }
}

impl EbpfConfig {
    /// Sampling period in nanoseconds: 1e9 / sample_frequency.
    pub(crate) fn period_ns(&self) -> i64 {
        1_000_000_000 / self.sample_frequency.max(1) as i64
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
        assert!(bad(|c| c.ring_buffer_size = Some(5000)).starts_with("ring_buffer_size"));
        assert!(bad(|c| c.max_counted_stacks = 10).starts_with("max_counted_stacks"));
        assert!(bad(|c| c.max_counted_stacks = u32::MAX).starts_with("max_counted_stacks"));
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
        assert!(bad(|c| c.unwind.max_table_bytes = 10).starts_with("unwind.max_table_bytes: 10 is out of range"));
    }

    #[test]
    fn unwind_keys() {
        let d = EbpfConfig::default();
        assert_eq!(d.unwind, UnwindConfig { mode: UnwindMode::Auto, max_table_bytes: 16 << 20 });
        let c: EbpfConfig =
            parse_section("unwind: { mode: frame_pointers, max_table_bytes: 1048576 }").unwrap().decode().unwrap();
        assert_eq!(c.unwind, UnwindConfig { mode: UnwindMode::FramePointers, max_table_bytes: 1 << 20 });
        let e = parse_section("unwind: { mode: dwarf }").unwrap().decode::<EbpfConfig>().unwrap_err().to_string();
        assert!(e.contains("frame_pointers"), "{e}");
        let back: EbpfConfig = profcol_api::config::encode(&c).unwrap().decode().unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn service_name_sources_and_sample_attributes() {
        let d = EbpfConfig::default();
        assert_eq!(d.service_name, vec![ServiceNameSource::Executable]);
        assert_eq!(d.sample_attributes, vec![SampleAttribute::ThreadId, SampleAttribute::ThreadName]);
        let c: EbpfConfig = parse_section(
            "service_name: [env:OTEL_SERVICE_NAME, container_label:app, value:shop]\n\
             sample_attributes: [thread.name, cpu.logical_number]",
        )
        .unwrap()
        .decode()
        .unwrap();
        assert_eq!(
            c.service_name,
            vec![
                ServiceNameSource::Env("OTEL_SERVICE_NAME".into()),
                ServiceNameSource::ContainerLabel("app".into()),
                ServiceNameSource::Value("shop".into())
            ]
        );
        assert_eq!(c.sample_attributes, vec![SampleAttribute::ThreadName, SampleAttribute::CpuLogicalNumber]);
        let back: EbpfConfig = profcol_api::config::encode(&c).unwrap().decode().unwrap();
        assert_eq!(back, c);
        let e = parse_section("service_name: [executable, pod]").unwrap().decode::<EbpfConfig>().unwrap_err();
        assert!(e.to_string().contains("service_name[1]") && e.to_string().contains("`env:NAME`"), "{e}");
        let e = parse_section("sample_attributes: [cpu]").unwrap().decode::<EbpfConfig>().unwrap_err();
        assert!(e.to_string().contains("cpu.logical_number"), "{e}");
        let mut empty = EbpfConfig::default();
        empty.service_name.clear();
        assert!(problems(&empty).join(";").starts_with("service_name: empty"));
    }

    #[test]
    fn uprobes_and_negative_cache_keys() {
        let c: EbpfConfig = parse_section(
            "uprobes: [{ symbol: malloc, binary: libc.so.6 }, { symbol: runtime.mallocgc }]\nnegative_cache: { ttl: 1m }",
        )
        .unwrap()
        .decode()
        .unwrap();
        assert_eq!(c.uprobes[0], UprobeSpec { symbol: "malloc".into(), binary: Some("libc.so.6".into()) });
        assert_eq!(c.uprobes[1].binary, None);
        assert_eq!(c.negative_cache, NegativeCacheConfig { ttl: Duration::from_secs(60), max_entries: 65_536 });
        let d = EbpfConfig::default();
        assert!(d.uprobes.is_empty());
        assert_eq!(d.negative_cache.ttl, Duration::from_secs(600));
        let e = parse_section("uprobes: [{ symbol: malloc, bin: x }]")
            .unwrap()
            .decode::<EbpfConfig>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field"), "{e}");
        let back: EbpfConfig = profcol_api::config::encode(&c).unwrap().decode().unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn ring_sized_from_cpus_and_frequency_unless_set() {
        let mut c = EbpfConfig::default();
        // Half a second of 2 CPUs x 19 Hz x 2,104-byte records = 40 KB: the floor.
        assert_eq!(c.ring_bytes(2), 256 << 10);
        c.sample_frequency = 99;
        // 2 x 99 x 2,104 / 2 = 208,296 B: the floor still.
        assert_eq!(c.ring_bytes(2), 256 << 10);
        // 8 x 99 x 2,104 / 2 = 833 KB, rounded up.
        assert_eq!(c.ring_bytes(8), 1 << 20);
        // 64 x 99 x 2,104 / 2 = 6.7 MB.
        assert_eq!(c.ring_bytes(64), 8 << 20);
        c.sample_frequency = 1000;
        assert_eq!(c.ring_bytes(4096), AUTO_RING_MAX);
        // Shallow stacks make small records: 256 x 99 x 88 B / 2 = 1.1 MB.
        c.max_stack_depth = 1;
        c.sample_frequency = 99;
        assert_eq!(c.ring_bytes(256), 2 << 20);
        assert_eq!(c.ring_bytes(2), AUTO_RING_MIN);
        c.ring_buffer_size = Some(4096);
        assert_eq!(c.ring_bytes(64), 4096);
    }

    #[test]
    fn counted_in_kernel_the_ring_is_a_quarter_second_from_128_kib() {
        let mut c = EbpfConfig { sample_frequency: 99, count_in_kernel: true, ..EbpfConfig::default() };
        // 2 x 99 x 2,104 / 4 = 104 KB: the floor.
        assert_eq!(c.ring_bytes(2), AUTO_COUNTED_RING_MIN);
        // 8 x 99 x 2,104 / 4 = 417 KB, rounded up: half the sample mode's 1 MiB.
        assert_eq!(c.ring_bytes(8), 512 << 10);
        assert_eq!(c.ring_bytes(64), 4 << 20);
        c.ring_buffer_size = Some(1 << 20);
        assert_eq!(c.ring_bytes(2), 1 << 20);
    }

    #[test]
    fn process_event_ring_scales_with_cpus_within_bounds() {
        assert_eq!(proc_event_ring_bytes(0), 64 << 10);
        assert_eq!(proc_event_ring_bytes(2), 64 << 10);
        assert_eq!(proc_event_ring_bytes(16), 256 << 10);
        assert_eq!(proc_event_ring_bytes(24), 512 << 10);
        assert_eq!(proc_event_ring_bytes(64), 1 << 20);
        assert_eq!(proc_event_ring_bytes(4096), 1 << 20);
    }
}
