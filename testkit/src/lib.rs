//! `profcol-testkit`: what profcol's test suites and benches share, in one
//! place (a dev-dependency only; nothing here ships).
//!
//! - [`batch`]: deterministic batches shaped like the eBPF receiver's;
//! - [`config`]: pieces of the YAML configs tests hand to profcol;
//! - [`floor`]: the busy-node batch and the decode + encode floor gateway benches compare with;
//! - [`sink`]: a consumer that collects what a receiver pushes;
//! - [`raw`]: OTLP requests sent as raw bytes over gRPC and HTTP;
//! - [`hostile`]: expansion requests, gzip bombs, stalled HTTP/1.1 and gRPC bodies;
//! - [`net`]: loopback listeners handed over already bound (no port races);
//! - [`log`]: the process's own log captured, to read bound addresses;
//! - [`plugins`]: WebAssembly plugins (plugins/testdata, examples/plugins), built on demand;
//! - [`alloc`]: a global allocator that counts live heap bytes;
//! - [`py_otlp`]: the OTLP server on the official Python stack;
//! - [`workload`]: profiled child processes started on cue;
//! - [`tools`]: external tools that must be there under CI=true;
//! - [`pprof_raw`]: pprof files read through `go tool pprof -raw`;
//! - [`otlp_file`]: the `file` exporter's OTLP JSON, each location's functions and frame type.

pub mod alloc;
pub mod batch;
pub mod config;
pub mod floor;
pub mod hostile;
pub mod log;
pub mod net;
pub mod otlp_file;
pub mod plugins;
pub mod pprof_raw;
pub mod py_otlp;
pub mod raw;
pub mod sink;
pub mod tools;
pub mod workload;

use profcol_api::component::{ComponentId, CreateSettings, Kind};
use profcol_api::telemetry::ComponentTelemetry;

/// Settings for a component created outside a host (detached telemetry).
pub fn settings(kind: Kind, id: &str) -> CreateSettings {
    let id: ComponentId = id.parse().expect("a valid component id");
    CreateSettings { telemetry: ComponentTelemetry::detached(kind, &id), id, services: Default::default() }
}

/// What most test files use, in one `use profcol_testkit::prelude::*;`.
pub mod prelude {
    pub use crate::batch::{cpu_batch, every_field_batch, i, kv, merge, random_batch, s};
    pub use crate::net::{closed_port, listener, tokio_listener};
    pub use crate::plugins::{example_plugin, test_plugin};
    pub use crate::settings;
    pub use crate::sink::Collector;
    pub use crate::tools::{in_ci, require, require_root, tool_available};
}
