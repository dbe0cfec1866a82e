//! One pipeline at run time: its input channel, its processors in order, and
//! the fan-out to its exporters' queues.
//!
//! A receiver's `consume` returns only once its batch has gone through the
//! processors and into every exporter's queue (on disk, for an exporter with
//! a persistent queue), so an acknowledgement upstream means "queued", and a
//! persistent queue that cannot take the batch is reported back to the
//! receiver (which tells its sender to retry) instead of being lost.

use crate::exporter_helper::ExporterHandle;
use async_trait::async_trait;
use profcol_api::component::{ConsumeError, Consumer};
use profcol_api::{ComponentId, Processor, Profiles};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// Batches waiting at a pipeline's input: small, so receivers feel backpressure.
pub const INPUT_CAPACITY: usize = 8;

/// A batch at a pipeline's input and where to say what became of it.
pub type Input = (Profiles, oneshot::Sender<Result<(), ConsumeError>>);

/// The input end of a pipeline; receivers' [`profcol_api::Next`] point here.
pub struct PipelineInput {
    pub tx: mpsc::Sender<Input>,
}

#[async_trait]
impl Consumer for PipelineInput {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        let (ack, done) = oneshot::channel();
        self.tx.send((batch, ack)).await.map_err(|_| ConsumeError::Closed)?;
        // The pipeline task owns the batch now; if it is torn down before it
        // answers, the batch did not reach the exporters.
        done.await.unwrap_or(Err(ConsumeError::Closed))
    }
}

pub struct PipelineParts {
    pub name: String,
    pub processors: Vec<(ComponentId, Arc<dyn Processor>)>,
    pub exporters: Vec<Arc<ExporterHandle>>,
}

/// Runs until every sender of `rx` is gone, then flushes held-back batches
/// through the rest of the pipeline and returns.
pub async fn run(parts: PipelineParts, mut rx: mpsc::Receiver<Input>) {
    let flush_every = parts.processors.iter().filter_map(|(_, p)| p.flush_interval()).min();
    let mut ticker = tokio::time::interval(flush_every.unwrap_or(Duration::from_secs(3600)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            batch = rx.recv() => match batch {
                Some((b, ack)) => {
                    // The receiver may have stopped waiting (its own timeout); the batch is queued regardless.
                    let _ = ack.send(process_from(&parts, 0, b).await);
                }
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
            Ok(Some(b)) => {
                if let Err(e) = process_from(parts, i + 1, b).await {
                    warn!(pipeline = %parts.name, processor = %id, error = %e, "a flushed batch was refused");
                }
            }
            Ok(None) => {}
            Err(e) => warn!(pipeline = %parts.name, processor = %id, error = %e, "flush failed"),
        }
    }
}

/// Runs `batch` through the processors from `start` on and into every
/// exporter's queue. A processor that fails drops the batch with a warning
/// (a retry would fail the same way); an exporter whose persistent queue
/// cannot take it makes the whole batch refused, so the sender retries.
async fn process_from(parts: &PipelineParts, start: usize, mut batch: Profiles) -> Result<(), ConsumeError> {
    for (id, p) in &parts.processors[start..] {
        let n = batch.sample_count();
        match p.process(batch).await {
            Ok(Some(b)) => batch = b,
            Ok(None) => return Ok(()),
            Err(e) => {
                warn!(pipeline = %parts.name, processor = %id, samples = n, error = %e, "processor failed; batch dropped");
                return Ok(());
            }
        }
    }
    if batch.is_empty() {
        return Ok(());
    }
    let batch = Arc::new(batch);
    let mut refused = Vec::new();
    for e in &parts.exporters {
        if let Err(why) = e.enqueue(Arc::clone(&batch)).await {
            refused.push(why);
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(ConsumeError::Refused(refused.join("; ")))
    }
}
