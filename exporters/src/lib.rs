//! `profcol-exporters`: the sinks.
//!
//! Each module is one exporter type; [`factories`] lists them for the host.

use profcol_api::component::Factory;
use std::sync::Arc;

/// Every exporter factory of this crate.
pub fn factories() -> Vec<Arc<dyn Factory>> {
    vec![]
}
