//! The typed `service` section.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub(crate) use crate::telemetry::TelemetryConfig;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// Extension ids to start.
    pub extensions: Vec<String>,
    /// `profiles[/name]` → pipeline.
    pub pipelines: BTreeMap<String, PipelineConfig>,
    pub telemetry: TelemetryConfig,
    /// How long a clean shutdown may take to drain in-flight batches.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub shutdown_timeout: Duration,
    /// WebAssembly plugins (`wasm` processors and exporters).
    pub plugins: PluginsConfig,
    /// Threads and heap of the process (read at start; a reload keeps them).
    pub runtime: RuntimeConfig,
}

/// `service.runtime`: how many threads run the pipelines and how many heaps
/// they allocate from. The defaults suit a gateway; a node agent, which
/// moves a few batches a minute, needs one of each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Async worker threads (receivers' servers, processors, exporters);
    /// default one per CPU. Threads of their own (the ebpf sampler, table
    /// builds) are not counted.
    pub worker_threads: Option<usize>,
    /// glibc malloc arenas at most (`M_ARENA_MAX`); default glibc's, 8 per
    /// CPU. Each thread that allocates may get an arena of its own, which
    /// keeps freed memory for that thread: fewer arenas, less resident
    /// memory, more contention between allocating threads.
    pub malloc_arenas: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsConfig {
    /// Where compiled plugins are cached (mode 0700, only profcol writes it);
    /// default `$XDG_CACHE_HOME/profcol/plugins`, else `~/.cache/profcol/plugins`.
    /// Where none is writable, plugins are compiled in memory at every start.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Write `/tmp/perf-<pid>.map` lines for every plugin function wasmtime
    /// compiles or loads, so profilers (profcol profiling itself, `perf`) name
    /// plugin frames. Off by default: the file grows with every plugin loaded
    /// and stays in /tmp. Read when the first plugin loads; a change waits for
    /// the next start.
    pub perf_map: bool,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            extensions: vec![],
            pipelines: BTreeMap::new(),
            telemetry: TelemetryConfig::default(),
            shutdown_timeout: Duration::from_secs(10),
            plugins: PluginsConfig::default(),
            runtime: RuntimeConfig::default(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    pub receivers: Vec<String>,
    pub processors: Vec<String>,
    pub exporters: Vec<String>,
}
