//! `profcol-processors`: batch transformers.
//!
//! Each module is one processor type; [`factories`] lists them for the host.

use profcol_api::component::Factory;
use std::sync::Arc;

/// Every processor factory of this crate.
pub fn factories() -> Vec<Arc<dyn Factory>> {
    vec![]
}
