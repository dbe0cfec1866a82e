//! Config of the `otlp` receiver (the OTel Collector's layout).

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
    /// How many requests (gRPC and HTTP together) may be read, decoded and
    /// waiting on the pipeline at once; more wait briefly for a slot and are
    /// then told to retry (gRPC UNAVAILABLE, HTTP 503). With the size cap this
    /// bounds the receiver's memory: about `max_concurrent_requests` ×
    /// (`max_recv_msg_size_mib` + the decoded size). At least 1.
    pub max_concurrent_requests: usize,
}

impl profcol_api::config::Validate for OtlpReceiverConfig {}

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
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
}

impl Default for OtlpReceiverConfig {
    fn default() -> Self {
        OtlpReceiverConfig {
            protocols: Protocols::default(),
            backpressure_timeout: Duration::from_secs(5),
            max_concurrent_requests: 16,
        }
    }
}

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
