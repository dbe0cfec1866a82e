//! `folded_exporter`: the batch's folded stacks, one `frame;frame;... count`
//! line per distinct stack (root first, the thread or executable name at
//! the root), to the sink named `out`. The text is the `flamegraph`
//! exporter's folded text for the same batch under its defaults: both fold
//! with `profcol_model_rules::folded`.
//!
//! ```yaml
//! exporters:
//!   wasm/folded:
//!     path: examples/plugins/out/folded_exporter.wasm
//!     sinks:
//!       out: { file: profiles.folded }
//! ```

use profcol_plugin_sdk::{folded, Batch, Exporter, Output, PluginError};

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {}

pub struct FoldedExporter;

/// The sink the lines go to.
pub const SINK: &str = "out";

impl Exporter for FoldedExporter {
    fn init(config: &str) -> Result<Self, String> {
        let _: Config = profcol_plugin_sdk::config(config)?;
        Ok(FoldedExporter)
    }

    fn export(&mut self, batch: Batch) -> Result<Vec<Output>, PluginError> {
        let lines = batch.folded(true);
        // As the flamegraph exporter: nothing to draw, nothing written.
        if lines.values().all(|&n| n == 0) {
            return Ok(Vec::new());
        }
        profcol_plugin_sdk::host::counter_add("stacks", lines.len() as u64);
        Ok(vec![Output {
            sink: SINK.into(),
            content_type: "text/plain".into(),
            data: folded::text(&lines).into_bytes(),
        }])
    }
}

profcol_plugin_sdk::export_exporter!(FoldedExporter);

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_plugin_sdk::harness::{cpu_batch, Harness};

    #[test]
    fn one_line_per_distinct_stack_to_out() {
        let batch = cpu_batch();
        let mut h = Harness::<FoldedExporter>::exporter("null").unwrap();
        let out = h.export(&batch).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].sink.as_str(), out[0].content_type.as_str()), ("out", "text/plain"));
        let text = String::from_utf8(out[0].data.clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 7, "{text}");
        // Every observation is counted once: 8 values in 7 samples.
        let total: u64 = lines.iter().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
        assert_eq!(total, 8);
        assert!(lines.contains(&"app-worker;main;app::work;alloc::vec::Vec<T>::push 2"), "{text}");
        assert_eq!(h.recorded().counters["stacks"], 7);
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        let mut h = Harness::<FoldedExporter>::exporter("{}").unwrap();
        assert_eq!(h.export(&Batch::default()).unwrap(), vec![]);
        assert!(Harness::<FoldedExporter>::exporter(r#"{"sink": "x"}"#).is_err());
    }
}
