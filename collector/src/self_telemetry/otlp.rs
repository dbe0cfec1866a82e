//! OTLP exporters of the collector's own telemetry (`opentelemetry-otlp`),
//! wrapped so a failing endpoint is contained: each export runs on the SDK's
//! own background thread (the pipelines never wait for it), the first failure
//! is logged once (and the recovery), and the next interval or batch simply
//! tries again. Those log lines use [`EXPORT_LOG_TARGET`], which the OTLP log
//! exporter never takes, so a broken log endpoint cannot feed itself.

use anyhow::{anyhow, Context as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::logs::{LogBatch, LogExporter};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use profcol_api::config::SecretUrl;
use profcol_config::{OtlpProtocol, OtlpTelemetryExporter};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The tracing target of the telemetry exporters' own log lines.
pub const EXPORT_LOG_TARGET: &str = "profcol::self_telemetry::export";

/// Which signal an exporter carries (its HTTP path and its log lines).
#[derive(Clone, Copy, Debug)]
pub(super) enum Signal {
    Metrics,
    Logs,
    Traces,
}

impl Signal {
    fn path(self) -> &'static str {
        match self {
            Signal::Metrics => "/v1/metrics",
            Signal::Logs => "/v1/logs",
            Signal::Traces => "/v1/traces",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
            Signal::Traces => "traces",
        }
    }
}

/// Logs the first failure after a success (or the start) and the recovery.
#[derive(Debug)]
pub(super) struct Contained<E> {
    inner: E,
    signal: Signal,
    /// As it may be logged (credentials redacted).
    endpoint: String,
    failing: AtomicBool,
}

impl<E> Contained<E> {
    fn new(inner: E, signal: Signal, endpoint: &SecretUrl) -> Self {
        Contained { inner, signal, endpoint: endpoint.redacted().into_owned(), failing: AtomicBool::new(false) }
    }

    fn outcome(&self, r: OTelSdkResult) -> OTelSdkResult {
        match &r {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(target: EXPORT_LOG_TARGET, signal = self.signal.name(), endpoint = %self.endpoint,
                        "self-telemetry export works again");
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(target: EXPORT_LOG_TARGET, signal = self.signal.name(), endpoint = %self.endpoint, error = %e,
                        "self-telemetry export failed; retrying in the background (logged once until it works again)");
                }
            }
        }
        r
    }
}

impl<E: PushMetricExporter> PushMetricExporter for Contained<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let r = self.inner.export(metrics).await;
        self.outcome(r)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

impl<E: LogExporter> LogExporter for Contained<E> {
    async fn export(&self, batch: LogBatch<'_>) -> OTelSdkResult {
        let r = self.inner.export(batch).await;
        self.outcome(r)
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

impl<E: SpanExporter> SpanExporter for Contained<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let r = self.inner.export(batch).await;
        self.outcome(r)
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

/// The endpoint as the transport wants it: for http/protobuf, a URL without
/// a path gets the signal's.
fn endpoint(c: &OtlpTelemetryExporter, signal: Signal) -> SecretUrl {
    let url = c.endpoint.expose();
    match c.protocol {
        OtlpProtocol::Grpc => c.endpoint.clone(),
        OtlpProtocol::HttpProtobuf => {
            let rest = url.split_once("://").map(|(_, r)| r).unwrap_or("");
            match rest.find('/') {
                Some(i) if rest.len() > i + 1 => c.endpoint.clone(),
                _ => SecretUrl::new(format!("{}{}", url.trim_end_matches('/'), signal.path())),
            }
        }
    }
}

fn read(path: &std::path::Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read the telemetry exporter's {what} {}", path.display()))
}

fn tonic_tls(c: &OtlpTelemetryExporter) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    if !c.endpoint.expose().starts_with("https://") {
        return Ok(None);
    }
    let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
    if let Some(ca) = &c.tls.ca_file {
        tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(read(ca, "ca_file")?));
    }
    if let (Some(cert), Some(key)) = (&c.tls.cert_file, &c.tls.key_file) {
        tls = tls.identity(tonic::transport::Identity::from_pem(read(cert, "cert_file")?, read(key, "key_file")?));
    }
    Ok(Some(tls))
}

fn metadata(c: &OtlpTelemetryExporter) -> anyhow::Result<tonic::metadata::MetadataMap> {
    let mut m = tonic::metadata::MetadataMap::new();
    for (k, v) in &c.headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .map_err(|e| anyhow!("telemetry exporter header {k:?}: {e}"))?;
        let val = v.expose().parse().map_err(|e| anyhow!("telemetry exporter header {k:?}: {e}"))?;
        m.insert(key, val);
    }
    Ok(m)
}

