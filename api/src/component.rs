//! Components: ids, kinds, factories, the three component traits, and the
//! [`Next`] handle through which receivers push batches downstream.

pub use crate::component_id::{ComponentId, IdError, Kind};
use crate::config::{ConfigError, ConfigValue, Problems, Validate};
use crate::telemetry::ComponentTelemetry;
use crate::Profiles;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{de::DeserializeOwned, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// How far a component has come (the OTel Collector's levels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stability {
    Development,
    Alpha,
    Beta,
    Stable,
}

impl fmt::Display for Stability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Stability::Development => "development",
            Stability::Alpha => "alpha",
            Stability::Beta => "beta",
            Stability::Stable => "stable",
        })
    }
}

/// A component failed to be created, start, run or stop.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Message(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl ComponentError {
    pub fn msg(m: impl Into<String>) -> Self {
        ComponentError::Message(m.into())
    }
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ComponentError::Io { context: context.into(), source }
    }
}

/// An export attempt failed, in whole or in part: retry it later, give up
/// on the batch, or (the backend took the rest) count what it rejected.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExportError {
    /// Nothing was taken; the same batch may be sent again, after at least
    /// `retry_after` when the backend said so.
    // The error says what it is; whoever handles it says what it did
    // (retried, or dropped and why), so a log line never says both.
    #[error("{message} (retryable)")]
    Retryable { message: String, retry_after: Option<Duration> },
    /// Nothing was taken, and sending it again would fail the same way:
    /// every sample of the batch is rejected.
    #[error("{message} (permanent)")]
    Permanent { message: String },
    /// The backend took the batch except `rejected_samples` samples (OTLP
    /// `partial_success`). Never retried: the rest arrived, and a retry would
    /// send it twice.
    #[error("{message} ({rejected_samples} samples rejected; the rest was accepted)")]
    Partial { message: String, rejected_samples: u64 },
}

impl ExportError {
    pub fn retryable(message: impl Into<String>) -> Self {
        ExportError::Retryable { message: message.into(), retry_after: None }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        ExportError::Permanent { message: message.into() }
    }

    /// How many of a batch's `samples` this failure rejected for good, if the
    /// attempt is not retried: all of them, except for a partial success.
    pub fn rejected_samples(&self, samples: u64) -> u64 {
        match self {
            ExportError::Partial { rejected_samples, .. } => (*rejected_samples).min(samples),
            ExportError::Retryable { .. } | ExportError::Permanent { .. } => samples,
        }
    }
}

/// A downstream stage refused a batch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConsumeError {
    #[error("the pipeline is shutting down and accepts no more data")]
    Closed,
    /// Refused for now (a full queue, a processor that may succeed later):
    /// the sender should retry (gRPC UNAVAILABLE, HTTP 503).
    #[error("{0}")]
    Refused(String),
    /// Refused for good (a processor rejected the data): a retry would fail
    /// the same way (gRPC INVALID_ARGUMENT, HTTP 400).
    #[error("{0}")]
    Rejected(String),
}

/// What a processor did with a batch. The host counts each outcome per
/// processor (incoming, outgoing, dropped; an error counts as refused).
#[derive(Debug)]
pub enum ProcessOutcome {
    /// The batch, possibly changed, goes on to the next stage.
    Forward(Profiles),
    /// Kept for a later flush. Only processors with a
    /// [`Processor::flush_interval`] may hold; the host answers the sender
    /// once the batch that carries it is queued.
    Held,
    /// Dropped on purpose (a filter, a sampler): nothing goes on, the sender
    /// is told OK, and `samples` are counted as dropped.
    Dropped { reason: Cow<'static, str>, samples: u64 },
}

impl ProcessOutcome {
    /// A drop of the whole `batch`, counted in its samples.
    pub fn dropped(reason: impl Into<Cow<'static, str>>, batch: &Profiles) -> Self {
        ProcessOutcome::Dropped { reason: reason.into(), samples: batch.sample_count() as u64 }
    }

    /// The forwarded batch, if that is what happened.
    pub fn forwarded(self) -> Option<Profiles> {
        match self {
            ProcessOutcome::Forward(b) => Some(b),
            _ => None,
        }
    }
}

/// A processor refused a batch: the receiver that produced it answers its
/// sender with an error, and the samples are counted as refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProcessError {
    /// The same batch may succeed later (a plugin temporarily disabled, a
    /// resource not ready): the sender should retry.
    #[error("{0} (retryable)")]
    Retryable(String),
    /// The batch cannot be processed; a retry would fail the same way.
    #[error("{0}")]
    Permanent(String),
}

