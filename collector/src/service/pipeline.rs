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

use super::batch_trace::{self, BatchTrace};
use crate::exporter_helper::ExporterHandle;
use async_trait::async_trait;
use opentelemetry::KeyValue;
use profcol_api::component::{ConsumeError, Consumer};
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{ComponentId, ProcessOutcome, Processor, Profiles};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

/// Batches waiting at a pipeline's input: small, so receivers feel backpressure.
pub(super) const INPUT_CAPACITY: usize = 8;

/// A batch at a pipeline's input, where to say what became of it, and (with
/// batch tracing on) when the receiver handed it over.
pub(super) type Input = (Profiles, oneshot::Sender<Result<(), ConsumeError>>, Option<SystemTime>);

/// The input end of a pipeline; receivers' [`profcol_api::Next`] point here.
pub(super) struct PipelineInput {
    pub tx: mpsc::Sender<Input>,
}

#[async_trait]
impl Consumer for PipelineInput {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        let (ack, done) = oneshot::channel();
        let since = batch_trace::enabled().then(SystemTime::now);
        self.tx.send((batch, ack, since)).await.map_err(|_| ConsumeError::Closed)?;
        // The pipeline task owns the batch now; if it is torn down before it
        // answers, the batch did not reach the exporters.
        done.await.unwrap_or(Err(ConsumeError::Closed))
    }
}

/// One processor of a pipeline, with the counters the host keeps for it.
pub(super) struct PipelineProcessor {
    pub id: ComponentId,
    pub instance: Arc<dyn Processor>,
    /// incoming / outgoing / dropped / refused samples, labelled by id.
    pub telemetry: ComponentTelemetry,
    /// Batches it dropped (`profcol_processor_dropped_batches_total`).
    pub dropped_batches: profcol_api::telemetry::Counter,
}

pub(super) struct PipelineParts {
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
pub(super) async fn run(parts: PipelineParts, mut rx: mpsc::Receiver<Input>) {
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
                Some((b, ack, since)) => {
                    let n = b.sample_count() as u64;
                    let trace = since.and_then(|t| BatchTrace::start(&parts.name, t, n, false));
                    process_from(&parts, &mut held, 0, b, n, vec![ack], trace).await
                }
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
                let n = b.sample_count() as u64;
                p.telemetry.outgoing.add(n);
                let trace = BatchTrace::start(&parts.name, SystemTime::now(), n, true);
                process_from(parts, held, i + 1, b, n, acks, trace).await
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

/// Runs `batch` (of `n` samples, its [`Profiles::sample_count`]) through
/// the processors from `start` on and into every exporter's queue, then
/// answers `acks`. Each processor says what it did:
/// forwarded (on to the next), held (its flush carries the batch later: in a
/// durable pipeline the acks wait for that flush, else they are answered
/// now), dropped (the sender is told OK: the drop was deliberate) or refused
/// (an error: the sender hears it and may retry). An exporter whose
/// persistent queue cannot take the batch makes it refused as well.
async fn process_from(
    parts: &PipelineParts,
    held: &mut Held,
    start: usize,
    batch: Profiles,
    n: u64,
    acks: Vec<Ack>,
    trace: Option<BatchTrace>,
) {
    let outcome = process_traced(parts, held, start, batch, n, acks, trace.as_ref()).await;
    if let Some(t) = trace {
        t.end(outcome);
    }
}

/// [`process_from`]'s work; returns what became of the batch (the root span's `profcol.outcome`).
async fn process_traced(
    parts: &PipelineParts,
    held: &mut Held,
    start: usize,
    mut batch: Profiles,
    mut n: u64,
    mut acks: Vec<Ack>,
    trace: Option<&BatchTrace>,
) -> &'static str {
    // `n` is counted once by the caller and again only after each
    // processor that forwards: a count walks every sample, each
    // processor's incoming is the outgoing before it, and the exporters'
    // queues take it from here.
    for (i, p) in parts.processors.iter().enumerate().skip(start) {
        p.telemetry.incoming.add(n);
        let t0 = trace.map(|_| SystemTime::now());
        if !p.instance.reads_packed() {
            batch.unpack();
        }
        let result = p.instance.process(batch).await;
        if let (Some(t), Some(t0)) = (trace, t0) {
            let outcome = match &result {
                Ok(ProcessOutcome::Forward(_)) => "forward",
                Ok(ProcessOutcome::Held) => "held",
                Ok(ProcessOutcome::Dropped { .. }) => "dropped",
                Err(_) => "refused",
            };
            let attrs = vec![KeyValue::new("profcol.outcome", outcome), batch_trace::samples_attr(n)];
            t.child(format!("processor/{}", p.id), t0, SystemTime::now(), attrs);
        }
        match result {
            Ok(ProcessOutcome::Forward(b)) => {
                n = b.sample_count() as u64;
                p.telemetry.outgoing.add(n);
                batch = b;
                // What the processor held went out with this batch.
                acks.append(&mut held.acks[i]);
            }
            Ok(ProcessOutcome::Held) if p.instance.flush_interval().is_none() => {
                // A processor that never flushes cannot hold: the batch would vanish.
                warn!(pipeline = %parts.name, processor = %p.id, samples = n,
                    "processor held a batch but has no flush interval; counted as dropped");
                p.telemetry.dropped.add(n);
                p.dropped_batches.inc();
                answer(acks, Ok(()));
                return "dropped";
            }
            Ok(ProcessOutcome::Held) if held.durable => {
                held.acks[i].append(&mut acks);
                return "held";
            }
            Ok(ProcessOutcome::Held) => {
                answer(acks, Ok(()));
                return "held";
            }
            Ok(ProcessOutcome::Dropped { reason, samples }) => {
                tracing::debug!(pipeline = %parts.name, processor = %p.id, samples, %reason, "batch dropped");
                p.telemetry.dropped.add(samples);
                p.dropped_batches.inc();
                answer(acks, Ok(()));
                return "dropped";
            }
            Err(e) => {
                warn!(pipeline = %parts.name, processor = %p.id, samples = n, error = %e, "processor refused the batch");
                p.telemetry.refused.add(n);
                let e = match ConsumeError::from(e) {
                    ConsumeError::Refused(m) => ConsumeError::Refused(format!("processor {}: {m}", p.id)),
                    ConsumeError::Rejected(m) => ConsumeError::Rejected(format!("processor {}: {m}", p.id)),
                    other => other,
                };
                answer(acks, Err(e));
                return "refused";
            }
        }
    }
    if batch.is_empty() {
        answer(acks, Ok(()));
        return "empty";
    }
    // One batch shared by every exporter: unpacked once if any of them
    // reads samples, not copied to be unpacked for that one alone.
    if parts.exporters.iter().any(|e| !e.reads_packed()) {
        batch.unpack();
    }
    let batch = Arc::new(batch);
    let mut refused = Vec::new();
    for e in &parts.exporters {
        if let Err(why) = e.enqueue_traced(Arc::clone(&batch), n, trace.cloned()).await {
            refused.push(why);
        }
    }
    if refused.is_empty() {
        answer(acks, Ok(()));
        "queued"
    } else {
        let why = refused.join("; ");
        if acks.is_empty() {
            warn!(pipeline = %parts.name, error = %why, "a flushed batch was refused");
        }
        answer(acks, Err(ConsumeError::Refused(why)));
        "refused"
    }
}
