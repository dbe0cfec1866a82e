//! A consumer that collects every batch a receiver pushes.

use profcol_api::component::{ComponentId, ConsumeError, Consumer, Kind, Next};
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{Profiles, ProfilesBuilder};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Collects every batch it is given.
#[derive(Default)]
pub struct Collector {
    pub batches: Mutex<Vec<Profiles>>,
    /// While set, consume() waits (simulates a full pipeline).
    pub stall: AtomicBool,
}

#[async_trait::async_trait]
impl Consumer for Collector {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        while self.stall.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Tests read `.0`: samples in their profiles.
        self.batches.lock().unwrap_or_else(|p| p.into_inner()).push(batch.into_unpacked());
        Ok(())
    }
}

impl Collector {
    /// A receiver's handle pushing into this collector.
    pub fn next(self: &Arc<Self>) -> Next {
        next_to(self.clone())
    }

    pub fn sample_count(&self) -> usize {
        self.batches.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|b| b.sample_count()).sum()
    }

    /// Waits until `n` samples arrived (or panics after `timeout`).
    pub async fn wait_for(&self, n: usize, timeout: Duration) {
        let t = std::time::Instant::now();
        while self.sample_count() < n {
            assert!(t.elapsed() < timeout, "only {} of {n} samples arrived within {timeout:?}", self.sample_count());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every collected batch merged into one.
    pub fn merged(&self) -> Profiles {
        let mut b = ProfilesBuilder::new();
        for p in self.batches.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            b.append(p.clone());
        }
        b.build()
    }
}

/// A receiver's `Next` that hands every batch to `consumer` (detached telemetry).
pub fn next_to(consumer: Arc<dyn Consumer>) -> Next {
    let id: ComponentId = "otlp/test".parse().expect("a valid id");
    Next::new(vec![consumer], ComponentTelemetry::detached(Kind::Receiver, &id))
}