impl From<ProcessError> for ConsumeError {
    fn from(e: ProcessError) -> Self {
        match e {
            ProcessError::Retryable(m) => ConsumeError::Refused(m),
            ProcessError::Permanent(m) => ConsumeError::Rejected(m),
        }
    }
}

/// Anything a batch can be pushed into (a pipeline's input, a test sink).
#[async_trait]
pub trait Consumer: Send + Sync + 'static {
    /// Takes the batch; awaits while the consumer is full (backpressure).
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError>;
}

/// What a receiver pushes into: every pipeline the receiver feeds.
///
/// The target list sits behind an arc-swap so a config reload can rewire a
/// running receiver without restarting it.
#[derive(Clone)]
pub struct Next {
    targets: Arc<ArcSwap<Vec<Arc<dyn Consumer>>>>,
    telemetry: ComponentTelemetry,
    gate: Arc<tokio::sync::watch::Sender<Gate>>,
}

/// Whether a [`Next`] delivers yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    /// The graph it feeds is not live yet: sends wait.
    Pending,
    Open,
    /// The graph it feeds will never go live: sends fail.
    Closed,
}

impl Next {
    pub fn new(targets: Vec<Arc<dyn Consumer>>, telemetry: ComponentTelemetry) -> Self {
        Self::with_gate(targets, telemetry, Gate::Open)
    }

    /// A handle for a receiver of a graph that is not live yet: its sends
    /// wait until [`Next::open`], or fail with [`ConsumeError::Closed`] after
    /// [`Next::close`]. So a receiver started by a reload that then fails
    /// delivers nothing into the abandoned graph's pipelines (and, through
    /// them, into exporters the running graph shares).
    pub fn pending(targets: Vec<Arc<dyn Consumer>>, telemetry: ComponentTelemetry) -> Self {
        Self::with_gate(targets, telemetry, Gate::Pending)
    }

    fn with_gate(targets: Vec<Arc<dyn Consumer>>, telemetry: ComponentTelemetry, gate: Gate) -> Self {
        let gate = Arc::new(tokio::sync::watch::Sender::new(gate));
        Next { targets: Arc::new(ArcSwap::from_pointee(targets)), telemetry, gate }
    }

    /// The graph went live: sends (waiting ones included) deliver.
    pub fn open(&self) {
        self.gate.send_replace(Gate::Open);
    }

    /// The graph will never go live: sends (waiting ones included) fail.
    pub fn close(&self) {
        self.gate.send_replace(Gate::Closed);
    }

    /// Rewires the handle (and every clone of it) to new targets.
    pub fn set_targets(&self, targets: Vec<Arc<dyn Consumer>>) {
        self.targets.store(Arc::new(targets));
    }

    /// Pushes a batch into every target; awaits while a target is full.
    /// Counts the samples as accepted, or as refused when a target refuses.
    pub async fn send(&self, batch: Profiles) -> Result<(), ConsumeError> {
        let n = batch.sample_count() as u64;
        if *self.gate.borrow() != Gate::Open {
            let mut rx = self.gate.subscribe();
            let gate = rx.wait_for(|g| *g != Gate::Pending).await.map(|g| *g).unwrap_or(Gate::Closed);
            if gate == Gate::Closed {
                self.telemetry.refused.add(n);
                return Err(ConsumeError::Closed);
            }
        }
        let targets = self.targets.load_full();
        let mut result = Ok(());
        if let Some((last, rest)) = targets.split_last() {
            for t in rest {
                if let Err(e) = t.consume(batch.clone()).await {
                    result = Err(e);
                }
            }
            if let Err(e) = last.consume(batch).await {
                result = Err(e);
            }
        }
        match &result {
            Ok(()) => self.telemetry.accepted.add(n),
            Err(_) => self.telemetry.refused.add(n),
        }
        result
    }
}

