//! An exporter plugin for the host's tests: writes one line per batch
//! (`<bytes> bytes`) to every sink named in its config, or misbehaves.

use exports::profcol::plugin::export_batch::Guest;
use profcol::plugin::host::counter_add;
use profcol::plugin::types::{ErrorKind, Output, PluginError};
use serde::Deserialize;
use std::sync::Mutex;

wit_bindgen::generate!({ path: "../../wit", world: "exporter" });

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Config {
    /// lines (default), trap, retryable, permanent, drop, loop, spin, big
    mode: String,
    sinks: Vec<String>,
    /// spin: how long each export busy-waits before writing its lines.
    ms: u64,
    /// big: MiB of output per sink.
    mb: usize,
}

static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

struct Plugin;

impl Guest for Plugin {
    fn init(config: String) -> Result<(), String> {
        let c: Option<Config> = serde_json::from_str(&config).map_err(|e| format!("bad config: {e}"))?;
        let c = c.unwrap_or_default();
        *CONFIG.lock().unwrap() = Some(c);
        // One per instance: the tests count the pool with it.
        counter_add("inits", 1);
        Ok(())
    }

    fn export(batch: Vec<u8>) -> Result<Vec<Output>, PluginError> {
        let c = CONFIG.lock().unwrap().clone().unwrap_or_default();
        counter_add("export_calls", 1);
        let err = |kind, m: &str| Err(PluginError { kind, message: m.into() });
        match c.mode.as_str() {
            "trap" => panic!("trap on purpose"),
            "retryable" => err(ErrorKind::Retryable, "try later"),
            "permanent" => err(ErrorKind::Permanent, "cannot"),
            "drop" => err(ErrorKind::Drop, "not wanted"),
            "loop" => loop {
                std::hint::black_box(());
            },
            "spin" => {
                let end = std::time::Instant::now() + std::time::Duration::from_millis(c.ms);
                while std::time::Instant::now() < end {
                    std::hint::black_box(());
                }
                Ok(lines(&c, &batch))
            }
            "big" => Ok(c
                .sinks
                .iter()
                .map(|s| Output { sink: s.clone(), content_type: "text/plain".into(), data: vec![b'x'; c.mb << 20] })
                .collect()),
            _ => Ok(lines(&c, &batch)),
        }
    }
}

/// One line per batch, `<bytes> bytes`, to every configured sink.
fn lines(c: &Config, batch: &[u8]) -> Vec<Output> {
    c.sinks
        .iter()
        .map(|s| Output {
            sink: s.clone(),
            content_type: "text/plain".into(),
            data: format!("{} bytes\n", batch.len()).into_bytes(),
        })
        .collect()
}

export!(Plugin);
