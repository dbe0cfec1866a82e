//! The plugin host's series, `profcol_plugin_*{component, ...}`, the same
//! for processor and exporter plugins (scoped `plugin`, whatever the kind).

use profcol_api::component::Kind;
use profcol_api::telemetry::MetricDef;

pub(crate) const COMPILES: MetricDef = MetricDef::counter(
    "compiles_total",
    "1",
    "Plugin loads, by where the compiled code came from (cache: no compile).",
)
.by("source")
.under("plugin");
pub(crate) const CALLS: MetricDef =
    MetricDef::counter("calls_total", "1", "Plugin calls, by outcome.").by("outcome").under("plugin");
pub(crate) const FAILURES: MetricDef =
    MetricDef::counter("failures_total", "1", "Plugin failures, by kind.").by("kind").under("plugin");
pub(crate) const DISABLED: MetricDef =
    MetricDef::gauge("disabled", "1", "1 while the plugin is disabled after repeated failures.").under("plugin");
pub(crate) const CALL_DURATION: MetricDef =
    MetricDef::timer("call_duration_seconds", "Time of plugin calls (on the blocking pool).").under("plugin");

/// The full name of a plugin series (scoped `plugin`, so the kind given does not matter).
pub(crate) fn series(def: &MetricDef) -> String {
    def.full_name(Kind::Processor)
}

/// What a plugin adds through `counter-add`: `profcol_plugin_counter_total{component, name}`.
pub(crate) const COUNTER: MetricDef =
    MetricDef::counter("counter_total", "1", "Counts a plugin added through counter-add.").by("name").under("plugin");

/// What an exporter plugin keeps for the retry of sinks that failed.
pub(crate) const PENDING_OUTPUT_BYTES: MetricDef = MetricDef::gauge(
    "pending_output_bytes",
    "bytes",
    "Bytes of an exporter plugin's output kept for the retry of sinks that failed.",
)
.under("plugin");

/// The wasm exporter's series: the host's, then what it keeps for retries.
pub(crate) const EXPORTER: &[MetricDef] =
    &[COMPILES, CALLS, FAILURES, DISABLED, CALL_DURATION, COUNTER, PENDING_OUTPUT_BYTES];

/// The wasm processor's series: the host's (the exporter's but its last).
pub(crate) const PROCESSOR: &[MetricDef] = EXPORTER.split_at(EXPORTER.len() - 1).0;