/// A source of batches (eBPF sampling, OTLP server, files).
#[async_trait]
pub trait Receiver: Send + Sync + 'static {
    /// Sets up (failing here with a clear error, having released whatever it
    /// had set up), spawns its own tasks, returns.
    async fn start(&self, next: Next) -> Result<(), ComponentError>;
    /// Stops producing, flushes what it holds into `next`, waits for its tasks.
    /// After this returns the receiver sends nothing more.
    async fn shutdown(&self) -> Result<(), ComponentError>;
    /// What only one instance can hold at a time (a TCP port, the host's CPU
    /// sampler), named so that equal strings mean the same thing.
    ///
    /// On reload, a changed receiver's new instance starts while the old one
    /// still runs, so a new instance that cannot start leaves the old one
    /// serving. Only when the two name a common resource does the old one stop
    /// first; if the new one then fails, the old one is started again, so a
    /// receiver that names resources must support `start` after `shutdown`.
    fn exclusive_resources(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A batch transformer: says what it did with each batch
/// ([`ProcessOutcome`]); an error means refused, and the sender hears it.
///
/// Contract for processors that hold batches back: they have a
/// `flush_interval`, answer [`ProcessOutcome::Held`], and a batch they
/// return (from `process` or `flush`) carries everything they held until
/// then. The host relies on it to acknowledge held batches once they are
/// queued.
#[async_trait]
pub trait Processor: Send + Sync + 'static {
    async fn start(&self) -> Result<(), ComponentError> {
        Ok(())
    }
    async fn process(&self, batch: Profiles) -> Result<ProcessOutcome, ProcessError>;
    /// Whether `process` takes a batch whose samples may be packed
    /// ([`Profiles::decode_packed`]): one that only encodes, counts or
    /// forwards batches through [`Profiles`]' own methods, never reading
    /// `.0`'s samples. Others get batches unpacked.
    fn reads_packed(&self) -> bool {
        false
    }
    /// Processors that hold batches back (batch) say how often the host should
    /// call [`Processor::flush`].
    fn flush_interval(&self) -> Option<Duration> {
        None
    }
    /// Hands over whatever is held back: on the timer, and when the pipeline drains.
    async fn flush(&self) -> Result<Option<Profiles>, ComponentError> {
        Ok(None)
    }
    async fn shutdown(&self) -> Result<(), ComponentError> {
        Ok(())
    }
}

/// A sink: implements only the send. The host wraps it with a bounded queue,
/// retry with backoff and a per-attempt timeout (the host's exporter helper).
#[async_trait]
pub trait Exporter: Send + Sync + 'static {
    /// How many exports the host runs at once (the sending queue's
    /// `num_consumers`; 1 without a queue), told before [`Exporter::start`].
    /// An exporter that holds one resource per concurrent export (a
    /// plugin's instances) sizes its pool to it.
    fn set_concurrency(&self, exports: usize) {
        let _ = exports;
    }
    async fn start(&self) -> Result<(), ComponentError> {
        Ok(())
    }
    async fn export(&self, batch: &Profiles) -> Result<(), ExportError>;
    /// The host dropped `batch` after a failed export (retries exhausted, a
    /// permanent error, shutting down): what was kept for its retries can go.
    fn gave_up(&self, batch: &Profiles) {
        let _ = batch;
    }
    /// As [`Processor::reads_packed`], for `export`: an exporter that does
    /// not say so gets batches unpacked.
    fn reads_packed(&self) -> bool {
        false
    }
    async fn shutdown(&self) -> Result<(), ComponentError> {
        Ok(())
    }
}

/// A component that is not part of a pipeline (health_check).
#[async_trait]
pub trait Extension: Send + Sync + 'static {
    async fn start(&self) -> Result<(), ComponentError>;
    async fn shutdown(&self) -> Result<(), ComponentError>;
    /// As [`Receiver::exclusive_resources`]: what only one instance can hold
    /// (a TCP port); on reload an extension that names any must support
    /// `start` after `shutdown`.
    fn exclusive_resources(&self) -> Vec<String> {
        Vec::new()
    }
}

/// What a factory made.
#[derive(Clone)]
pub enum Component {
    Receiver(Arc<dyn Receiver>),
    Processor(Arc<dyn Processor>),
    Exporter(Arc<dyn Exporter>),
    Extension(Arc<dyn Extension>),
}

/// What a component gets at creation.
#[derive(Clone)]
pub struct CreateSettings {
    pub id: ComponentId,
    pub telemetry: ComponentTelemetry,
    /// What the host shares between components (pinned files, ...).
    pub services: crate::services::HostServices,
}

