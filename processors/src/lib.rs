//! `profcol-processors`: batch transformers.
//!
//! Each module is one processor type; [`factories`] lists them for the host.

pub mod batch;
pub mod kernel_symbols;
pub mod resource;
pub mod user_symbols;

use profcol_api::component::Factory;
use std::sync::Arc;

/// Every processor factory of this crate.
pub fn factories() -> Vec<Arc<dyn Factory>> {
    vec![batch::factory_batch(), kernel_symbols::factory(), user_symbols::factory(), resource::factory()]
}
