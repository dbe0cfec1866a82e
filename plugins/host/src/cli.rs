//! `profcol plugin inspect` and `profcol plugin run`: a plugin author's
//! first tools. They print to a String; the binary writes it out.

use crate::bindings::{ErrorKind, PluginError};
use crate::inspect::{inspect, World, WIT_PACKAGE, WIT_VERSION};
use crate::plugin::{Plugin, PluginSettings};
use crate::sandbox::Allow;
use profcol_api::telemetry::Telemetry;
use profcol_api::Profiles;
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// World, WIT version, imports, exports and size of a plugin file.
pub fn inspect_file(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let i = inspect(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = String::new();
    let _ = writeln!(out, "file:     {}", path.display());
    let _ = writeln!(out, "size:     {} bytes", i.size);
    let _ = writeln!(out, "sha256:   {}", crate::cache::sha256_hex(&bytes));
    match i.world() {
        Ok((w, v)) => {
            let ok = if v == WIT_VERSION { "compatible" } else { "NOT compatible: this profcol implements" };
            let _ = writeln!(out, "world:    {w} ({WIT_PACKAGE}@{v}; {ok} {WIT_PACKAGE}@{WIT_VERSION})");
        }
        Err(e) => {
            let _ = writeln!(out, "world:    none ({e})");
        }
    }
    let _ = writeln!(out, "imports:");
    for n in &i.imports {
        let _ = writeln!(out, "  {n}");
    }
    let _ = writeln!(out, "exports:");
    for n in &i.exports {
        let _ = writeln!(out, "  {n}");
    }
    Ok(out)
}

/// One batch file: OTLP protobuf (`ProfilesData`), or OTLP/JSON when it ends in `.json`.
fn read_batch(path: &Path) -> Result<Profiles, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let p = if path.extension().is_some_and(|e| e == "json") {
        Profiles::from_json(&bytes)
    } else {
        Profiles::decode(&bytes)
    };
    p.map_err(|e| format!("{}: not an OTLP ProfilesData batch: {e}", path.display()))
}

fn summary(p: &Profiles) -> String {
    format!("{} samples in {} profiles", p.sample_count(), p.profiles().count())
}

/// Runs a plugin once on a batch (its stdout and stderr go to the terminal)
/// and describes what it did.
pub fn run_file(
    path: &Path,
    input: &Path,
    config_json: Option<&str>,
    call_timeout: Duration,
) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let (world, _) = inspect(&bytes).and_then(|i| i.world()).map_err(|e| format!("{}: {e}", path.display()))?;
    let batch = read_batch(input)?;
    let config_json = config_json.unwrap_or("{}").to_owned();
    serde_json::from_str::<serde_json::Value>(&config_json).map_err(|e| format!("--config is not JSON: {e}"))?;
    let settings = PluginSettings {
        component: format!("wasm/{}", path.file_stem().and_then(|s| s.to_str()).unwrap_or("plugin")),
        config_json,
        call_timeout,
        memory_limit: 64 << 20,
        pool_size: 1,
        keep_idle: 1,
        max_failures: u32::MAX,
        failure_window: Duration::from_secs(60),
        allow: Allow::default(),
        inherit_stdio: true,
    };
    let start = Instant::now();
    let loaded = Plugin::load(&bytes, world, settings, Telemetry::new())?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plugin:   {} (world {world}), loaded in {:?} ({})",
        path.display(),
        start.elapsed(),
        loaded.source.as_str()
    );
    let _ = writeln!(out, "input:    {}", summary(&batch));
    let encoded = batch.encode_to_vec();
    let start = Instant::now();
    let plugin_error = |e: PluginError| {
        let kind = match e.kind {
            ErrorKind::Retryable => "retryable",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Drop => "drop",
        };
        format!("plugin error ({kind}): {}", e.message)
    };
    match world {
        World::Processor => {
            let r = loaded.plugin.process_blocking(&encoded).map_err(|e| e.to_string())?;
            let took = start.elapsed();
            match r {
                Ok(Some(b)) => {
                    let p = Profiles::decode(&b).map_err(|e| format!("output does not decode as ProfilesData: {e}"))?;
                    let valid = match p.validate() {
                        Ok(()) => "valid".to_owned(),
                        Err(e) => format!("INVALID: {e}"),
                    };
                    let _ = writeln!(out, "output:   {} ({} bytes, {valid}) in {took:?}", summary(&p), b.len());
                }
                Ok(None) => {
                    let _ = writeln!(out, "output:   none: the batch is dropped (in {took:?})");
                }
                Err(e) => return Err(plugin_error(e)),
            }
        }
        World::Exporter => {
            let outputs = loaded.plugin.export_blocking(&encoded).map_err(|e| e.to_string())?.map_err(plugin_error)?;
            let _ = writeln!(out, "outputs:  {} in {:?}", outputs.len(), start.elapsed());
            for o in outputs {
                let _ = writeln!(out, "--- sink {:?}, {}, {} bytes", o.sink, o.content_type, o.data.len());
                match std::str::from_utf8(&o.data) {
                    Ok(t) => out.push_str(t),
                    Err(_) => {
                        let _ = writeln!(out, "(binary)");
                    }
                }
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
    }
    Ok(out)
}
