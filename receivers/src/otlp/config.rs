//! Config of the `otlp` receiver (the OTel Collector's layout).

use profcol_api::config::{checks, Problems, Validate};
use serde::{Deserialize, Deserializer, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// `receivers: otlp: ...`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpReceiverConfig {
    pub protocols: Protocols,
    /// How long a request may wait for the pipeline to take its batch before
    /// the sender is told to retry (gRPC UNAVAILABLE, HTTP 503).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub backpressure_timeout: Duration,
    /// How many requests (gRPC and HTTP together) may be decoded and waiting
    /// on the pipeline at once; more wait briefly for a slot and are then told
    /// to retry (gRPC UNAVAILABLE, HTTP 503). Bodies still arriving hold no
    /// slot, only their bytes, out of `max_concurrent_requests` × the size
    /// cap. With the size caps this bounds the receiver's memory:
    /// `max_concurrent_requests` × (2 × `max_recv_msg_size_mib` +
    /// `max_decoded_size_mib`). At least 1.
    pub max_concurrent_requests: usize,
    /// Largest size a request may take once decoded, in MiB (fractions
    /// allowed), estimated from its bytes before it is decoded; a request over
    /// it is refused (gRPC RESOURCE_EXHAUSTED, HTTP 413) without being
    /// decoded. With the size caps and `max_concurrent_requests` it bounds
    /// the receiver's memory for any input.
    pub max_decoded_size_mib: f64,
    /// How long a request's body may take to arrive; a sender that has not
    /// sent it all by then is answered gRPC DEADLINE_EXCEEDED / HTTP 408. A
    /// larger body gets more time as long as it keeps up `min_read_rate_kib`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub read_timeout: Duration,
    /// The transfer rate (KiB/s) a body must keep up after its first
    /// `read_timeout` to be read further; 0 holds every body to `read_timeout`.
    pub min_read_rate_kib: f64,
}

impl Validate for OtlpReceiverConfig {
    fn validate(&self, p: &mut Problems) {
        if self.protocols.grpc.is_none() && self.protocols.http.is_none() {
            p.add("protocols", "no protocol is enabled; add `protocols: {grpc: {}}` and/or `protocols: {http: {}}`");
        }
        if let Some(g) = &self.protocols.grpc {
            p.within("protocols.grpc", |p| check_server(p, &g.endpoint, g.max_recv_msg_size_mib, g.tls.as_ref()));
        }
        if let Some(h) = &self.protocols.http {
            p.within("protocols.http", |p| check_server(p, &h.endpoint, h.max_recv_msg_size_mib, h.tls.as_ref()));
            if !h.profiles_url_path.starts_with('/') {
                p.add("protocols.http.profiles_url_path", "must start with '/' (default /v1development/profiles)");
            }
        }
        p.check(
            "backpressure_timeout",
            checks::positive(self.backpressure_timeout, "how long a request may wait for the pipeline; default 5s"),
        );
        if self.max_decoded_size_mib.is_nan() || self.max_decoded_size_mib <= 0.0 {
            p.add(
                "max_decoded_size_mib",
                format!(
                    "must be a positive number of MiB (fractions allowed, default {DEFAULT_MAX_DECODED_SIZE_MIB}), not {}",
                    self.max_decoded_size_mib
                ),
            );
        }
        p.check(
            "read_timeout",
            checks::positive(self.read_timeout, "how long a request's body may take to arrive; default 5s"),
        );
        if self.min_read_rate_kib.is_nan() || self.min_read_rate_kib < 0.0 {
            p.add(
                "min_read_rate_kib",
                format!(
                    "must be a number of KiB/s, 0 or more (default 64; 0 holds every body to read_timeout), not {}",
                    self.min_read_rate_kib
                ),
            );
        }
        if self.max_concurrent_requests == 0 || self.max_concurrent_requests > tokio::sync::Semaphore::MAX_PERMITS {
            p.add(
                "max_concurrent_requests",
                format!(
                    "must be between 1 and {} (default 16), not {}; it is how many requests gRPC and HTTP \
                     together may read and decode at once, and 0 would refuse every request",
                    tokio::sync::Semaphore::MAX_PERMITS,
                    self.max_concurrent_requests
                ),
            );
        }
    }
}

