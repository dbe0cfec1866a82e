//! `profcol-exporters`: the sinks.
//!
//! Each module is one exporter type; [`factories`] lists them for the host.

pub mod flamegraph;
pub mod group;
pub mod otlp;
pub mod output;
pub mod pprof;

pub mod debug;
pub mod file;

mod delivered;
mod file_names;
mod sample_attrs;
#[cfg(test)]
mod test_batches;

use profcol_api::component::Factory;
use std::sync::Arc;

/// Every exporter factory of this crate.
pub fn factories() -> Vec<Arc<dyn Factory>> {
    vec![
        file::factory_file(),
        debug::factory_debug(),
        otlp::grpc::factory_otlp(),
        otlp::grpc::factory_otlp_grpc(),
        otlp::http::factory_otlp_http(),
        pprof::factory_pprof(),
        flamegraph::factory_flamegraph(),
    ]
}
