//! The collector's own telemetry on the OpenTelemetry SDK, configured the OTel
//! Collector way (`service.telemetry`): the meter provider behind every
//! component's instruments with its readers (Prometheus pull, OTLP periodic),
//! the logger provider fed by `tracing` events (stderr as console or JSON
//! lines, OTLP through batch processors), and the tracer provider of the
//! per-batch spans (see [`crate::service::batch_trace`]).
//!
//! Built once at start, inside the tokio runtime (the OTLP transports run
//! their I/O on it); the SDK's readers and processors export from their own
//! threads, so a slow or unreachable endpoint never holds a pipeline.
//! `service.telemetry` changes need a restart (a reload says so).

mod otlp;
pub mod resource;

pub use otlp::EXPORT_LOG_TARGET;

use opentelemetry_sdk::logs::{BatchConfigBuilder, BatchLogProcessor, SdkLoggerProvider};
use opentelemetry_sdk::metrics::PeriodicReader;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Sampler, SdkTracerProvider};
use profcol_api::telemetry::Telemetry;
use profcol_config::{LogEncoding, LogProcessorConfig, LogsConfig, TelemetryConfig};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// The providers of a running collector.
pub struct SelfTelemetry {
    /// The instruments components record through (and the pull reader).
    pub metrics: Telemetry,
    logs: Option<SdkLoggerProvider>,
    traces: Option<SdkTracerProvider>,
}

impl SelfTelemetry {
    /// Builds the providers. Call inside the tokio runtime.
    pub fn start(cfg: &TelemetryConfig, config_sources: &[String]) -> anyhow::Result<Self> {
        let resource = resource::build(&cfg.resource, config_sources);
        let pull = !cfg.metrics.address.is_empty() || cfg.metrics.readers.iter().any(|r| r.pull.is_some());
        let mut metrics = Telemetry::builder(cfg.metrics.level).resource(resource.clone()).prometheus(pull);
        for r in &cfg.metrics.readers {
            if let Some(p) = &r.periodic {
                let exporter = otlp::metric_exporter(&p.exporter.otlp)?;
                metrics = metrics.reader(PeriodicReader::builder(exporter).with_interval(p.interval).build());
            }
        }
        let metrics = metrics.build();

        let logs = if cfg.logs.processors.is_empty() {
            None
        } else {
            let mut b = SdkLoggerProvider::builder().with_resource(resource.clone());
            for LogProcessorConfig { batch: p } in &cfg.logs.processors {
                let exporter = otlp::log_exporter(&p.exporter.otlp)?;
                let batch = BatchConfigBuilder::default().with_scheduled_delay(p.schedule_delay).build();
                b = b.with_log_processor(BatchLogProcessor::builder(exporter).with_batch_config(batch).build());
            }
            Some(b.build())
        };

        let traces = if cfg.traces.processors.is_empty() {
            None
        } else {
            let ratio = cfg.traces.sampling_ratio.unwrap_or(1.0);
            let mut b = SdkTracerProvider::builder()
                .with_resource(resource)
                .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))));
            for LogProcessorConfig { batch: p } in &cfg.traces.processors {
                let exporter = otlp::span_exporter(&p.exporter.otlp)?;
                let batch = opentelemetry_sdk::trace::BatchConfigBuilder::default()
                    .with_scheduled_delay(p.schedule_delay)
                    .build();
                b = b.with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batch).build());
            }
            Some(b.build())
        };
        Ok(SelfTelemetry { metrics, logs, traces })
    }

    /// The tracer of the per-batch spans, when traces are on.
    pub fn tracer_provider(&self) -> Option<&SdkTracerProvider> {
        self.traces.as_ref()
    }

    /// Installs the process's `tracing` subscriber: stderr (console or JSON)
    /// and, with log processors, the OTLP bridge.
    pub fn init_logging(&self, cfg: &LogsConfig) {
        let console_filter = filter(&cfg.level, true);
        let console = match cfg.encoding {
            LogEncoding::Console => {
                use std::io::IsTerminal;
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(|| Scrubbed)
                    .with_filter(console_filter)
                    .boxed()
            }
            LogEncoding::Json => tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_writer(|| Scrubbed)
                .with_filter(console_filter)
                .boxed(),
        };
        let otlp = self.logs.as_ref().map(|p| {
            opentelemetry_appender_tracing::layer::OpenTelemetryTracingBridge::new(p)
                .with_filter(filter(&cfg.level, false))
                .with_filter(tracing_subscriber::filter::filter_fn(|m| exported_target(m.target())))
        });
        let _ = tracing_subscriber::registry().with(console).with(otlp).try_init();
    }

    /// Flushes and stops every provider (at exit; the runtime must still run).
    pub fn shutdown(&self) {
        self.metrics.shutdown();
        if let Some(p) = &self.traces {
            let _ = p.shutdown();
        }
        if let Some(p) = &self.logs {
            let _ = p.shutdown();
        }
    }
}

/// stderr, each line with every credential taken out
/// ([`profcol_api::config::scrub`]): URL userinfo, credential query values and
/// the secrets of the config, whoever logs them (a transport at debug level
/// logs the URLs it connects to, with their userinfo). The fmt layer hands
/// over one whole line per write.
struct Scrubbed;

impl std::io::Write for Scrubbed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(profcol_api::config::scrub(&text).as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Whether a log event of `target` may go to the OTLP log exporter: never
/// the SDK's own (`opentelemetry*`), its transports' (tonic, hyper, h2,
/// reqwest, tower) or the telemetry exporters' own lines, so an exporter
/// that fails cannot feed itself.
pub fn exported_target(target: &str) -> bool {
    const TRANSPORTS: [&str; 7] = ["opentelemetry", "tonic", "hyper", "h2", "reqwest", "tower", "rustls"];
    if target.starts_with(EXPORT_LOG_TARGET) {
        return false;
    }
    !TRANSPORTS.iter().any(|t| {
        target.strip_prefix(t).is_some_and(|rest| rest.is_empty() || rest.starts_with("::") || rest.starts_with('_'))
    })
}

/// `RUST_LOG`, else `logs.level`. On stderr the SDK's internal logs stay off
/// unless the level names them (a failing endpoint is reported once by the
/// exporters themselves, not at every interval).
fn filter(level: &str, console: bool) -> tracing_subscriber::EnvFilter {
    let mut f = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let named = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_owned()).contains("opentelemetry");
    if console && !named {
        for d in ["opentelemetry=off", "opentelemetry_sdk=off", "opentelemetry_otlp=off"] {
            if let Ok(d) = d.parse() {
                f = f.add_directive(d);
            }
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_and_transport_targets_never_reach_the_log_exporter() {
        for t in [
            "opentelemetry_sdk",
            "opentelemetry_otlp::exporter",
            "opentelemetry",
            "tonic::transport",
            "hyper_util::client",
            "h2::codec",
            "reqwest::connect",
            EXPORT_LOG_TARGET,
        ] {
            assert!(!exported_target(t), "{t}");
        }
        for t in ["profcol::exporter_helper", "profcol_receivers::ebpf", "hyperscan_like", "h2o"] {
            assert!(exported_target(t), "{t}");
        }
    }
}
