//! One pipeline at run time: its input channel, its processors in order, and
//! the fan-out to its exporters' queues.
//!
//! A receiver's `consume` returns only once its batch has gone through the
//! processors and into every exporter's queue (on disk, for an exporter with
//! a persistent queue), so an acknowledgement upstream means "queued", and a
//! persistent queue that cannot take the batch is reported back to the
//! receiver (which tells its sender to retry) instead of being lost. In a
//! pipeline with a persistent exporter, a batch a processor holds back (the
//! batch processor) is acknowledged when the batch that carries it is
//! queued, so "acknowledged" still means "on disk".

use crate::exporter_helper::ExporterHandle;
use async_trait::async_trait;
use profcol_api::component::{ConsumeError, Consumer};
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{ComponentId, ProcessOutcome, Processor, Profiles};
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

/// One processor of a pipeline, with the counters the host keeps for it.
pub struct PipelineProcessor {
    pub id: ComponentId,
    pub instance: Arc<dyn Processor>,
    /// incoming / outgoing / dropped / refused samples, labelled by id.
    pub telemetry: ComponentTelemetry,
}

pub struct PipelineParts {
    pub name: String,
    pub processors: Vec<PipelineProcessor>,
    pub exporters: Vec<Arc<ExporterHandle>>,
}

type Ack = oneshot::Sender<Result<(), ConsumeError>>;

/// Acknowledgements waiting for a batch a processor holds (batching): with a
/// persistent exporter in the pipeline, a receiver hears "queued" only once
/// its batch is on disk, so the acks travel with the batch that contains it.
struct Held {
    /// Per processor, the acks of the batches it absorbed and has not yet let go.
    acks: Vec<Vec<Ack>>,
    /// Whether acks wait for held batches (some exporter has a persistent queue).
    durable: bool,
}

/// Runs until every sender of `rx` is gone, then flushes held-back batches
/// through the rest of the pipeline and returns.
pub async fn run(parts: PipelineParts, mut rx: mpsc::Receiver<Input>) {
    let flush_every = parts.processors.iter().filter_map(|p| p.instance.flush_interval()).min();
    let mut ticker = tokio::time::interval(flush_every.unwrap_or(Duration::from_secs(3600)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut held = Held {
        acks: parts.processors.iter().map(|_| Vec::new()).collect(),
        durable: parts.exporters.iter().any(|e| e.is_persistent()),
    };
    loop {
        tokio::select! {
            batch = rx.recv() => match batch {
                Some((b, ack)) => process_from(&parts, &mut held, 0, b, vec![ack]).await,
                None => break,
            },
            _ = ticker.tick(), if flush_every.is_some() => flush(&parts, &mut held).await,
        }
    }
    flush(&parts, &mut held).await;
}

/// Each processor's held-back batch goes through the processors after it.
async fn flush(parts: &PipelineParts, held: &mut Held) {
    for (i, p) in parts.processors.iter().enumerate() {
        let acks = std::mem::take(&mut held.acks[i]);
        match p.instance.flush().await {
            Ok(Some(b)) => {
                p.telemetry.outgoing.add(b.sample_count() as u64);
                process_from(parts, held, i + 1, b, acks).await
            }
            Ok(None) => answer(acks, Ok(())),
            Err(e) => {
                // What it held is lost; its senders were already told OK
                // (in-memory pipelines) or still wait (durable ones).
                warn!(pipeline = %parts.name, processor = %p.id, error = %e, "flush failed; held samples lost");
                answer(acks, Err(ConsumeError::Rejected(format!("processor {}: {e}", p.id))));
            }
        }
    }
}

/// Tells each waiting receiver what became of its batch. A receiver may have
/// stopped waiting (its own timeout); the batch went its way regardless.
fn answer(acks: Vec<Ack>, result: Result<(), ConsumeError>) {
    for a in acks {
        let _ = a.send(result.clone());
    }
}

/// Runs `batch` through the processors from `start` on and into every
/// exporter's queue, then answers `acks`. Each processor says what it did:
/// forwarded (on to the next), held (its flush carries the batch later: in a
/// durable pipeline the acks wait for that flush, else they are answered
/// now), dropped (the sender is told OK: the drop was deliberate) or refused
/// (an error: the sender hears it and may retry). An exporter whose
/// persistent queue cannot take the batch makes it refused as well.
async fn process_from(parts: &PipelineParts, held: &mut Held, start: usize, mut batch: Profiles, mut acks: Vec<Ack>) {
    for (i, p) in parts.processors.iter().enumerate().skip(start) {
        let n = batch.sample_count() as u64;
        p.telemetry.incoming.add(n);
        match p.instance.process(batch).await {
            Ok(ProcessOutcome::Forward(b)) => {
                p.telemetry.outgoing.add(b.sample_count() as u64);
                batch = b;
                // What the processor held went out with this batch.
                acks.append(&mut held.acks[i]);
            }
            Ok(ProcessOutcome::Held) if p.instance.flush_interval().is_none() => {
                // A processor that never flushes cannot hold: the batch would vanish.
                warn!(pipeline = %parts.name, processor = %p.id, samples = n,
                    "processor held a batch but has no flush interval; counted as dropped");
                p.telemetry.dropped.add(n);
                return answer(acks, Ok(()));
            }
            Ok(ProcessOutcome::Held) if held.durable => return held.acks[i].append(&mut acks),
            Ok(ProcessOutcome::Held) => return answer(acks, Ok(())),
            Ok(ProcessOutcome::Dropped { reason, samples }) => {
                tracing::debug!(pipeline = %parts.name, processor = %p.id, samples, %reason, "batch dropped");
                p.telemetry.dropped.add(samples);
                return answer(acks, Ok(()));
            }
            Err(e) => {
                warn!(pipeline = %parts.name, processor = %p.id, samples = n, error = %e, "processor refused the batch");
                p.telemetry.refused.add(n);
                let e = match ConsumeError::from(e) {
                    ConsumeError::Refused(m) => ConsumeError::Refused(format!("processor {}: {m}", p.id)),
                    ConsumeError::Rejected(m) => ConsumeError::Rejected(format!("processor {}: {m}", p.id)),
                    other => other,
                };
                return answer(acks, Err(e));
            }
        }
    }
    if batch.is_empty() {
        return answer(acks, Ok(()));
    }
    let batch = Arc::new(batch);
    let mut refused = Vec::new();
    for e in &parts.exporters {
        if let Err(why) = e.enqueue(Arc::clone(&batch)).await {
            refused.push(why);
        }
    }
    if refused.is_empty() {
        answer(acks, Ok(()));
    } else {
        let why = refused.join("; ");
        if acks.is_empty() {
            warn!(pipeline = %parts.name, error = %why, "a flushed batch was refused");
        }
        answer(acks, Err(ConsumeError::Refused(why)));
    }
}
