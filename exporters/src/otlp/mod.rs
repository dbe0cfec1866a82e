//! OTLP profiles exporters: `otlp` (gRPC, alias `otlp_grpc`) and `otlp_http`,
//! one [`OtlpExporter`] over either transport.
//!
//! Both send the batch's bytes as they are (the data model *is*
//! `ProfilesData`), and sort failures the way OTLP senders do:
//! by the OTLP specification's rules (see [`status`]): gRPC CANCELLED,
//! DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS, and
//! RESOURCE_EXHAUSTED only when the server sent a RetryInfo; HTTP 429, 502,
//! 503, 504; connection failures. The server's RetryInfo / `Retry-After`
//! delay is honoured; everything else is permanent, logged and counted.
//! A `partial_success` with rejected profiles is an
//! [`ExportError::Partial`]: counted, logged, never retried.
//!
//! Only the send lives here: the host owns `timeout`, `retry_on_failure` and
//! `sending_queue` around [`profcol_api::Exporter::export`].

pub mod balancer;
mod exporter;
pub mod grpc;
pub mod http;
pub mod status;

use profcol_api::model::ExportProfilesPartialSuccess;
use profcol_api::telemetry::{ComponentTelemetry, Counter, MetricDef};
use profcol_api::{ExportError, Profiles};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

pub use balancer::{BalancerConfig, Resolver};
pub use exporter::OtlpExporter;
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
    /// Plain text (no TLS) even without an `http://` scheme (gRPC; for
    /// `otlp_http` the endpoint's scheme decides, and this only for
    /// `balancer` addresses written without one).
    pub insecure: bool,
    /// CA certificates (PEM) to trust instead of the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs `key_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS; with `cert_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// Name to check the server's certificate against (default: the endpoint's
    /// host). gRPC only: `otlp_http` refuses it (put that name in the endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name_override: Option<String>,
}

impl profcol_api::config::Validate for ClientTlsConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        use profcol_api::config::checks::{pem_certificates, pem_private_key};
        if let Some(ca) = &self.ca_file {
            p.check("ca_file", pem_certificates(ca));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => {
                p.check("cert_file", pem_certificates(c));
                p.check("key_file", pem_private_key(k));
            }
            (Some(_), None) => p.add("key_file", "is missing: cert_file and key_file must be given together"),
            (None, Some(_)) => p.add("cert_file", "is missing: cert_file and key_file must be given together"),
            (None, None) => {}
        }
    }
}

/// Header names and values, checked by `profcol validate` (values are
/// secrets: an error never shows them).
pub(crate) fn validate_headers(
    p: &mut profcol_api::config::Problems,
    headers: &BTreeMap<String, profcol_api::config::Secret>,
) {
    for (k, v) in headers {
        if ::http::HeaderName::from_bytes(k.as_bytes()).is_err() {
            p.add("headers", format!("{k:?} is not a valid header name (letters, digits and -_ only)"));
        }
        if ::http::HeaderValue::from_str(v.expose()).is_err() {
            p.add(&format!("headers.{k}"), "is not a valid header value (visible ASCII only; the value is not shown)");
        }
    }
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

/// What a partial success is measured against: the batch's samples and profiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub(crate) samples: u64,
    pub(crate) profiles: u64,
}

impl Shape {
    pub(crate) fn of(batch: &Profiles) -> Shape {
        Shape { samples: batch.sample_count() as u64, profiles: batch.profiles().count() as u64 }
    }

    /// The samples of `rejected` profiles. The server names how many
    /// profiles it rejected, not which: all samples when it rejected them
    /// all, else the batch's average per profile, rounded up (never under-counted).
    pub(crate) fn rejected_samples(self, rejected: u64) -> u64 {
        if rejected >= self.profiles {
            return self.samples;
        }
        (u128::from(self.samples) * u128::from(rejected)).div_ceil(u128::from(self.profiles.max(1))) as u64
    }
}

pub(crate) const REJECTED_PROFILES: MetricDef =
    MetricDef::counter("rejected_profiles_total", "1", "Profiles the backend rejected in a partial_success answer.");
pub(crate) const PARTIAL_SUCCESS: MetricDef =
    MetricDef::counter("partial_success_total", "1", "Export answers that carried a partial_success.");
pub(crate) const PERMANENT_ERRORS: MetricDef =
    MetricDef::counter("permanent_errors_total", "1", "Export attempts that failed for good.");
pub(crate) const RETRYABLE_ERRORS: MetricDef =
    MetricDef::counter("retryable_errors_total", "1", "Export attempts that failed and may be retried.");

/// Every series of the OTLP exporters (the balancer's only with `balancer`).
pub(crate) const METRICS: &[MetricDef] = &[
    REJECTED_PROFILES,
    PARTIAL_SUCCESS,
    PERMANENT_ERRORS,
    RETRYABLE_ERRORS,
    balancer::ENDPOINTS,
    balancer::FAILOVERS,
    balancer::RESOLVE_FAILURES,
];

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
            rejected_profiles: t.counter_of(&REJECTED_PROFILES),
            partial_success: t.counter_of(&PARTIAL_SUCCESS),
            permanent_errors: t.counter_of(&PERMANENT_ERRORS),
            retryable_errors: t.counter_of(&RETRYABLE_ERRORS),
        }
    }

    /// A `partial_success` answer: counted and logged; with rejected profiles
    /// it is an [`ExportError::Partial`] (not retried, as the OTLP spec says).
    /// An answer with only an error message is a warning on a success.
    pub(crate) fn partial(&self, id: &str, p: &ExportProfilesPartialSuccess, shape: Shape) -> Result<(), ExportError> {
        let (rejected, msg) = (p.rejected_profiles, p.error_message.as_str());
        if rejected == 0 && msg.is_empty() {
            return Ok(());
        }
        self.partial_success.inc();
        let rejected = u64::try_from(rejected).unwrap_or(0);
        self.rejected_profiles.add(rejected);
        if rejected == 0 {
            tracing::warn!(exporter = %id, "the backend accepted the batch with a warning: {msg}");
            return Ok(());
        }
        Err(ExportError::Partial {
            message: format!("the backend rejected {rejected} of {} profiles: {msg}", shape.profiles),
            rejected_samples: shape.rejected_samples(rejected),
        })
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
            // Counted and logged where the answer is read (partial_success).
            profcol_api::ExportError::Partial { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Shape;

    #[test]
    fn rejected_profiles_become_samples_never_undercounted() {
        let shape = Shape { samples: 10, profiles: 3 };
        assert_eq!(shape.rejected_samples(0), 0);
        assert_eq!(shape.rejected_samples(1), 4, "10/3 rounded up");
        assert_eq!(shape.rejected_samples(2), 7);
        assert_eq!(shape.rejected_samples(3), 10);
        assert_eq!(shape.rejected_samples(99), 10, "more than the batch has: all of it");
        assert_eq!(Shape::default().rejected_samples(1), 0);
    }
}
