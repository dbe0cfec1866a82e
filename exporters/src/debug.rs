//! `debug` exporter: logs batches. `basic`: one summary line per batch;
//! `detailed`: every sample with its frames.

use async_trait::async_trait;
use profcol_api::component::{factory, Component, Factory, FactoryMeta, Kind, Stability};
use profcol_api::{ExportError, Exporter, Profiles};
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use std::sync::Arc;
use tracing::info;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DebugExporterConfig {
    /// `basic`: one line per batch; `detailed`: every sample.
    pub verbosity: Verbosity,
}

impl profcol_api::config::Validate for DebugExporterConfig {}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verbosity {
    #[default]
    Basic,
    Detailed,
}

pub fn factory_debug() -> Arc<dyn Factory> {
    factory::<DebugExporterConfig, _>(
        FactoryMeta {
            type_name: "debug",
            kind: Kind::Exporter,
            stability: Stability::Beta,
            description: "logs one summary line per batch (basic) or every sample with its frames (detailed)",
        },
        |set, cfg: DebugExporterConfig| {
            Ok(Component::Exporter(Arc::new(DebugExporter { cfg, id: set.id.to_string() })))
        },
    )
}

struct DebugExporter {
    cfg: DebugExporterConfig,
    id: String,
}

/// One line: resources, profiles, samples (observations), Sample messages,
/// dictionary sizes, then the samples of each sample type (and the sum of
/// the values of types that are not counts: an `off_cpu` profile's time).
pub fn summary(batch: &Profiles) -> String {
    let d = batch.dictionary();
    let n = |f: fn(&profcol_api::model::pb::ProfilesDictionary) -> usize| d.map(f).unwrap_or(0).saturating_sub(1);
    let mut types: std::collections::BTreeMap<(&str, &str), (u64, i64)> = Default::default();
    for s in batch.samples() {
        let t = s.sample_type();
        let counts_events = t.1 == "count";
        let e = types.entry(t).or_default();
        e.0 += profcol_api::model::observations(s.sample, counts_events);
        if !counts_events {
            e.1 = e.1.saturating_add(s.sample.values.iter().sum());
        }
    }
    let types: Vec<String> = types
        .into_iter()
        .map(|((t, u), (n, sum))| if u == "count" { format!("{t}/{u}:{n}") } else { format!("{t}/{u}:{n}({sum})") })
        .collect();
    format!(
        "resources={} profiles={} samples={} sample_messages={} stacks={} locations={} functions={} mappings={} \
         types={}",
        batch.0.resource_profiles.len(),
        batch.profiles().count(),
        batch.sample_count(),
        batch.sample_messages(),
        n(|d| d.stack_table.len()),
        n(|d| d.location_table.len()),
        n(|d| d.function_table.len()),
        n(|d| d.mapping_table.len()),
        types.join(","),
    )
}

/// Every sample: values, attributes, then one indented line per frame.
pub fn detailed(batch: &Profiles) -> String {
    let mut out = String::new();
    for (i, s) in batch.samples().enumerate() {
        let attrs: Vec<String> = s.attributes().map(|(k, v)| format!("{k}={}", show(v))).collect();
        let _ = writeln!(
            out,
            "sample {i}: values={:?} timestamps={:?} {}",
            s.sample.values,
            s.sample.timestamps_unix_nano,
            attrs.join(" ")
        );
        for f in s.frames() {
            let name = f.function_name().unwrap_or("?");
            let _ = writeln!(out, "    {:#018x} {name} [{}]", f.location.address, f.mapping_filename());
        }
    }
    out
}

fn show(v: Option<&profcol_api::model::AnyValue>) -> String {
    use profcol_api::model::any_value::Value as V;
    match v.and_then(|v| v.value.as_ref()) {
        Some(V::StringValue(s)) => s.clone(),
        Some(V::IntValue(i)) => i.to_string(),
        Some(V::BoolValue(b)) => b.to_string(),
        Some(V::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[async_trait]
impl Exporter for DebugExporter {
    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        info!(exporter = %self.id, "{}", summary(batch));
        if self.cfg.verbosity == Verbosity::Detailed {
            info!(exporter = %self.id, "\n{}", detailed(batch));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::model::pb;

    #[test]
    fn the_summary_counts_samples_per_type_and_sums_times() {
        let (mut b, stack, cpu, off) = crate::test_batches::cpu_and_off_cpu();
        b.sample(cpu, pb::Sample { stack_index: stack, values: vec![4], ..Default::default() });
        b.sample(
            off,
            pb::Sample {
                stack_index: stack,
                values: vec![5, 7],
                timestamps_unix_nano: vec![1, 2],
                ..Default::default()
            },
        );
        let line = summary(&b.build());
        assert!(line.ends_with(" types=off_cpu/nanoseconds:2(12),samples/count:4"), "{line}");
    }
}
