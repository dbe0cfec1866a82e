//! Settings of the wrapper the host puts around every exporter (what the OTel
//! Collector calls exporterhelper): a bounded sending queue, retry with
//! exponential backoff on retryable errors, and a per-attempt timeout.
//!
//! The keys `timeout`, `retry_on_failure` and `sending_queue` of an exporter's
//! section belong to the host; [`split`] takes them out before the rest goes
//! to the exporter's factory.

use profcol_api::config::{checks, schema::DurationText};
use profcol_api::config::{ConfigError, ConfigValue, Problems, Validate};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The host-owned keys of an exporter section.
pub const KEYS: [&str; 3] = ["timeout", "retry_on_failure", "sending_queue"];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExporterHelperConfig {
    /// Per-attempt timeout of one export call.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "DurationText")]
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Retry retryable errors (false: a failed batch is dropped and counted).
    pub enabled: bool,
    /// First wait before a retry.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "DurationText")]
    pub initial_interval: Duration,
    /// Cap of the wait between retries.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "DurationText")]
    pub max_interval: Duration,
    /// Give up on a batch after this long; 0 retries forever.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "DurationText")]
    pub max_elapsed_time: Duration,
    /// Growth of the wait after each retry (at least 1).
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Sizer {
    /// Batches.
    #[default]
    Requests,
    /// Samples.
    Items,
    /// Bytes of the batches in memory as the queue holds them
    /// ([`profcol_api::Profiles::memory_size`]), not their wire size.
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Queue batches between the pipeline and the exporter (false: the pipeline waits on each export).
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
    #[schemars(extend("x-profcol-creates" = "directory"))]
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

impl Validate for ExporterHelperConfig {
    fn validate(&self, p: &mut Problems) {
        p.check("timeout", checks::positive(self.timeout, "it bounds one export attempt; default 5s"));
        p.nested("retry_on_failure", &self.retry_on_failure);
        p.nested("sending_queue", &self.sending_queue);
    }
}

impl Validate for RetryConfig {
    fn validate(&self, p: &mut Problems) {
        if !self.enabled {
            return;
        }
        p.check(
            "initial_interval",
            checks::positive(self.initial_interval, "the first wait before a retry; default 5s"),
        );
        if self.max_interval < self.initial_interval {
            p.add(
                "max_interval",
                format!(
                    "must be at least initial_interval ({}); raise it or lower initial_interval",
                    humantime::format_duration(self.initial_interval)
                ),
            );
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            p.add("multiplier", format!("{} must be a number of at least 1 (default 1.5)", self.multiplier));
        }
        if !(0.0..=1.0).contains(&self.randomization_factor) {
            p.add("randomization_factor", format!("{} must be within 0 to 1 (default 0.5)", self.randomization_factor));
        }
    }
}

impl Validate for QueueConfig {
    fn validate(&self, p: &mut Problems) {
        if !self.enabled {
            return;
        }
        if self.queue_size == 0 {
            p.add(
                "queue_size",
                format!(
                    "must be at least 1 (default 1000 {}); to send without a queue set enabled: false",
                    self.sizer.as_str()
                ),
            );
        }
        if self.storage.is_some() && self.sizer != Sizer::Requests {
            p.add(
                "sizer",
                format!(
                    "sizer {} does not apply to a persistent queue (storage is set): it is bounded on disk by \
                     max_storage_bytes and holds only file names in memory; use sizer: requests or remove storage",
                    self.sizer.as_str()
                ),
            );
        }
        if self.num_consumers == 0 {
            p.add("num_consumers", "must be at least 1 (default 10)");
        }
        if let Some(dir) = &self.storage {
            p.check("storage", checks::writable_dir(dir));
            if self.max_storage_bytes == 0 {
                p.add("max_storage_bytes", "must be above 0 when storage is set (default 268435456)");
            }
        }
    }
}

/// An exporter section without the host-owned keys.
pub fn without_host_keys(raw: &ConfigValue) -> ConfigValue {
    raw.split_keys(&KEYS).1
}

/// Splits an exporter section into (host settings, the exporter's own section).
pub fn split(raw: &ConfigValue) -> Result<(ExporterHelperConfig, ConfigValue), Vec<ConfigError>> {
    let (helper, rest) = raw.split_keys(&KEYS);
    let cfg: ExporterHelperConfig = helper.decode().map_err(|e| vec![e])?;
    let mut problems = Problems::new();
    cfg.validate(&mut problems);
    if !problems.is_empty() {
        return Err(problems.into_errors());
    }
    Ok((cfg, rest))
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
        let v = ConfigValue::from(
            serde_json::json!({"endpoint": "x", "timeout": "2s", "sending_queue": {"queue_size": 3}}),
        );
        let (h, rest) = split(&v).unwrap();
        assert_eq!(h.timeout, Duration::from_secs(2));
        assert_eq!(h.sending_queue.queue_size, 3);
        assert_eq!(rest, ConfigValue::from(serde_json::json!({"endpoint": "x"})));
        let bad = ConfigValue::from(serde_json::json!({"retry_on_failure": {"enabeld": true}}));
        assert!(split(&bad).unwrap_err()[0].message.contains("enabeld"));
        let zero = ConfigValue::from(serde_json::json!({"timeout": "0s", "sending_queue": {"queue_size": 0}}));
        let paths: Vec<_> = split(&zero).unwrap_err().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["timeout", "sending_queue.queue_size"]);
    }

    #[test]
    fn sizer_names_the_unit_of_queue_size() {
        let v = ConfigValue::from(serde_json::json!({"sending_queue": {"sizer": "bytes", "queue_size": 67108864}}));
        let (h, _) = split(&v).unwrap();
        assert_eq!((h.sending_queue.sizer, h.sending_queue.queue_size), (Sizer::Bytes, 64 << 20));
        assert_eq!(ExporterHelperConfig::default().sending_queue.sizer, Sizer::Requests);
        let v = ConfigValue::from(serde_json::json!({"sending_queue": {"sizer": "megabytes"}}));
        assert!(split(&v).unwrap_err()[0].message.contains("megabytes"));
        let dir = std::env::temp_dir();
        let v = ConfigValue::from(serde_json::json!({"sending_queue": {"sizer": "items", "storage": dir}}));
        let e = split(&v).unwrap_err();
        assert_eq!(e[0].path, "sending_queue.sizer");
        assert!(e[0].message.contains("max_storage_bytes"), "{}", e[0].message);
    }
}
