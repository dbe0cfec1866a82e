//! `batch` processor: merges incoming batches until `send_batch_size` samples
//! are held or `timeout` passes, so exporters make fewer, larger requests.

use async_trait::async_trait;
use profcol_api::component::{factory, Component, Factory, FactoryMeta, Kind, Stability};
use profcol_api::{ComponentError, ProcessError, ProcessOutcome, Processor, Profiles, ProfilesBuilder};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Send once this many samples are held.
    pub send_batch_size: usize,
    /// Send what is held at least this often.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub timeout: Duration,
}

impl profcol_api::config::Validate for BatchConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        p.check(
            "timeout",
            profcol_api::config::checks::positive(self.timeout, "a held batch is sent after it; default 200ms"),
        );
        if self.send_batch_size == 0 {
            p.add("send_batch_size", "must be at least 1 sample (default 8192)");
        }
    }
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig { send_batch_size: 8192, timeout: Duration::from_millis(200) }
    }
}

pub fn factory_batch() -> Arc<dyn Factory> {
    factory::<BatchConfig, _>(
        FactoryMeta {
            type_name: "batch",
            kind: Kind::Processor,
            stability: Stability::Beta,
            description: "merges batches up to send_batch_size samples or timeout",
        },
        |_set, cfg: BatchConfig| Ok(Component::Processor(Arc::new(Batch { cfg, held: Mutex::new(None) }))),
    )
}

struct Batch {
    cfg: BatchConfig,
    /// Batches merged so far, interned into one dictionary.
    held: Mutex<Option<ProfilesBuilder>>,
}

#[async_trait]
impl Processor for Batch {
    async fn process(&self, batch: Profiles) -> Result<ProcessOutcome, ProcessError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let b = held.get_or_insert_with(ProfilesBuilder::new);
        b.append(batch);
        if b.sample_count() >= self.cfg.send_batch_size {
            if let Some(full) = held.take() {
                return Ok(ProcessOutcome::Forward(full.build()));
            }
        }
        Ok(ProcessOutcome::Held)
    }

    fn flush_interval(&self) -> Option<Duration> {
        Some(self.cfg.timeout)
    }

    async fn flush(&self) -> Result<Option<Profiles>, ComponentError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        Ok(held.take().map(ProfilesBuilder::build).filter(|p| !p.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::model::{canonical, pb, AttrValue, ProfileMeta};

    fn batch(n: usize, tid: i64) -> Profiles {
        let mut b = ProfilesBuilder::new();
        let r = b.resource(Default::default());
        let p = b.profile(r, &ProfileMeta { sample_type: ("samples", "count"), ..Default::default() });
        let f = b.function(&format!("f{tid}"), "", "", 0);
        let l = b.location(pb::Location {
            address: 16,
            lines: vec![pb::Line { function_index: f, line: 0, column: 0 }],
            ..Default::default()
        });
        let st = b.stack(&[l]);
        let a = b.attribute("thread.id", AttrValue::Int(tid));
        for i in 0..n {
            b.sample(
                p,
                pb::Sample {
                    stack_index: st,
                    attribute_indices: vec![a],
                    values: vec![1],
                    timestamps_unix_nano: vec![i as u64],
                    ..Default::default()
                },
            );
        }
        b.build()
    }

    #[tokio::test]
    async fn merges_until_size_then_flushes_the_rest() {
        let p =
            Batch { cfg: BatchConfig { send_batch_size: 10, timeout: Duration::from_secs(1) }, held: Mutex::new(None) };
        let (a, b, c) = (batch(6, 1), batch(6, 2), batch(3, 3));
        let mut want = canonical::samples(&a);
        want.extend(canonical::samples(&b));
        want.sort();
        assert!(matches!(p.process(a).await.unwrap(), ProcessOutcome::Held));
        let ProcessOutcome::Forward(out) = p.process(b).await.unwrap() else { panic!("12 samples >= 10") };
        out.validate().unwrap();
        assert_eq!(canonical::samples(&out), want);
        assert!(matches!(p.process(c.clone()).await.unwrap(), ProcessOutcome::Held));
        assert_eq!(canonical::samples(&p.flush().await.unwrap().unwrap()), canonical::samples(&c));
        assert!(p.flush().await.unwrap().is_none());
    }
}
