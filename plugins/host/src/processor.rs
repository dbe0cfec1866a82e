//! The `wasm` processor: hands each batch to a processor plugin and maps the
//! answer onto the host's outcomes. A `retryable` answer is retried in place
//! up to `max_retries` times. A failure (trap, timeout, permanent error,
//! output that does not decode or validate, retries exhausted, plugin
//! disabled) follows `on_error`: pass forwards the batch unchanged, drop drops it.

use crate::bindings::{ErrorKind, PluginError};
use crate::config::{self, OnError, ProcessorConfig};
use crate::inspect::World;
use crate::plugin::{CallError, FailureKind, Plugin};
use async_trait::async_trait;
use profcol_api::component::{
    Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind, ProcessError, ProcessOutcome, Processor,
    Stability,
};
use profcol_api::config::{ConfigError, ConfigValue};
use profcol_api::telemetry::MetricDef;
use profcol_api::Profiles;
use schemars::{Schema, SchemaGenerator};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

/// The pause before the first retry of a `retryable` answer (doubling after).
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(10);

pub struct WasmProcessor {
    plugin: Arc<Plugin>,
    on_error: OnError,
    max_retries: u32,
}

impl WasmProcessor {
    pub fn new(plugin: Arc<Plugin>, on_error: OnError, max_retries: u32) -> Self {
        WasmProcessor { plugin, on_error, max_retries }
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// What a failed call does to the batch.
    fn on_error(&self, batch: Profiles, why: &str) -> ProcessOutcome {
        match self.on_error {
            OnError::Pass => ProcessOutcome::Forward(batch),
            OnError::Drop => ProcessOutcome::Dropped {
                reason: Cow::Owned(format!("plugin failed ({why}); on_error: drop")),
                samples: batch.sample_count() as u64,
            },
        }
    }

    /// Decodes and validates the plugin's output; garbage is a failure.
    fn accept(&self, out: &[u8]) -> Result<Profiles, String> {
        let p = Profiles::decode(out).map_err(|e| format!("output does not decode as ProfilesData: {e}"))?;
        p.validate().map_err(|e| format!("output is not a valid batch: {e}"))?;
        Ok(p)
    }
}

#[async_trait]
impl Processor for WasmProcessor {
    /// The batch goes to the plugin encoded; counts go through `Profiles`.
    fn reads_packed(&self) -> bool {
        true
    }

    async fn process(&self, batch: Profiles) -> Result<ProcessOutcome, ProcessError> {
        let bytes = Arc::new(batch.encode_to_vec());
        let mut pause = FIRST_RETRY_PAUSE;
        let mut retries = 0;
        loop {
            let result = self.plugin.process(Arc::clone(&bytes)).await;
            let message = match result {
                Ok(Ok(Some(out))) => {
                    return Ok(match self.accept(&out) {
                        Ok(p) => {
                            self.plugin.call_ok();
                            ProcessOutcome::Forward(p)
                        }
                        Err(why) => {
                            self.plugin.call_failed(FailureKind::InvalidOutput, &why);
                            self.on_error(batch, FailureKind::InvalidOutput.as_str())
                        }
                    })
                }
                Ok(Ok(None)) => {
                    self.plugin.call_ok();
                    return Ok(ProcessOutcome::dropped("dropped by the plugin", &batch));
                }
                Ok(Err(PluginError { kind: ErrorKind::Drop, message })) => {
                    self.plugin.call_ok();
                    return Ok(ProcessOutcome::Dropped {
                        reason: Cow::Owned(format!("dropped by the plugin: {message}")),
                        samples: batch.sample_count() as u64,
                    });
                }
                Ok(Err(PluginError { kind: ErrorKind::Retryable, message })) => message,
                Ok(Err(PluginError { kind: ErrorKind::Permanent, message })) => {
                    self.plugin.call_failed(FailureKind::PluginError, &message);
                    return Ok(self.on_error(batch, FailureKind::PluginError.as_str()));
                }
                Err(CallError::Disabled) => return Ok(self.on_error(batch, "disabled")),
                Err(CallError::Failed { kind, .. }) => return Ok(self.on_error(batch, kind.as_str())),
            };
            self.plugin.call_retryable();
            if retries >= self.max_retries {
                let why =
                    format!("answered retryable {} times (max_retries {}): {message}", retries + 1, self.max_retries);
                self.plugin.call_failed(FailureKind::RetriesExhausted, &why);
                return Ok(self.on_error(batch, FailureKind::RetriesExhausted.as_str()));
            }
            retries += 1;
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
}

pub struct ProcessorFactory;

impl Factory for ProcessorFactory {
    fn meta(&self) -> FactoryMeta {
        FactoryMeta {
            type_name: "wasm",
            kind: Kind::Processor,
            stability: Stability::Development,
            description: "runs a WebAssembly processor plugin (profcol:plugin/processor) on each batch",
        }
    }

    fn metrics(&self) -> &'static [MetricDef] {
        crate::metrics::PROCESSOR
    }

    fn check(&self, raw: &ConfigValue) -> Result<ConfigValue, Vec<ConfigError>> {
        config::check::<ProcessorConfig>(raw)
    }

    fn create(&self, settings: CreateSettings, raw: &ConfigValue) -> Result<Component, ComponentError> {
        let c: ProcessorConfig = raw.decode()?;
        let s = c.settings(&settings.id.to_string());
        let plugin = crate::load_file(&c.path, World::Processor, s, settings.telemetry.registry())?;
        Ok(Component::Processor(Arc::new(WasmProcessor::new(plugin, c.on_error, c.max_retries))))
    }

    fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        generator.subschema_for::<ProcessorConfig>()
    }
}
