//! The `wasm` exporter: an exporter plugin turns a batch into outputs named
//! by sink; the host delivers them. It runs inside the host's exporter
//! wrapper (timeout, retry_on_failure, sending_queue). A retry of a batch
//! re-delivers only the sinks that failed: the plugin's outputs are kept,
//! keyed by the batch's hash, until every sink has them or the host gives
//! up on the batch ([`Exporter::gave_up`]); at most one batch per export the
//! host runs at once (each queue consumer retries one batch at a time).

use crate::bindings::{ErrorKind, Output, PluginError};
use crate::config::{self, ExporterConfig, Sink};
use crate::inspect::World;
use crate::metrics::PENDING_OUTPUT_BYTES;
use crate::plugin::{CallError, FailureKind, Plugin};
use crate::sinks::Sinks;
use async_trait::async_trait;
use profcol_api::component::{
    Component, ComponentError, CreateSettings, ExportError, Exporter, Factory, FactoryMeta, Kind, Stability,
};
use profcol_api::config::{ConfigError, ConfigValue};
use profcol_api::telemetry::{Gauge, MetricDef};
use profcol_api::Profiles;
use schemars::{Schema, SchemaGenerator};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

struct Pending {
    batch_sha256: String,
    outputs: Vec<Output>,
    /// Sinks that do not have this batch's outputs yet.
    remaining: BTreeSet<String>,
}

impl Pending {
    fn bytes(&self) -> usize {
        self.outputs.iter().map(|o| o.data.len() + o.sink.len() + o.content_type.len()).sum()
    }
}

pub struct WasmExporter {
    plugin: Arc<Plugin>,
    /// `pool_size` as configured; None: one instance per concurrent export.
    pool_size: Option<usize>,
    /// Exports the host runs at once (its sending queue's consumers).
    concurrency: AtomicUsize,
    sinks: BTreeMap<String, Sink>,
    delivery: Sinks,
    pending: Mutex<VecDeque<Pending>>,
    /// `profcol_plugin_pending_output_bytes`: what `pending` holds.
    pending_bytes: Gauge,
}

impl WasmExporter {
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    fn take_pending(&self, sha: &str) -> Option<Pending> {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let i = p.iter().position(|x| x.batch_sha256 == sha)?;
        let taken = p.remove(i);
        self.measure(&p);
        taken
    }

    /// Keeps a batch's outputs for its retry. One batch per concurrent
    /// export: an older one beyond that was delivered or dropped meanwhile.
    fn keep_pending(&self, pending: Pending) {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        while p.len() >= self.concurrency.load(Ordering::Relaxed).max(1) {
            p.pop_front();
        }
        p.push_back(pending);
        self.measure(&p);
    }

    fn measure(&self, p: &VecDeque<Pending>) {
        let bytes: usize = p.iter().map(Pending::bytes).sum();
        self.pending_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Runs the plugin; maps its failures onto export errors.
    async fn outputs(&self, bytes: Vec<u8>) -> Result<Option<Vec<Output>>, ExportError> {
        match self.plugin.export(bytes).await {
            Ok(Ok(outputs)) => {
                if let Some(o) = outputs.iter().find(|o| !self.sinks.contains_key(&o.sink)) {
                    let why = format!(
                        "output for sink {:?}, which is not configured (sinks: {})",
                        o.sink,
                        self.sinks.keys().cloned().collect::<Vec<_>>().join(", ")
                    );
                    self.plugin.call_failed(FailureKind::InvalidOutput, &why);
                    return Err(ExportError::permanent(why));
                }
                self.plugin.call_ok();
                Ok(Some(outputs))
            }
            Ok(Err(PluginError { kind: ErrorKind::Drop, .. })) => {
                self.plugin.call_ok();
                Ok(None)
            }
            Ok(Err(PluginError { kind: ErrorKind::Retryable, message })) => {
                self.plugin.call_retryable();
                Err(ExportError::retryable(format!("plugin asks for a retry: {message}")))
            }
            Ok(Err(PluginError { kind: ErrorKind::Permanent, message })) => {
                self.plugin.call_failed(FailureKind::PluginError, &message);
                Err(ExportError::permanent(format!("plugin error: {message}")))
            }
            // Disabled for a while, or too slow this time: the batch may go through later.
            Err(e @ CallError::Disabled) | Err(e @ CallError::Failed { kind: FailureKind::Timeout, .. }) => {
                Err(ExportError::retryable(e.to_string()))
            }
            Err(e) => Err(ExportError::permanent(e.to_string())),
        }
    }
}

#[async_trait]
impl Exporter for WasmExporter {
    fn set_concurrency(&self, exports: usize) {
        self.concurrency.store(exports.max(1), Ordering::Relaxed);
    }

