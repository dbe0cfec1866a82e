//! `profcol-receivers`: the sources of batches.
//!
//! Each module is one receiver type; [`factories`] lists them for the host.

pub mod ebpf;
pub mod file;
pub mod otlp;

use profcol_api::component::Factory;
use std::sync::Arc;

/// Every receiver factory of this crate.
pub fn factories() -> Vec<Arc<dyn Factory>> {
    vec![ebpf::factory(), file::factory_file(), otlp::factory_otlp()]
}
