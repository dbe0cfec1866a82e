//! Extensions: host-level components outside pipelines.

mod health_check;

use profcol_api::component::Factory;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether every pipeline runs (what health_check reports).
#[derive(Clone, Default)]
pub struct HostStatus(Arc<AtomicBool>);

impl HostStatus {
    pub fn set_running(&self, v: bool) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn running(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

pub fn factories(host: &HostStatus) -> Vec<Arc<dyn Factory>> {
    vec![health_check::factory(host.clone())]
}