/// What a gRPC or HTTP server section must hold: a listen address, a
/// positive size cap, and TLS files that load.
fn check_server(p: &mut Problems, endpoint: &str, mib: f64, tls: Option<&TlsServerConfig>) {
    p.check("endpoint", checks::host_port(endpoint, true));
    // Otherwise the cap would be 1 byte and every request refused as too large.
    if mib.is_nan() || mib <= 0.0 {
        p.add(
            "max_recv_msg_size_mib",
            format!("must be a positive number of MiB (fractions allowed, default 32), not {mib}"),
        );
    }
    if let Some(t) = tls {
        p.within("tls", |p| {
            p.check("cert_file", checks::pem_certificates(&t.cert_file));
            p.check("key_file", checks::pem_private_key(&t.key_file));
            if let Some(ca) = &t.client_ca_file {
                p.check("client_ca_file", checks::pem_certificates(ca));
            }
            if p.is_empty() {
                p.check("", super::tls::load_server_config(t).map(|_| ()));
            }
        });
    }
}

/// Which servers run. A protocol is on when its key is present, even empty
/// (`grpc:`), as in the OTel Collector.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Protocols {
    #[serde(deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub grpc: Option<GrpcConfig>,
    #[serde(deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpConfig>,
}

/// A key that is present (even as `null`) turns the protocol on with defaults.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Some(Option::<T>::deserialize(d)?.unwrap_or_default()))
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcConfig {
    /// host:port to listen on.
    pub endpoint: String,
    /// Largest request accepted, in MiB (fractions allowed), after decompression.
    pub max_recv_msg_size_mib: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsServerConfig>,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig { endpoint: "localhost:4317".into(), max_recv_msg_size_mib: 32.0, tls: None }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// host:port to listen on.
    pub endpoint: String,
    /// Path of the profiles route.
    pub profiles_url_path: String,
    /// Largest request body accepted, in MiB; also the cap on the size after
    /// gzip decompression.
    pub max_recv_msg_size_mib: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsServerConfig>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            endpoint: "localhost:4318".into(),
            profiles_url_path: "/v1development/profiles".into(),
            max_recv_msg_size_mib: 32.0,
            tls: None,
        }
    }
}

/// Server-side TLS (rustls): a certificate chain and key in PEM; with
/// `client_ca_file` clients must present a certificate signed by that CA.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TlsServerConfig {
    /// Server certificate chain (PEM).
    pub cert_file: PathBuf,
    /// Private key of the certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// CA (PEM) that client certificates must chain to; set, clients must present one (mutual TLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
}

impl Default for OtlpReceiverConfig {
    fn default() -> Self {
        OtlpReceiverConfig {
            protocols: Protocols::default(),
            backpressure_timeout: Duration::from_secs(5),
            max_concurrent_requests: 16,
            max_decoded_size_mib: DEFAULT_MAX_DECODED_SIZE_MIB,
            read_timeout: Duration::from_secs(5),
            min_read_rate_kib: 64.0,
        }
    }
}

/// 4 × the default `max_recv_msg_size_mib`: real batches decode to 4–7×
/// their wire size (docs/PERFORMANCE.md), so requests of real profiles up to
/// ~20 MiB fit, while a 4 MB request of empty samples (~160 MB decoded) does not.
pub(crate) const DEFAULT_MAX_DECODED_SIZE_MIB: f64 = 128.0;

/// Bytes of `m` MiB, saturating.
pub(crate) fn mib(m: f64) -> usize {
    let b = m * 1048576.0;
    if b.is_nan() || b < 1.0 {
        1
    } else if b >= usize::MAX as f64 {
        usize::MAX
    } else {
        b as usize
    }
}
