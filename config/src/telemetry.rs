//! The typed `service.telemetry` section, laid out as the OTel Collector's
//! (`resource`, `metrics.level`/`readers`, `logs.processors`, `traces`).

use profcol_api::config::{Secret, SecretUrl};
use profcol_api::telemetry::Level;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// Attributes of the collector itself, added to every metric, log record
    /// and span it exports. Defaults: `service.name: profcol`,
    /// `service.version`, `service.instance.id` (a UUID kept stable across
    /// restarts) and `host.name`; a key set to null removes a default.
    pub resource: BTreeMap<String, Option<String>>,
    pub logs: LogsConfig,
    pub metrics: MetricsConfig,
    pub traces: TracesConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LogsConfig {
    /// error, warn, info, debug or trace (or a tracing filter directive).
    /// RUST_LOG overrides it.
    pub level: String,
    /// How log lines are written to stderr.
    pub encoding: LogEncoding,
    /// Where log records go besides stderr: OTLP through a batch processor.
    pub processors: Vec<LogProcessorConfig>,
}

impl Default for LogsConfig {
    fn default() -> Self {
        LogsConfig { level: "info".into(), encoding: LogEncoding::Console, processors: vec![] }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogEncoding {
    /// Human-readable lines.
    #[default]
    Console,
    /// One JSON object per line.
    Json,
}

/// A processor of log records or spans (one kind today, as a one-key map
/// like the OTel Collector's `- batch: {...}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogProcessorConfig {
    /// Batches records and exports them in the background.
    pub batch: BatchProcessorConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchProcessorConfig {
    /// How often a batch is exported.
    #[serde(default = "default_schedule_delay", with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub schedule_delay: Duration,
    pub exporter: PushExporterConfig,
}

fn default_schedule_delay() -> Duration {
    Duration::from_secs(1)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// How much is reported: none, basic, normal or detailed.
    pub level: Level,
    /// Where Prometheus text is served (`/metrics`); empty turns it off.
    /// The shorthand of one pull reader.
    pub address: String,
    /// Pull readers (Prometheus text) and periodic readers (OTLP push).
    pub readers: Vec<MetricReaderConfig>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { level: Level::Normal, address: "localhost:8888".into(), readers: vec![] }
    }
}

/// One reader: `pull` or `periodic` (exactly one of the two keys).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricReaderConfig {
    /// Serves Prometheus text at `/metrics`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullReaderConfig>,
    /// Pushes OTLP every `interval`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub periodic: Option<PeriodicReaderConfig>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullReaderConfig {
    pub exporter: PullExporterConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullExporterConfig {
    pub prometheus: PrometheusConfig,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrometheusConfig {
    #[serde(default = "default_host")]
    pub host: String,
    pub port: u16,
}

fn default_host() -> String {
    "localhost".into()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeriodicReaderConfig {
    /// Time between two collections.
    #[serde(default = "default_interval", with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub interval: Duration,
    pub exporter: PushExporterConfig,
}

fn default_interval() -> Duration {
    Duration::from_secs(60)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PushExporterConfig {
    pub otlp: OtlpTelemetryExporter,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpTelemetryExporter {
    /// `grpc` or `http/protobuf`.
    #[serde(default)]
    pub protocol: OtlpProtocol,
    /// `http://host:port` or `https://host:port`; for `http/protobuf` a URL
    /// without a path gets the signal's (`/v1/metrics`, `/v1/logs`, `/v1/traces`).
    /// Credentials in it (`user:password@`) are redacted when printed or logged.
    pub endpoint: SecretUrl,
    /// Headers sent with every request (e.g. an API key); redacted when printed.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// Limit of one export request.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub timeout: Duration,
    /// For `https` endpoints: the CA to trust (else the system's roots), and
    /// a client certificate and key for mutual TLS.
    #[serde(default)]
    pub tls: TelemetryTls,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OtlpProtocol {
    #[default]
    #[serde(rename = "grpc")]
    Grpc,
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryTls {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TracesConfig {
    /// Span processors; none (the default) turns tracing off.
    pub processors: Vec<LogProcessorConfig>,
    /// Fraction of batches traced, 0.0 to 1.0 (default 1.0 once a processor is set).
    pub sampling_ratio: Option<f64>,
}

/// Problems of `service.telemetry`, each as (path under `service.telemetry`, message).
pub(crate) fn check(t: &TelemetryConfig, out: &mut Vec<(Vec<String>, String)>) {
    use profcol_api::config::checks;
    let mut at = |path: &[&str], m: String| out.push((path.iter().map(|s| s.to_string()).collect(), m));
    let addr = &t.metrics.address;
    if !addr.is_empty() {
        if let Err(m) = checks::host_port(addr, true) {
            at(&["metrics", "address"], format!("{m}; or \"\" to turn /metrics off"));
        }
    }
    for (i, r) in t.metrics.readers.iter().enumerate() {
        let i = i.to_string();
        if r.pull.is_some() == r.periodic.is_some() {
            at(&["metrics", "readers", &i], "a reader is either `pull` or `periodic`: set exactly one of them".into());
        }
        if let Some(p) = &r.pull {
            let a = format!("{}:{}", p.exporter.prometheus.host, p.exporter.prometheus.port);
            if let Err(m) = checks::host_port(&a, true) {
                at(&["metrics", "readers", &i, "pull", "exporter", "prometheus"], m);
            }
            if !addr.is_empty() && a == *addr {
                at(
                    &["metrics", "readers", &i, "pull", "exporter", "prometheus", "port"],
                    format!("{a} is metrics.address already; set metrics.address: \"\" or pick another port"),
                );
            }
        }
        if let Some(p) = &r.periodic {
            if p.interval < Duration::from_millis(100) {
                at(&["metrics", "readers", &i, "periodic", "interval"], "must be at least 100ms (e.g. 60s)".into());
            }
            check_otlp(&p.exporter.otlp, &mut |sub, m| {
                let mut path = vec!["metrics", "readers", &i, "periodic", "exporter", "otlp"];
                path.extend_from_slice(sub);
                at(&path, m)
            });
        }
    }
    for (signal, processors) in [("logs", &t.logs.processors), ("traces", &t.traces.processors)] {
        for (i, LogProcessorConfig { batch: b }) in processors.iter().enumerate() {
            let i = i.to_string();
            if b.schedule_delay.is_zero() {
                at(&[signal, "processors", &i, "batch", "schedule_delay"], "must be above 0 (e.g. 1s)".into());
            }
            check_otlp(&b.exporter.otlp, &mut |sub, m| {
                let mut path = vec![signal, "processors", &i, "batch", "exporter", "otlp"];
                path.extend_from_slice(sub);
                at(&path, m)
            });
        }
    }
    if let Some(r) = t.traces.sampling_ratio {
        if !(0.0..=1.0).contains(&r) {
            at(&["traces", "sampling_ratio"], format!("{r} is not a ratio; use a number from 0.0 to 1.0"));
        }
    }
    for (k, _) in t.resource.iter().filter(|(k, _)| k.is_empty()) {
        at(&["resource", k], "an attribute needs a non-empty key".into());
    }
}

fn check_otlp(o: &OtlpTelemetryExporter, at: &mut dyn FnMut(&[&str], String)) {
    let url = o.endpoint.expose();
    let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or("");
    let host = rest.split('/').next().unwrap_or("");
    if !scheme_ok || host.is_empty() {
        at(
            &["endpoint"],
            format!(
                "{:?} is not an OTLP endpoint; write http://host:port or https://host:port (e.g. http://localhost:4317 for grpc, http://localhost:4318 for http/protobuf)",
                o.endpoint.redacted()
            ),
        );
    }
    if o.timeout.is_zero() {
        at(&["timeout"], "must be above 0 (e.g. 10s)".into());
    }
    for (k, v) in &o.headers {
        let name_ok = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
        if !name_ok {
            at(&["headers", k], "is not a valid header name (letters, digits, '-' and '_')".into());
        }
        if v.expose().bytes().any(|b| b == b'\r' || b == b'\n') {
            at(&["headers", k], "a header value cannot hold a line break".into());
        }
    }
    let tls = &o.tls;
    for (key, file) in [("ca_file", &tls.ca_file), ("cert_file", &tls.cert_file), ("key_file", &tls.key_file)] {
        if let Some(f) = file {
            if let Err(e) = std::fs::metadata(f) {
                at(&["tls", key], format!("cannot read {}: {e}", f.display()));
            }
        }
    }
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        at(&["tls"], "cert_file and key_file go together (mutual TLS); set both or neither".into());
    }
    if (tls.ca_file.is_some() || tls.cert_file.is_some()) && o.endpoint.expose().starts_with("http://") {
        at(&["tls"], "TLS settings need an https:// endpoint".into());
    }
}
