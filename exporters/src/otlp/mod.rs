//! OTLP profiles exporters: `otlp` (gRPC, alias `otlp_grpc`) and `otlp_http`.
//!
//! Both send the batch's bytes as they are (the data model *is*
//! `ProfilesData`), and sort failures the way OTLP senders do:
//! gRPC `UNAVAILABLE` / `RESOURCE_EXHAUSTED` and HTTP 429/502/503/504 (and
//! connection failures) are retryable, honouring the server's `RetryInfo` /
//! `Retry-After`; everything else is permanent, logged and counted.
//! `partial_success` answers are logged and counted.
//!
//! Only the send lives here: the host owns `timeout`, `retry_on_failure` and
//! `sending_queue` around [`profcol_api::Exporter::export`].

pub mod grpc;
pub mod http;
pub mod status;

use profcol_api::model::ExportProfilesPartialSuccess;
use profcol_api::telemetry::{ComponentTelemetry, Counter};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub use grpc::{OtlpGrpcConfig, OtlpGrpcExporter};
pub use http::{HttpEncoding, OtlpHttpConfig, OtlpHttpExporter};

/// `compression: gzip | none`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    Gzip,
    None,
}

/// Client-side TLS (rustls).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTlsConfig {
    /// Plain text (no TLS) even without an `http://` scheme (gRPC only; for
    /// HTTP the scheme of the endpoint decides).
    pub insecure: bool,
    /// CA certificates (PEM) to trust instead of the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs `key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// Name to check the server's certificate against (default: the endpoint's
    /// host). gRPC only: `otlp_http` refuses it (put that name in the endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name_override: Option<String>,
}

impl ClientTlsConfig {
    pub(crate) fn read(path: &std::path::Path, what: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| format!("tls.{what}: cannot read {}: {e}", path.display()))
    }

    /// Refuses TLS settings on a plain-text endpoint: ignoring them would send
    /// in clear text what the config meant to protect.
    pub(crate) fn check_plaintext(&self, endpoint: &str) -> Result<(), String> {
        let set = [
            ("ca_file", self.ca_file.is_some()),
            ("cert_file", self.cert_file.is_some()),
            ("key_file", self.key_file.is_some()),
            ("server_name_override", self.server_name_override.is_some()),
        ];
        match set.iter().find(|(_, on)| *on) {
            Some((key, _)) => Err(format!(
                "tls.{key} is set but endpoint {endpoint:?} is plain text (http://, or tls.insecure); \
                 use https:// or remove the tls settings"
            )),
            None => Ok(()),
        }
    }

    /// (CA PEM, (cert PEM, key PEM)) read from the files, checked for pairs.
    #[allow(clippy::type_complexity)]
    pub(crate) fn load(&self) -> Result<(Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>), String> {
        let ca = self.ca_file.as_deref().map(|p| Self::read(p, "ca_file")).transpose()?;
        let id = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => Some((Self::read(c, "cert_file")?, Self::read(k, "key_file")?)),
            (None, None) => None,
            _ => return Err("tls.cert_file and tls.key_file must be given together".into()),
        };
        Ok((ca, id))
    }
}

/// `e` and its sources, `: `-separated.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    push_causes(&mut s, e.source());
    s
}

/// Appends the messages of `cause` and its sources that `s` does not already say.
pub(crate) fn push_causes(s: &mut String, mut cause: Option<&dyn std::error::Error>) {
    while let Some(c) = cause {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cause = c.source();
    }
}

/// Most bytes of a server's answer that are read: an answer is a short
/// status or `partial_success`, and a broken or hostile server streaming an
/// endless body must not grow our memory.
pub(crate) const MAX_ANSWER_BYTES: usize = 4 << 20;

/// The body of `resp`, up to `cap` bytes (the rest is not read); a body cut
/// short by the connection is what arrived.
pub(crate) async fn read_answer(mut resp: reqwest::Response, cap: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = cap.saturating_sub(out.len());
        if chunk.len() >= room {
            out.extend_from_slice(&chunk[..room]);
            break;
        }
        out.extend_from_slice(&chunk);
    }
    out
}

/// Header names and values checked once, at creation.
pub(crate) fn check_headers(headers: &BTreeMap<String, profcol_api::config::Secret>) -> Result<(), String> {
    for (k, v) in headers {
        ::http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|e| format!("headers: {k:?} is not a valid header name: {e}"))?;
        // The value's own error would echo the secret.
        ::http::HeaderValue::from_str(v.expose())
            .map_err(|_| format!("headers.{k}: not a valid header value (visible ASCII only)"))?;
    }
    Ok(())
}

/// Counters both OTLP exporters keep besides the host's.
#[derive(Clone)]
pub(crate) struct OtlpCounters {
    pub rejected_profiles: Counter,
    pub partial_success: Counter,
    pub permanent_errors: Counter,
    pub retryable_errors: Counter,
}

impl OtlpCounters {
    pub(crate) fn new(t: &ComponentTelemetry) -> Self {
        OtlpCounters {
            rejected_profiles: t
                .counter("rejected_profiles_total", "Profiles the backend rejected in a partial_success answer."),
            partial_success: t.counter("partial_success_total", "Export answers that carried a partial_success."),
            permanent_errors: t.counter("permanent_errors_total", "Export attempts that failed for good."),
            retryable_errors: t.counter("retryable_errors_total", "Export attempts that failed and may be retried."),
        }
    }

    pub(crate) fn partial(&self, id: &str, p: &ExportProfilesPartialSuccess) {
        let (rejected, msg) = (p.rejected_profiles, p.error_message.as_str());
        if rejected == 0 && msg.is_empty() {
            return;
        }
        self.partial_success.inc();
        self.rejected_profiles.add(rejected.max(0) as u64);
        tracing::warn!(exporter = %id, rejected_profiles = rejected, "the backend accepted the batch only in part: {msg}");
    }

    pub(crate) fn count(&self, id: &str, e: &profcol_api::ExportError) {
        match e {
            profcol_api::ExportError::Retryable { .. } => {
                self.retryable_errors.inc();
                tracing::debug!(exporter = %id, "export failed, retryable: {e}");
            }
            profcol_api::ExportError::Permanent { .. } => {
                self.permanent_errors.inc();
                tracing::error!(exporter = %id, "export failed: {e}");
            }
        }
    }
}
