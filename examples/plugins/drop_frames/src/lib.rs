//! `drop_frames`: removes every frame whose function name matches `pattern`
//! (a regex); a sample left with no frame is dropped, and a batch left with
//! no sample is dropped whole.
//!
//! ```yaml
//! processors:
//!   wasm/drop_frames:
//!     path: examples/plugins/out/drop_frames.wasm
//!     config: { pattern: "^(std::|core::|alloc::)" }
//! ```

use profcol_plugin_sdk::{host, Batch, PluginError, Processor};
use regex::Regex;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    pattern: Option<String>,
}

pub struct DropFrames {
    pattern: Regex,
}

impl Processor for DropFrames {
    fn init(config: &str) -> Result<Self, String> {
        let cfg: Config = profcol_plugin_sdk::config(config)?;
        let pattern = cfg.pattern.ok_or("config: `pattern` (a regex of the function names to drop) is required")?;
        let pattern = Regex::new(&pattern).map_err(|e| format!("config: pattern: {e}"))?;
        Ok(DropFrames { pattern })
    }

    fn process(&mut self, mut batch: Batch) -> Result<Option<Batch>, PluginError> {
        let had_samples = !batch.is_empty();
        // Unsymbolized frames have no name to match: they stay.
        let r = batch.retain_frames(|f| !f.function_name().is_some_and(|n| self.pattern.is_match(n)));
        host::counter_add("frames_dropped", r.frames_removed);
        host::counter_add("samples_dropped", r.samples_dropped);
        if had_samples && batch.is_empty() {
            return Ok(None);
        }
        Ok(Some(batch))
    }
}

profcol_plugin_sdk::export_processor!(DropFrames);

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_plugin_sdk::harness::{cpu_batch, Harness};

    fn names(b: &Batch) -> Vec<Vec<String>> {
        b.samples().map(|s| s.frames().map(|f| f.function_name().unwrap_or("?").to_owned()).collect()).collect()
    }

    #[test]
    fn drops_matching_frames_and_emptied_samples() {
        let input = cpu_batch();
        let mut h = Harness::<DropFrames>::processor(r#"{"pattern": "^(alloc::|__memcpy|main$)"}"#).unwrap();
        let out = h.process(&input).unwrap().expect("samples are left");
        for frames in names(&out) {
            assert!(
                frames.iter().all(|n| !n.starts_with("alloc::") && !n.starts_with("__memcpy") && n != "main"),
                "{frames:?}"
            );
        }
        // The one sample whose only frames were [vec_push, ... main] still has app::work;
        // nothing in the fixture is left empty except the sample that had no frame to begin with.
        assert_eq!(out.sample_count(), input.sample_count());
        let before: usize = input.samples().map(|s| s.frames().count()).sum();
        let after: usize = out.samples().map(|s| s.frames().count()).sum();
        let rec = h.recorded();
        assert_eq!(rec.counters["frames_dropped"], (before - after) as u64);
        assert_eq!(rec.counters["samples_dropped"], 0);
        // Everything else is kept: values, timestamps, attributes, kernel frames.
        for (a, b) in input.samples().zip(out.samples()) {
            assert_eq!(a.values(), b.values());
            assert_eq!(a.timestamps_unix_nano(), b.timestamps_unix_nano());
            assert_eq!(a.attributes().collect::<Vec<_>>(), b.attributes().collect::<Vec<_>>());
        }
        assert!(names(&out).iter().flatten().any(|n| n == "do_syscall_64"));
    }

    #[test]
    fn a_sample_left_with_no_frame_is_dropped() {
        let input = cpu_batch();
        // The python sample is [do_syscall_64, main].
        let mut h = Harness::<DropFrames>::processor(r#"{"pattern": "^(do_syscall_64|main)$"}"#).unwrap();
        let out = h.process(&input).unwrap().unwrap();
        assert_eq!(out.sample_count(), input.sample_count() - 1);
        assert_eq!(h.recorded().counters["samples_dropped"], 1);
        // The sample that had no frame to begin with is still there.
        assert!(out.samples().any(|s| s.frames().count() == 0));
    }

    #[test]
    fn a_batch_left_with_no_sample_is_dropped() {
        let mut h = Harness::<DropFrames>::processor(r#"{"pattern": "."}"#).unwrap();
        // An unsymbolized frame has no name to match: its sample stays.
        let out = h.process(&cpu_batch()).unwrap().unwrap();
        let left: Vec<_> =
            out.samples().filter_map(|s| s.frames().next()).map(|f| f.mapping().unwrap().filename).collect();
        assert_eq!(left, ["/usr/lib/x86_64-linux-gnu/libssl.so.3"]);
        let mut named = cpu_batch();
        named.retain_samples(|s| s.frames().count() > 0 && s.frames().all(|f| f.function_name().is_some()));
        assert_eq!(h.process(&named).unwrap(), None);
    }

    #[test]
    fn bad_config_says_what_is_wrong() {
        let e = Harness::<DropFrames>::processor(r#"{"pattern": "("}"#).err().unwrap();
        assert!(e.contains("pattern") && e.contains("unclosed"), "{e}");
        let e = Harness::<DropFrames>::processor("null").err().unwrap();
        assert!(e.contains("`pattern`") && e.contains("required"), "{e}");
        let e = Harness::<DropFrames>::processor(r#"{"patern": "x"}"#).err().unwrap();
        assert!(e.contains("unknown field `patern`"), "{e}");
    }
}
