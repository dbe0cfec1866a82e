//! One pipeline at run time: its input channel, its processors in order, and
//! the fan-out to its exporters' queues.

use crate::exporter_helper::ExporterHandle;
use async_trait::async_trait;
use profcol_api::component::{ConsumeError, Consumer};
use profcol_api::{ComponentId, Processor, Profiles};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::warn;

/// Batches waiting at a pipeline's input: small, so receivers feel backpressure.
pub const INPUT_CAPACITY: usize = 8;

/// The input end of a pipeline; receivers' [`profcol_api::Next`] point here.
pub struct PipelineInput {
    pub tx: mpsc::Sender<Profiles>,
}

#[async_trait]
impl Consumer for PipelineInput {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        self.tx.send(batch).await.map_err(|_| ConsumeError::Closed)
    }
}

pub struct PipelineParts {
    pub name: String,
    pub processors: Vec<(ComponentId, Arc<dyn Processor>)>,
    pub exporters: Vec<Arc<ExporterHandle>>,
}

/// Runs until every sender of `rx` is gone, then flushes held-back batches
/// through the rest of the pipeline and returns.
pub async fn run(parts: PipelineParts, mut rx: mpsc::Receiver<Profiles>) {
    let flush_every = parts.processors.iter().filter_map(|(_, p)| p.flush_interval()).min();
    let mut ticker = tokio::time::interval(flush_every.unwrap_or(Duration::from_secs(3600)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            batch = rx.recv() => match batch {
                Some(b) => process_from(&parts, 0, b).await,
                None => break,
            },
            _ = ticker.tick(), if flush_every.is_some() => flush(&parts).await,
        }
    }
    flush(&parts).await;
}

/// Each processor's held-back batch goes through the processors after it.
async fn flush(parts: &PipelineParts) {
    for (i, (id, p)) in parts.processors.iter().enumerate() {
        match p.flush().await {
            Ok(Some(b)) => process_from(parts, i + 1, b).await,
            Ok(None) => {}
            Err(e) => warn!(pipeline = %parts.name, processor = %id, error = %e, "flush failed"),
        }
    }
}

async fn process_from(parts: &PipelineParts, start: usize, mut batch: Profiles) {
    for (id, p) in &parts.processors[start..] {
        let n = batch.sample_count();
        match p.process(batch).await {
            Ok(Some(b)) => batch = b,
            Ok(None) => return,
            Err(e) => {
                warn!(pipeline = %parts.name, processor = %id, samples = n, error = %e, "processor failed; batch dropped");
                return;
            }
        }
    }
    if batch.is_empty() {
        return;
    }
    let batch = Arc::new(batch);
    for e in &parts.exporters {
        e.enqueue(Arc::clone(&batch)).await;
    }
}
