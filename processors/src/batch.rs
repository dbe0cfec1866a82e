//! `batch` processor: merges incoming batches until `send_batch_size` samples
//! (observations, as every count of samples) are held or `timeout` passes, so
//! exporters make fewer, larger requests.

use async_trait::async_trait;
use profcol_api::component::{factory, Component, Factory, FactoryMeta, Kind, Stability};
use profcol_api::{ComponentError, ProcessError, ProcessOutcome, Processor, Profiles, ProfilesBuilder};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct BatchConfig {
    /// Send once this many samples (observations) are held.
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

pub(crate) fn factory_batch() -> Arc<dyn Factory> {
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
    held: Mutex<Option<Held>>,
}

/// What the processor holds: the batches so far and their observations
/// (counted per incoming batch, so a merge never recounts what is held).
struct Held {
    merged: Merged,
    samples: usize,
}

/// A first batch is held as it came: forwarded alone it needs no rebuild,
/// and a second one is merged into it (its dictionary indexed in place,
/// not interned again into an empty one).
enum Merged {
    One(Box<Profiles>),
    Many(Box<ProfilesBuilder>),
}

impl Merged {
    fn add(self, batch: Profiles) -> Merged {
        let mut b = match self {
            Merged::One(first) => Box::new(ProfilesBuilder::from_profiles(*first)),
            Merged::Many(b) => b,
        };
        b.append(batch);
        Merged::Many(b)
    }

    fn build(self) -> Profiles {
        match self {
            Merged::One(p) => *p,
            Merged::Many(b) => b.build(),
        }
    }
}

#[async_trait]
impl Processor for Batch {
    async fn process(&self, batch: Profiles) -> Result<ProcessOutcome, ProcessError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let samples = batch.sample_count();
        let h = match held.take() {
            None => Held { merged: Merged::One(Box::new(batch)), samples },
            Some(h) => Held { merged: h.merged.add(batch), samples: h.samples.saturating_add(samples) },
        };
        if h.samples >= self.cfg.send_batch_size {
            return Ok(ProcessOutcome::Forward(h.merged.build()));
        }
        *held = Some(h);
        Ok(ProcessOutcome::Held)
    }

    /// Counts, merges and builds through `Profiles` and its builder, which
    /// keep packed samples packed.
    fn reads_packed(&self) -> bool {
        true
    }

    fn flush_interval(&self) -> Option<Duration> {
        Some(self.cfg.timeout)
    }

    async fn flush(&self) -> Result<Option<Profiles>, ComponentError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        Ok(held.take().map(|h| h.merged.build()).filter(|p| !p.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::model::{canonical, pb, AttrValue, ProfileMeta};

    fn batch(n: usize, tid: i64) -> Profiles {
        weighted(n, tid, ("samples", "count"), 1)
    }

    /// `n` Sample messages of one data point `value` each, of `sample_type`.
    fn weighted(n: usize, tid: i64, sample_type: (&str, &str), value: i64) -> Profiles {
        let mut b = ProfilesBuilder::new();
        let r = b.resource(Default::default());
        let p = b.profile(r, &ProfileMeta { sample_type, ..Default::default() });
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
                    values: vec![value],
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

    #[tokio::test]
    async fn send_batch_size_counts_observations_not_sample_messages() {
        let p =
            Batch { cfg: BatchConfig { send_batch_size: 10, timeout: Duration::from_secs(1) }, held: Mutex::new(None) };
        // Two Sample messages of 5 observations each: 10 samples, sent at once.
        let heavy = weighted(2, 1, ("samples", "count"), 5);
        assert_eq!((heavy.sample_messages(), heavy.sample_count()), (2, 10));
        let ProcessOutcome::Forward(out) = p.process(heavy).await.unwrap() else { panic!("10 samples >= 10") };
        assert_eq!(out.sample_count(), 10);
        // Nanoseconds are not observations: 9 data points of 1 ms are 9 samples.
        let cpu_ns = weighted(9, 2, ("cpu", "nanoseconds"), 1_000_000);
        assert_eq!(cpu_ns.sample_count(), 9);
        assert!(matches!(p.process(cpu_ns).await.unwrap(), ProcessOutcome::Held));
        let ProcessOutcome::Forward(out) = p.process(batch(1, 3)).await.unwrap() else { panic!("9 + 1 >= 10") };
        assert_eq!((out.sample_messages(), out.sample_count()), (10, 10));
    }
}