fn http_client(c: &OtlpTelemetryExporter) -> anyhow::Result<RuntimeHttpClient> {
    let mut b = reqwest::Client::builder().timeout(c.timeout);
    if let Some(ca) = &c.tls.ca_file {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(&read(ca, "ca_file")?)?);
    }
    if let (Some(cert), Some(key)) = (&c.tls.cert_file, &c.tls.key_file) {
        let mut pem = read(cert, "cert_file")?;
        pem.extend_from_slice(&read(key, "key_file")?);
        b = b.identity(reqwest::Identity::from_pem(&pem)?);
    }
    Ok(RuntimeHttpClient { client: b.build()?, runtime: tokio::runtime::Handle::current() })
}

fn headers(c: &OtlpTelemetryExporter) -> std::collections::HashMap<String, String> {
    c.headers.iter().map(|(k, v)| (k.clone(), v.expose().to_owned())).collect()
}

/// Builds one exporter for either transport. Call inside the tokio runtime:
/// the gRPC channel and the HTTP client run their I/O on it.
macro_rules! build_exporter {
    ($builder:expr, $c:expr, $signal:expr) => {{
        let c: &OtlpTelemetryExporter = $c;
        let ep = endpoint(c, $signal);
        let built = match c.protocol {
            OtlpProtocol::Grpc => {
                let mut b = $builder
                    .with_tonic()
                    .with_endpoint(ep.expose())
                    .with_timeout(c.timeout)
                    .with_metadata(metadata(c)?);
                if let Some(tls) = tonic_tls(c)? {
                    b = b.with_tls_config(tls);
                }
                b.build()
            }
            OtlpProtocol::HttpProtobuf => $builder
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(ep.expose())
                .with_timeout(c.timeout)
                .with_headers(headers(c))
                .with_http_client(http_client(c)?)
                .build(),
        };
        let e = built.with_context(|| format!("cannot build the {} exporter to {ep}", $signal.name()))?;
        Contained::new(e, $signal, &ep)
    }};
}

pub(super) fn metric_exporter(
    c: &OtlpTelemetryExporter,
) -> anyhow::Result<Contained<opentelemetry_otlp::MetricExporter>> {
    Ok(build_exporter!(opentelemetry_otlp::MetricExporter::builder(), c, Signal::Metrics))
}

pub(super) fn log_exporter(c: &OtlpTelemetryExporter) -> anyhow::Result<Contained<opentelemetry_otlp::LogExporter>> {
    Ok(build_exporter!(opentelemetry_otlp::LogExporter::builder(), c, Signal::Logs))
}

pub(super) fn span_exporter(c: &OtlpTelemetryExporter) -> anyhow::Result<Contained<opentelemetry_otlp::SpanExporter>> {
    Ok(build_exporter!(opentelemetry_otlp::SpanExporter::builder(), c, Signal::Traces))
}

const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// reqwest's async client driven on the collector's runtime, so the SDK's
/// background threads (which are not tokio threads) can await it.
#[derive(Debug, Clone)]
struct RuntimeHttpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for RuntimeHttpClient {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let request = reqwest::Request::try_from(request)?;
            let mut response = client.execute(request).await?;
            let mut out = http::Response::builder().status(response.status());
            for (k, v) in response.headers() {
                out = out.header(k, v);
            }
            // An OTLP answer is small; past 4 MiB the rest is not read (the
            // SDK reads only the status and the partial success).
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, opentelemetry_http::HttpError>(out.body(bytes::Bytes::from(body))?)
        });
        task.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(protocol: OtlpProtocol, endpoint: &str) -> OtlpTelemetryExporter {
        OtlpTelemetryExporter {
            protocol,
            endpoint: endpoint.into(),
            headers: Default::default(),
            timeout: Duration::from_secs(1),
            tls: Default::default(),
        }
    }

    #[test]
    fn http_endpoints_get_the_signal_path_only_without_one() {
        let h = OtlpProtocol::HttpProtobuf;
        assert_eq!(endpoint(&cfg(h, "http://c:4318"), Signal::Metrics).expose(), "http://c:4318/v1/metrics");
        assert_eq!(endpoint(&cfg(h, "http://c:4318/"), Signal::Logs).expose(), "http://c:4318/v1/logs");
        assert_eq!(endpoint(&cfg(h, "http://c:4318/custom/logs"), Signal::Logs).expose(), "http://c:4318/custom/logs");
        assert_eq!(endpoint(&cfg(OtlpProtocol::Grpc, "http://c:4317"), Signal::Traces).expose(), "http://c:4317");
    }

    #[test]
    fn credentials_in_the_endpoint_are_sent_but_never_logged() {
        let c = cfg(OtlpProtocol::HttpProtobuf, "https://tenant:s3cret@otel.example:4318");
        let ep = endpoint(&c, Signal::Metrics);
        assert_eq!(ep.expose(), "https://tenant:s3cret@otel.example:4318/v1/metrics");
        let logged = Contained::new((), Signal::Metrics, &ep).endpoint;
        assert_eq!(logged, "https://tenant:[REDACTED]@otel.example:4318/v1/metrics");
        assert!(!format!("{ep} {ep:?} {:?}", c).contains("s3cret"));
    }
}
