//! What the plugin host's tests share: a `wasm/test` processor made by the
//! real factory, and reading its series back from the registry.
#![allow(dead_code)] // each test file uses its own part

use profcol_api::component::{Component, ComponentId, CreateSettings, Factory, Kind, ProcessOutcome, Processor};
use profcol_api::model::canonical;
use profcol_api::telemetry::Telemetry;
use profcol_api::Profiles;
use profcol_plugins::processor::ProcessorFactory;
use profcol_testkit::prelude::*;
use std::sync::Arc;

/// A `wasm/test` component made by the real factory `f` from a YAML
/// section in which `PLUGIN` stands for the path of test plugin `plugin`,
/// checked and created as the host does.
pub(crate) fn component(f: &dyn Factory, kind: Kind, plugin: &str, yaml: &str, telemetry: &Telemetry) -> Component {
    let yaml = yaml.replace("PLUGIN", test_plugin(plugin).to_str().unwrap());
    let raw = profcol_config::parse_section(&yaml).unwrap();
    f.check(&raw).unwrap();
    let id: ComponentId = "wasm/test".parse().unwrap();
    let settings = CreateSettings { telemetry: telemetry.component(kind, &id), id, services: Default::default() };
    f.create(settings, &raw).unwrap()
}

/// A `wasm/test` processor running the `misbehave` test plugin.
pub(crate) fn processor(yaml: &str, telemetry: &Telemetry) -> Arc<dyn Processor> {
    match component(&ProcessorFactory, Kind::Processor, "misbehave", yaml, telemetry) {
        Component::Processor(p) => p,
        _ => unreachable!(),
    }
}

/// The value of one series in the Prometheus text (0 when absent).
pub(crate) fn metric(t: &Telemetry, series: &str) -> u64 {
    t.render()
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0, |v| v.parse::<f64>().unwrap() as u64)
}

pub(crate) fn failures(t: &Telemetry, kind: &str) -> u64 {
    metric(t, &format!("profcol_plugin_failures_total{{component=\"wasm/test\",kind=\"{kind}\"}}"))
}

pub(crate) fn counter(t: &Telemetry, name: &str) -> Option<u64> {
    let series = format!("profcol_plugin_counter_total{{component=\"wasm/test\",name=\"{name}\"}}");
    t.render().contains(&series).then(|| metric(t, &series))
}

pub(crate) fn batch() -> Profiles {
    cpu_batch(7, 3, 40)
}

/// The batch came through unchanged (same samples, canonical form).
pub(crate) fn assert_passed(outcome: ProcessOutcome, input: &Profiles) {
    match outcome {
        ProcessOutcome::Forward(b) => assert_eq!(canonical::samples(&b), canonical::samples(input)),
        other => panic!("expected the batch to pass unchanged, got {other:?}"),
    }
}
