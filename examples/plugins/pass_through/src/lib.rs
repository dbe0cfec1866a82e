//! `pass_through`: the smallest processor plugin. The SDK decodes the batch
//! into its resolved view and `process` hands it back unchanged, so the SDK
//! encodes it again: what a plugin that changes nothing costs through the
//! SDK (the no-op that returns its input bytes undecoded is the floor).
//!
//! ```yaml
//! processors:
//!   wasm/pass_through:
//!     path: examples/plugins/out/pass_through.wasm
//! ```

use profcol_plugin_sdk::{Batch, PluginError, Processor};

pub struct PassThrough;

impl Processor for PassThrough {
    fn init(_config: &str) -> Result<Self, String> {
        Ok(PassThrough)
    }

    fn process(&mut self, batch: Batch) -> Result<Option<Batch>, PluginError> {
        Ok(Some(batch))
    }
}

profcol_plugin_sdk::export_processor!(PassThrough);

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_plugin_sdk::harness::{cpu_batch, Harness};

    #[test]
    fn the_batch_comes_back_with_the_same_samples() {
        let input = cpu_batch();
        let mut h = Harness::<PassThrough>::processor("null").unwrap();
        let out = h.process(&input).unwrap().expect("never dropped");
        assert_eq!(out.sample_count(), input.sample_count());
        for (a, b) in input.samples().zip(out.samples()) {
            let frames = |s: &profcol_plugin_sdk::Sample<'_>| {
                s.frames().map(|f| f.function_name().map(str::to_owned)).collect::<Vec<_>>()
            };
            assert_eq!(frames(&a), frames(&b));
            assert_eq!(a.values(), b.values());
        }
    }
}