    /// Fills the pool: `pool_size` instances, or one per export the host
    /// runs at once, so concurrent exports never wait for an instance.
    async fn start(&self) -> Result<(), ComponentError> {
        let n = self.pool_size.unwrap_or_else(|| self.concurrency.load(Ordering::Relaxed));
        let plugin = Arc::clone(&self.plugin);
        crate::blocking(move || plugin.grow_pool(n)).map_err(ComponentError::msg)
    }

    /// The batch goes to the plugin encoded.
    fn reads_packed(&self) -> bool {
        true
    }

    fn gave_up(&self, batch: &Profiles) {
        if self.pending.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            return;
        }
        drop(self.take_pending(&crate::cache::sha256_hex(&batch.encode_to_vec())));
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        p.clear();
        self.measure(&p);
        Ok(())
    }

    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        let bytes = batch.encode_to_vec();
        let sha = crate::cache::sha256_hex(&bytes);
        let mut pending = match self.take_pending(&sha) {
            Some(p) => p,
            None => match self.outputs(bytes).await? {
                None => return Ok(()),
                Some(outputs) => {
                    let remaining = outputs.iter().map(|o| o.sink.clone()).collect();
                    Pending { batch_sha256: sha, outputs, remaining }
                }
            },
        };
        let mut failed = BTreeSet::new();
        let mut errors = Vec::new();
        let mut permanent = false;
        for name in &pending.remaining {
            let pieces: Vec<(&str, &[u8])> = pending
                .outputs
                .iter()
                .filter(|o| &o.sink == name)
                .map(|o| (o.content_type.as_str(), o.data.as_slice()))
                .collect();
            if let Err(e) = self.delivery.deliver(&self.sinks[name], &pieces).await {
                permanent |= e.permanent;
                errors.push(format!("sink {name}: {}", e.message));
                failed.insert(name.clone());
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        let message = errors.join("; ");
        if permanent {
            return Err(ExportError::permanent(message));
        }
        pending.remaining = failed;
        self.keep_pending(pending);
        Err(ExportError::retryable(message))
    }
}

pub struct ExporterFactory;

impl Factory for ExporterFactory {
    fn meta(&self) -> FactoryMeta {
        FactoryMeta {
            type_name: "wasm",
            kind: Kind::Exporter,
            stability: Stability::Development,
            description:
                "runs a WebAssembly exporter plugin (profcol:plugin/exporter); the host delivers its outputs to sinks",
        }
    }

    fn metrics(&self) -> &'static [MetricDef] {
        crate::metrics::EXPORTER
    }

    fn check(&self, raw: &ConfigValue) -> Result<ConfigValue, Vec<ConfigError>> {
        config::check::<ExporterConfig>(raw)
    }

    /// Loads the plugin with one instance (so a config `init` refuses fails
    /// here); [`Exporter::start`] fills the pool.
    fn create(&self, settings: CreateSettings, raw: &ConfigValue) -> Result<Component, ComponentError> {
        let c: ExporterConfig = raw.decode()?;
        let component = settings.id.to_string();
        let s = c.settings(&component, 1);
        let plugin = crate::load_file(&c.path, World::Exporter, s, settings.telemetry.registry())?;
        let delivery = Sinks::new().map_err(ComponentError::msg)?;
        let sinks = c
            .sinks
            .iter()
            .map(|(n, s)| s.sink().map(|s| (n.clone(), s)))
            .collect::<Result<_, _>>()
            .map_err(ComponentError::msg)?;
        Ok(Component::Exporter(Arc::new(WasmExporter {
            plugin,
            pool_size: c.pool_size,
            concurrency: AtomicUsize::new(1),
            sinks,
            delivery,
            pending: Mutex::new(VecDeque::new()),
            pending_bytes: settings.telemetry.registry().gauge(
                &crate::metrics::series(&PENDING_OUTPUT_BYTES),
                PENDING_OUTPUT_BYTES.help,
                &[("component", &component)],
            ),
        })))
    }

    fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        generator.subschema_for::<ExporterConfig>()
    }
}
