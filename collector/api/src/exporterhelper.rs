//! Settings of the wrapper the host puts around every exporter (what the OTel
//! Collector calls exporterhelper): a bounded sending queue, retry with
//! exponential backoff on retryable errors, and a per-attempt timeout.
//!
//! The keys `timeout`, `retry_on_failure` and `sending_queue` of an exporter's
//! section belong to the host; [`split`] takes them out before the rest goes
//! to the exporter's factory.

use crate::config::{decode, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The host-owned keys of an exporter section.
pub const KEYS: [&str; 3] = ["timeout", "retry_on_failure", "sending_queue"];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExporterHelperConfig {
    /// Per-attempt timeout of one export call.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub retry_on_failure: RetryConfig,
    pub sending_queue: QueueConfig,
}

impl Default for ExporterHelperConfig {
    fn default() -> Self {
        ExporterHelperConfig {
            timeout: Duration::from_secs(5),
            retry_on_failure: RetryConfig::default(),
            sending_queue: QueueConfig::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    pub enabled: bool,
    #[serde(with = "humantime_serde")]
    pub initial_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub max_interval: Duration,
    /// Give up on a batch after this long; 0 retries forever.
    #[serde(with = "humantime_serde")]
    pub max_elapsed_time: Duration,
    pub multiplier: f64,
    /// Jitter: each wait is drawn from interval × [1 − f, 1 + f].
    pub randomization_factor: f64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            enabled: true,
            initial_interval: Duration::from_secs(5),
            max_interval: Duration::from_secs(30),
            max_elapsed_time: Duration::from_secs(300),
            multiplier: 1.5,
            randomization_factor: 0.5,
        }
    }
}

/// What `queue_size` counts (the OTel Collector's `sending_queue.sizer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sizer {
    /// Batches.
    #[default]
    Requests,
    /// Samples.
    Items,
    /// Bytes of the batches in memory as the queue holds them
    /// ([`crate::Profiles::memory_size`]), not their wire size.
    Bytes,
}

impl Sizer {
    pub fn as_str(self) -> &'static str {
        match self {
            Sizer::Requests => "requests",
            Sizer::Items => "items",
            Sizer::Bytes => "bytes",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    pub enabled: bool,
    /// The unit of `queue_size`.
    pub sizer: Sizer,
    /// Capacity, in the unit of `sizer`: what the queue holds, batches
    /// waiting and batches being sent alike.
    pub queue_size: u64,
    /// Concurrent export calls draining the queue.
    pub num_consumers: usize,
    /// When full: wait (true) or drop the batch and count it (false).
    pub block_on_overflow: bool,
    /// Directory of the persistent queue; batches are written here before
    /// they are acknowledged upstream and replayed after a restart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<PathBuf>,
    /// Bound of the persistent queue on disk.
    pub max_storage_bytes: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            enabled: true,
            sizer: Sizer::Requests,
            queue_size: 1000,
            num_consumers: 10,
            block_on_overflow: false,
            storage: None,
            max_storage_bytes: 256 << 20,
        }
    }
}

/// An exporter section without the host-owned keys.
pub fn without_host_keys(raw: &serde_yaml::Value) -> serde_yaml::Value {
    match raw {
        serde_yaml::Value::Mapping(m) => serde_yaml::Value::Mapping(
            m.iter()
                .filter(|(k, _)| !k.as_str().is_some_and(|k| KEYS.contains(&k)))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Splits an exporter section into (host settings, the exporter's own section).
pub fn split(raw: &serde_yaml::Value) -> Result<(ExporterHelperConfig, serde_yaml::Value), ConfigError> {
    let serde_yaml::Value::Mapping(m) = raw else {
        return Ok((ExporterHelperConfig::default(), raw.clone()));
    };
    let mut helper = serde_yaml::Mapping::new();
    let mut rest = serde_yaml::Mapping::new();
    for (k, v) in m {
        if k.as_str().is_some_and(|k| KEYS.contains(&k)) {
            helper.insert(k.clone(), v.clone());
        } else {
            rest.insert(k.clone(), v.clone());
        }
    }
    let cfg: ExporterHelperConfig = decode(&serde_yaml::Value::Mapping(helper))?;
    let q = &cfg.sending_queue;
    if q.storage.is_some() && q.sizer != Sizer::Requests {
        return Err(ConfigError {
            path: "sending_queue.sizer".into(),
            message: format!(
                "sizer {} does not apply to a persistent queue (sending_queue.storage is set): it is bounded on \
                 disk by max_storage_bytes and holds only file names in memory; use sizer: requests or remove storage",
                q.sizer.as_str()
            ),
        });
    }
    if q.enabled && q.queue_size == 0 {
        return Err(ConfigError {
            path: "sending_queue.queue_size".into(),
            message: format!(
                "must be at least 1 ({}); to send without a queue, set sending_queue.enabled: false",
                q.sizer.as_str()
            ),
        });
    }
    Ok((cfg, serde_yaml::Value::Mapping(rest)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_otel_collector() {
        let c = ExporterHelperConfig::default();
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert_eq!(c.retry_on_failure.initial_interval, Duration::from_secs(5));
        assert_eq!(c.retry_on_failure.max_interval, Duration::from_secs(30));
        assert_eq!(c.retry_on_failure.max_elapsed_time, Duration::from_secs(300));
        assert!(c.sending_queue.enabled && !c.sending_queue.block_on_overflow);
    }

    #[test]
    fn split_takes_host_keys_out() {
        let v: serde_yaml::Value =
            serde_yaml::from_str("endpoint: x\ntimeout: 2s\nsending_queue: {queue_size: 3}").unwrap();
        let (h, rest) = split(&v).unwrap();
        assert_eq!(h.timeout, Duration::from_secs(2));
        assert_eq!(h.sending_queue.queue_size, 3);
        assert_eq!(rest, serde_yaml::from_str::<serde_yaml::Value>("endpoint: x").unwrap());
        let bad: serde_yaml::Value = serde_yaml::from_str("retry_on_failure: {enabeld: true}").unwrap();
        assert!(split(&bad).unwrap_err().message.contains("enabeld"));
    }

    #[test]
    fn sizer_names_the_unit_of_queue_size() {
        let v: serde_yaml::Value = serde_yaml::from_str("sending_queue: {sizer: bytes, queue_size: 67108864}").unwrap();
        let (h, _) = split(&v).unwrap();
        assert_eq!((h.sending_queue.sizer, h.sending_queue.queue_size), (Sizer::Bytes, 64 << 20));
        assert_eq!(ExporterHelperConfig::default().sending_queue.sizer, Sizer::Requests);
        let v: serde_yaml::Value = serde_yaml::from_str("sending_queue: {sizer: megabytes}").unwrap();
        assert!(split(&v).unwrap_err().message.contains("megabytes"));
        let v: serde_yaml::Value = serde_yaml::from_str("sending_queue: {sizer: items, storage: /tmp/q}").unwrap();
        let e = split(&v).unwrap_err();
        assert_eq!(e.path, "sending_queue.sizer");
        assert!(e.message.contains("max_storage_bytes"), "{}", e.message);
        let v: serde_yaml::Value = serde_yaml::from_str("sending_queue: {queue_size: 0}").unwrap();
        assert_eq!(split(&v).unwrap_err().path, "sending_queue.queue_size");
    }
}