/// A factory's description.
#[derive(Clone, Copy, Debug)]
pub struct FactoryMeta {
    pub type_name: &'static str,
    pub kind: Kind,
    pub stability: Stability,
    pub description: &'static str,
}

/// Makes components of one type from their config sections.
pub trait Factory: Send + Sync + 'static {
    fn meta(&self) -> FactoryMeta;
    /// The component's own series (beside the host's standard ones), as
    /// it declares them; docs/CONFIG.md's metric table is checked against these.
    fn metrics(&self) -> &'static [crate::telemetry::MetricDef] {
        &[]
    }
    /// Decodes a section and runs its [`Validate`] check: everything knowable
    /// without side effects. Returns the effective config (defaults filled,
    /// secrets redacted) for print-config, or every problem found. The host
    /// runs this before anything starts: for `profcol validate`, the start and
    /// every reload.
    fn check(&self, raw: &ConfigValue) -> Result<ConfigValue, Vec<ConfigError>>;
    /// Makes the component from a section that passed [`Factory::check`].
    fn create(&self, settings: CreateSettings, config: &ConfigValue) -> Result<Component, ComponentError>;
    /// The JSON Schema of the section (definitions go into `generator`).
    fn schema(&self, generator: &mut SchemaGenerator) -> Schema;
}

/// A [`Factory`] for config type `C` and a create function: what most
/// components need. `C` is a serde struct with `Default` and
/// `#[serde(deny_unknown_fields, default)]`, derives `schemars::JsonSchema`
/// (doc comments become the schema's descriptions) and implements
/// [`Validate`] (empty when there is nothing to check).
pub(crate) struct TypedFactory<C, F> {
    meta: FactoryMeta,
    metrics: &'static [crate::telemetry::MetricDef],
    create: F,
    _config: PhantomData<fn() -> C>,
}

/// Builds a factory for config type `C`.
pub fn factory<C, F>(meta: FactoryMeta, create: F) -> Arc<dyn Factory>
where
    C: DeserializeOwned + Serialize + Default + JsonSchema + Validate + 'static,
    F: Fn(CreateSettings, C) -> Result<Component, ComponentError> + Send + Sync + 'static,
{
    factory_with_metrics::<C, F>(meta, &[], create)
}

/// Builds a factory for config type `C` whose components register `metrics`.
pub fn factory_with_metrics<C, F>(
    meta: FactoryMeta,
    metrics: &'static [crate::telemetry::MetricDef],
    create: F,
) -> Arc<dyn Factory>
where
    C: DeserializeOwned + Serialize + Default + JsonSchema + Validate + 'static,
    F: Fn(CreateSettings, C) -> Result<Component, ComponentError> + Send + Sync + 'static,
{
    Arc::new(TypedFactory { meta, metrics, create, _config: PhantomData::<fn() -> C> })
}

impl<C, F> Factory for TypedFactory<C, F>
where
    C: DeserializeOwned + Serialize + Default + JsonSchema + Validate + 'static,
    F: Fn(CreateSettings, C) -> Result<Component, ComponentError> + Send + Sync + 'static,
{
    fn meta(&self) -> FactoryMeta {
        self.meta
    }
    fn metrics(&self) -> &'static [crate::telemetry::MetricDef] {
        self.metrics
    }
    fn check(&self, raw: &ConfigValue) -> Result<ConfigValue, Vec<ConfigError>> {
        let c: C = raw.decode().map_err(|e| vec![e])?;
        let mut problems = Problems::new();
        c.validate(&mut problems);
        if !problems.is_empty() {
            return Err(problems.into_errors());
        }
        ConfigValue::encode(&c).map_err(|e| vec![e])
    }
    fn create(&self, settings: CreateSettings, config: &ConfigValue) -> Result<Component, ComponentError> {
        let c: C = config.decode()?;
        (self.create)(settings, c)
    }
    fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        generator.subschema_for::<C>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_print() {
        let id: ComponentId = "otlp/backend".parse().unwrap();
        assert_eq!((id.type_name(), id.name()), ("otlp", "backend"));
        assert_eq!(id.to_string(), "otlp/backend");
        assert_eq!("batch".parse::<ComponentId>().unwrap().to_string(), "batch");
        assert!("Batch".parse::<ComponentId>().is_err());
        assert!("9x".parse::<ComponentId>().is_err());
        assert!("otlp/".parse::<ComponentId>().is_err());
        assert!("".parse::<ComponentId>().is_err());
    }
}
